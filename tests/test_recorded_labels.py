"""Issue 71 item 3: nothing shipped passes for this machine's timings. The shipped recordings (assets/traces,
assets/races) and the draft-size table are named, where shown, by the machine, precision and date they were
recorded on, in plain words, read from their own metadata; the busy banner offers a replay only so named
("recorded on another machine" where the recording does not say); the draft-size rows agree with the
precision the file records. Pure functions and the shipped files; no model is loaded."""
import copy

import pytest
import torch

from specviz.ui import busy
from specviz.ui import draft_size as ds
from specviz.ui import leaderboard as lb
from specviz.ui import replay as rp
from specviz.ui.glossary import draft_weights, plain_weights, recorded_on
from specviz.ui.leaderboard_render import replay_banner

TRACE_META = {"hardware": "AMD EPYC (2 cores)", "recorded": "2026-11-23T23:51:09+00:00",
              "precision": "target int8 weights, 7-bit per-token activations, draft int8 (dynamic)"}


def test_precision_in_plain_words():
    assert plain_weights("int4 g32 weights, 8-bit per-block activations") == "4-bit weights"
    assert plain_weights(TRACE_META["precision"]) == "8-bit weights"  # both sides alike: said once
    mixed = "target int8 weights, 7-bit per-token activations, draft int4 g32 weights, bfloat16 activations"
    assert plain_weights(mixed) == "target 8-bit, draft 4-bit weights"
    assert draft_weights(mixed) == "4-bit weights" and draft_weights("bfloat16") == "16-bit floating-point weights"
    assert plain_weights("") == "" and plain_weights("mystery") == ""


def test_recorded_on_reads_the_recording_and_never_guesses():
    assert recorded_on(TRACE_META) == "recorded on AMD EPYC (2 cores), 8-bit weights, 2026-11-23"
    assert recorded_on({}) == "recorded on another machine, precision not recorded, date not recorded"
    assert recorded_on({"recorded": "2026-11-28T07:29:57+00:00"}).startswith("recorded on another machine")


def test_busy_banner_offers_a_replay_named_by_machine_precision_and_date():
    html = busy.busy_html("other programs use 1.9 of this machine's 2 cores", TRACE_META)
    assert "unreliable" in html
    for part in ("AMD EPYC (2 cores)", "8-bit weights", "2026-11-23", "not this one"):
        assert part in html, part
    assert "true timings" not in html and "quiet machine" not in html
    bare = busy.busy_html("busy", {})  # a recording without its metadata: said so, nothing invented
    assert "recorded on another machine" in bare and "precision not recorded" in bare
    assert "Replay" not in busy.busy_html("busy", None)  # nothing to offer: no offer
    assert busy.busy_html("", TRACE_META) == ""
    assert "quiet" not in busy.OFFER_BUTTON


def test_the_offer_is_the_pickers_first_shipped_run():
    traces = rp.shipped()
    assert traces, "no shipped traces"
    first = next(iter(traces.values()))
    assert rp.first_meta(traces) is first.meta and rp.first_meta({}) is None
    html = busy.busy_html("busy", rp.first_meta(traces))
    assert first.meta["hardware"] in html and first.meta["recorded"][:10] in html
    assert plain_weights(first.meta["precision"]) in html


def test_every_shipped_trace_is_named_by_its_machine_precision_and_date():
    for name, tr in rp.shipped().items():
        m = tr.meta
        label = rp.choice_label(name, tr)
        assert m["hardware"].split(" (")[0] in label and m["recorded"][:10] in label, label
        assert plain_weights(m["precision"]) in label, label
        banner = rp.banner_html(m)
        for part in (m["hardware"], plain_weights(m["precision"]), m["recorded"][:10], "not this one"):
            assert part in banner, (part, banner)
        info = rp.describe_html(tr, "Selected")
        assert plain_weights(m["precision"]) in info and m["hardware"] in info and "not this one" in info


def test_a_trace_without_its_metadata_says_so():
    from specviz.run.trace import Trace
    label = rp.choice_label("x.json", Trace({"label": "my run"}))
    assert "recorded on another machine" in label and "precision not recorded" in label
    assert "date not recorded" in label
    assert "another machine" in rp.banner_html({})


def test_every_shipped_race_is_named_by_its_machine_precision_and_date():
    races = lb.shipped()
    assert races, "no shipped race bundles"
    for board in races.values():
        m = board.meta
        said = recorded_on(m)
        assert m["hardware"] in said and m["recorded"][:10] in said and plain_weights(m["precision"]) in said
        banner = replay_banner(m, "shipped with this page")
        assert plain_weights(m["precision"]) in banner and m["hardware"] in banner and "not this one" in banner


# ------------------------------------------------------------------ the draft-size tab


def test_draft_size_rows_agree_with_the_precision_the_file_records():
    data = ds.load_result()
    if not data:
        pytest.skip("no committed draft-size result")
    words = draft_weights(data["precision"])
    shown = ds.shown(data)
    drafts = [s for s in shown["sizes"] if s["method"] == "draft"]
    assert drafts and all(words in s["label"] for s in drafts)
    if not words.startswith("8-bit"):  # the shipped file: a 4-bit draft, once labelled "int8"
        assert all("int8" not in s["label"] for s in drafts)
        assert "draft-int8" in ds.intro_html(shown) and "had none left" in ds.int8_note(shown)
    # the file itself agrees: the browser test reads its labels in the intro
    assert [s["label"] for s in data["sizes"]] == [s["label"] for s in shown["sizes"]]
    from specviz.engine.proposers import REGISTRY
    assert not [s["label"] for s in shown["sizes"] if s["label"] in REGISTRY]  # labels, never method ids
    intro = ds.intro_html(shown)
    assert plain_weights(data["precision"]) in intro and data["machine"] in intro
    assert "2026-11-24" in intro and "not this one" in intro


def test_draft_size_labels_follow_any_files_precision():
    data = {"precision": "bfloat16", "machine": "m", "sizes": [
        {"name": "draft-int8", "label": "draft model int8", "method": "draft"},
        {"name": "rest", "label": "rest", "method": "rest"},
        {"name": "early-exit:8", "label": "early exit L=8", "method": "early-exit"}]}
    shown = ds.shown(copy.deepcopy(data))
    assert [s["label"] for s in shown["sizes"]] == ["draft model, 16-bit floating-point weights",
                                                      "retrieval (REST)", "early exit L=8"]
    assert ds.int8_note(shown)
    assert not ds.int8_note({**data, "precision": "target bf16, draft int8 (dynamic)"})


def test_the_bench_names_a_draft_row_by_the_weights_it_holds(tok):
    """`draft-int8` of a draft already low-bit ran that draft unchanged (torch.ao converts nn.Linear
    only): the bench now says what it holds."""
    from specviz.bench.draft_size import held_weights
    from specviz.engine.cpu import lowbit, speed
    from specviz.models.tiny import tiny_model
    fp32 = tiny_model(len(tok), seed=1, layers=1)
    assert held_weights(fp32) == "fp32" and held_weights(copy.deepcopy(fp32).to(torch.bfloat16)) == "bf16"
    assert held_weights(speed.quantize_int8(copy.deepcopy(fp32))) == "int8"
    if "w4" not in lowbit.available():
        pytest.skip("no int4 kernel on this CPU")
    low = lowbit.to_lowbit(copy.deepcopy(fp32), "w4")
    assert held_weights(low) == "int4"
    assert held_weights(speed.quantize_int8(copy.deepcopy(low).float())) == "int4"  # what the bench made


def test_the_page_offers_the_first_shipped_run_by_name(monkeypatch):
    """The page's busy banner, as served (blocks.first_paint): its offer names the picker's first shipped
    run by machine, precision and date."""
    from helpers import fake_pair

    from specviz.models import PairSpec
    from specviz.ui.blocks import build_demo
    from specviz.ui.loader import ModelManager
    manager = ModelManager(loader=lambda spec, device=None, progress=None: fake_pair(
        device="cpu", precision_label="float32"), calibration="off")
    spec = PairSpec("x", "t", "d", "X + Y", False)
    manager.start(spec)
    assert manager.wait(30)
    demo = build_demo(manager, initial=spec, network=False)
    monkeypatch.setattr(busy.METER, "sample", lambda: 1.9)
    monkeypatch.setattr(busy.METER, "busy", lambda: True)
    monkeypatch.setattr(busy.METER, "others", 1.9, raising=False)
    html = next(p["value"] for p in demo.first_paint().values() if "sv-busy-banner" in str(p.get("value")))
    first = rp.first_meta(rp.shipped())
    assert first["hardware"] in html and first["recorded"][:10] in html and plain_weights(first["precision"]) in html
    demo.close()
