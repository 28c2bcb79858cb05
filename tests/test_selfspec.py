"""Self-speculation (early exit, layer skip) on tiny random fp32 models:
greedy output equals plain decoding, whole sequences follow the target under
sampling, the calibration picks what its measurements say, bad input is one
clear message."""
from types import SimpleNamespace

import pytest
import torch
from helpers import acceptance, assert_follows_target, check_stream, fake_pair, run, sample_sequences

from specviz.calibration import selfspec
from specviz.engine.decoding import baseline, speculative
from specviz.engine.layers import layers_forward
from specviz.engine.proposers import make_proposer, method_names
from specviz.engine.proposers.early_exit import LayerSubsetProposer
from specviz.engine.sampling import SamplingParams
from specviz.errors import RequestError
from specviz.models.tiny import tiny_model
from specviz.run.request import make_request
from specviz.run.runner import build_proposer

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"


@pytest.fixture(scope="module")
def deep(tok):
    return tiny_model(len(tok), seed=3, layers=6)


def pair_of(model, tok):
    return fake_pair(target=model, draft=None, tokenizer=tok, eos_ids=[0], precision_label="float32",
                           spec=SimpleNamespace(name="tiny-test", target="tiny"), device=model.device)


def test_methods_registered():
    assert {"early-exit", "layer-skip"} <= set(method_names())


def test_all_layers_reproduce_the_model(deep, tok):
    from transformers import DynamicCache
    ids = tok.encode(PROMPT)
    ref = deep(input_ids=torch.tensor([ids])).logits[0]
    cache = DynamicCache()  # prefill, then one cached step, must match the stock forward
    a = layers_forward(deep, ids[:-1], cache, range(6), start=0, keep=len(ids) - 1)
    b = layers_forward(deep, ids[-1:], cache, range(6), start=len(ids) - 1, keep=1)
    torch.testing.assert_close(torch.cat([a, b]), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("layers", [(0,), (0, 1, 2, 3), (0, 2, 5), (1, 2, 3, 4), tuple(range(6))])
def test_greedy_equals_plain(deep, tok, gamma, layers):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(deep, tok, ids, 40, GREEDY))
    rounds, spec = run(speculative(deep, LayerSubsetProposer(deep, layers), tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids and spec.text == base.text
    check_stream(rounds, spec)
    if len(layers) == 6:  # every layer: the draft is the target, all accepted
        assert spec.accepted == spec.drafted


@pytest.mark.parametrize("method,options", [("early-exit", {"exit_layer": 3}),
                                            ("layer-skip", {"skip_layers": "1,3"})])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_eos_inside_a_draft(deep, tok, method, options, gamma):
    ids = tok.encode(PROMPT)
    _, full = run(baseline(deep, tok, ids, 40, GREEDY))
    eos = full.token_ids[7]  # pretend the 8th token ends the sequence
    _, base = run(baseline(deep, tok, ids, 40, GREEDY, eos_ids=[eos]))
    req = make_request(PROMPT, method=method, gamma=gamma, options=options)
    prop = make_proposer(pair_of(deep, tok), method, req)
    rounds, spec = run(speculative(deep, prop, tok, ids, 40, gamma, GREEDY, eos_ids=[eos]))
    assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
    check_stream(rounds, spec)


@pytest.mark.parametrize("layers,params,gamma", [
    ((0,), SamplingParams(temperature=1.0), 2),
    ((0, 2), SamplingParams(temperature=0.8, top_k=3), 3),
    ((1,), SamplingParams(temperature=1.0, top_p=0.9), 2),
])
def test_sequences_follow_target_distribution(layers, params, gamma):
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=4, init=0.8)
    exact, counts, runs = sample_sequences(speculative, t, lambda: LayerSubsetProposer(t, layers), gamma,
                                           params, N)
    assert 0.05 < acceptance(runs) < 0.95, "test needs both accepts and rejections"
    assert_follows_target(counts, exact, N)


# --- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("options,msg", [
    ({"exit_layer": 0}, "of at least 1"), ({"exit_layer": 7}, "this target has 6 layers"),
    ({"exit_layer": "x"}, "whole number"), ({"exit_layer": -2}, "of at least 1"),
])
def test_bad_exit_layer(deep, tok, options, msg):
    with pytest.raises(RequestError, match=msg):
        req = make_request(PROMPT, method="early-exit", options=options)
        make_proposer(pair_of(deep, tok), "early-exit", req)


@pytest.mark.parametrize("skip,msg", [
    ("0-5", "skips all 6 layers"), ([0, 1, 2, 3, 4, 5], "skips all"), ("2,9", "out of range"),
    ("a,b", "not a layer number"), ([-1], "numbered from 0"),
])
def test_bad_skip_set(deep, tok, skip, msg):
    with pytest.raises(RequestError, match=msg):
        req = make_request(PROMPT, method="layer-skip", options={"skip_layers": skip})
        make_proposer(pair_of(deep, tok), "layer-skip", req)


def test_skip_parse():
    from specviz.engine.proposers.layer_skip import parse_skip
    assert parse_skip("3, 5-7") == (3, 5, 6, 7) and parse_skip([4, 2, 2]) == (2, 4)


# --- calibration ----------------------------------------------------------------

def fake_step(model, layers, n_tokens=1):
    # a draft step costs its share of 6 layers plus an LM head worth one layer
    return 0.01 * (len(tuple(layers)) + 1) * (1 + 0.1 * (n_tokens - 1))


def test_theory_matches_leviathan_with_unit_verify():
    from specviz.engine.theory import speedup
    assert selfspec.theory_best(0.7, 0.2, lambda g: 1.0)[1] == pytest.approx(
        max(speedup(0.7, g, 0.2) for g in range(1, 9)))
    g, s = selfspec.theory_best(0.9, 0.05, lambda g: 1.0)
    assert g == 8 and s > 3  # a cheap, good draft wants a long γ
    assert selfspec.theory_best(0.3, 0.8, lambda g: 1.0)[0] == 1


def test_exit_calibration_picks_fastest_measured(deep, tok, monkeypatch):
    pair = pair_of(deep, tok)
    ids = [tok.encode(PROMPT), tok.encode("x = [1, 2, 3]\nprint(x)")]
    fast = {1: 5.0, 2: 9.0, 3: 7.0, 4: 6.0, 5: 4.0}  # injected tokens/s per exit layer
    seen = []

    def measure(L, g):
        seen.append((L, g))
        return fast[L]
    res = selfspec.calibrate_exit_layer(pair, ids_list=ids, step=fake_step, measure=measure, top=5)
    assert res["exit_layer"] == 2 and len(seen) == 5 and {r["exit_layer"] for r in res["rows"]} == set(fast)
    row = next(r for r in res["rows"] if r["exit_layer"] == 3)
    assert row["c"] == pytest.approx(4 / 7, abs=1e-4) and 0 <= row["alpha_hat"] <= 1
    # only the top-ranked candidates are run for real
    seen.clear()
    selfspec.calibrate_exit_layer(pair, ids_list=ids, step=fake_step, measure=measure, top=2)
    assert len(seen) == 2


def test_skip_calibration_and_cache(deep, tok, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    pair = pair_of(deep, tok)
    ids = [tok.encode(PROMPT)]
    res = selfspec.calibrate_skip_layers(pair, ids_list=ids, step=fake_step, measure=lambda s, g: len(s))
    assert 0 not in res["skip_layers"] and 5 not in res["skip_layers"]  # first and last kept
    assert set(res["single_skip_alpha"]) == {1, 2, 3, 4}
    assert len(res["skip_layers"]) == max(len(r["skip_layers"]) for r in res["rows"] if "measured_tps" in r)
    # the default comes from the cache once written, and a corrupt cache is recomputed
    calls = []
    monkeypatch.setattr(selfspec, "calibrate_exit_layer", lambda p: calls.append(1) or {"exit_layer": 2})
    assert selfspec.default_exit_layer(pair) == 2 and selfspec.default_exit_layer(pair) == 2
    assert len(calls) == 1
    selfspec.cache_file(pair).write_text("{not json")
    assert selfspec.default_exit_layer(pair) == 2 and len(calls) == 2
    # the runner resolves the layer above the engine; the builder alone asks for one
    prop = build_proposer(pair, "early-exit", make_request(PROMPT, method="early-exit"))
    assert prop.exit_layer == 2
    with pytest.raises(RequestError, match="needs an exit layer"):
        make_proposer(pair, "early-exit", make_request(PROMPT, method="early-exit"))


def test_real_calibration_runs_on_tiny(deep, tok):
    pair = pair_of(deep, tok)
    res = selfspec.calibrate_exit_layer(pair, ids_list=[tok.encode(PROMPT)], top=1, n_new=8)
    assert 1 <= res["exit_layer"] < 6 and any("measured_tps" in r for r in res["rows"])


# --- draft-size analysis ------------------------------------------------------------

def test_draft_size_analysis_on_tiny(deep, tok, tmp_path):
    from specviz.bench import draft_size
    from specviz.ui import draft_size_plot
    pair = pair_of(deep, tok)
    pair.draft = tiny_model(len(tok), seed=1, layers=1)
    ids = [tok.encode(PROMPT)]
    res = draft_size.analyse(pair, ["early-exit:2", "layer-skip:1-3", "draft-fp32", "lookup", "no-such"],
                             ids, [1, 2], 8)
    names = [s["name"] for s in res["sizes"]]
    assert names == ["early-exit:2", "layer-skip:1-3", "draft-fp32", "lookup"]  # unknown skipped
    for s in res["sizes"]:
        assert [r["gamma"] for r in s["rows"]] == [1, 2]
        assert s["measured_best"] in (1, 2) and s["theory_best"] in (1, 2) and s["v_source"]
        assert all(r["speedup"] > 0 and r["theory"] > 0 for r in s["rows"])
    data = dict(gammas=[1, 2], sizes=res["sizes"], pair="tiny", precision="float32", machine="cpu",
                prompts=1, max_new_tokens=8, invocations=[dict(command="x", date="d", load_before="1",
                                                               load_after="2", sizes=names)])
    md = draft_size_plot.table_md(data)
    assert md.count("\n") == 1 + len(names) and "★" in md
    assert len(draft_size_plot.heatmap(data).data) == 1 and draft_size_plot.lines(data).data
    path = tmp_path / "ds.json"
    path.write_text(__import__("json").dumps(data))
    import gradio as gr

    from specviz.ui import draft_size as tab
    with gr.Blocks():
        tab.build_tab(path)
        tab.build_tab(tmp_path / "missing.json")  # no result yet: a note, no crash
    assert "<script" not in tab.intro_html({**data, "pair": "<script>"})


# --- KV reuse: the draft's layers < L serve the verify pass ----------------------

@pytest.mark.parametrize("exit_layer", [1, 3, 5])
@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_kv_reuse_greedy_equals_plain_and_no_reuse(deep, tok, exit_layer, gamma):
    from specviz.engine.proposers.early_exit import SharedCacheExitProposer
    ids = tok.encode(PROMPT)
    _, base = run(baseline(deep, tok, ids, 40, GREEDY))
    rounds, spec = run(speculative(deep, SharedCacheExitProposer(deep, exit_layer), tok, ids, 40, gamma,
                                   GREEDY))
    _, fresh = run(speculative(deep, LayerSubsetProposer(deep, tuple(range(exit_layer))), tok, ids, 40,
                               gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    assert (spec.accepted, spec.drafted) == (fresh.accepted, fresh.drafted)
    check_stream(rounds, spec)


def test_kv_reuse_is_the_default_and_works_without_an_engine_cache(deep, tok):
    from specviz.engine.proposers.early_exit import SharedCacheExitProposer
    pair = pair_of(deep, tok)
    prop = make_proposer(pair, "early-exit", make_request(PROMPT, method="early-exit",
                                                          options={"exit_layer": 2}))
    assert isinstance(prop, SharedCacheExitProposer)
    off = make_proposer(pair, "early-exit", make_request(PROMPT, method="early-exit",
                                                         options={"exit_layer": 2, "kv_reuse": "off"}))
    assert isinstance(off, LayerSubsetProposer)
    # used by another caller (e.g. a staged first stage), it drafts in its own cache
    ids = tok.encode(PROMPT)
    prop.reset(ids)
    a = prop.propose(ids, 3, GREEDY, None, frozenset())
    off.reset(ids)
    b = off.propose(ids, 3, GREEDY, None, frozenset())
    assert a.tokens == b.tokens
    prop.rollback(ids + a.tokens[:1], 1, 3)
    assert prop.cache.get_seq_length() == len(ids)


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 2),
                                          (SamplingParams(temperature=0.8, top_k=3), 3)])
def test_kv_reuse_sequences_follow_target_distribution(params, gamma):
    from specviz.engine.proposers.early_exit import SharedCacheExitProposer
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=4, init=0.8)
    exact, counts, _ = sample_sequences(speculative, t, lambda: SharedCacheExitProposer(t, 1), gamma, params, N)
    assert_follows_target(counts, exact, N)


def test_draft_size_int8_copy_from_a_bf16_draft(deep, tok):
    # --precision auto loads the draft in bf16 on a CPU with native bf16: the int8 size must still run
    from specviz.bench import draft_size
    pair = pair_of(deep, tok)
    pair.draft = tiny_model(len(tok), seed=1, layers=1).to(torch.bfloat16)
    drafts = draft_size._drafts(pair, ["draft-int8", "draft-fp32"])
    assert drafts["draft-fp32"].dtype == torch.float32 and pair.draft.dtype == torch.bfloat16
    res = draft_size.analyse(pair, ["draft-int8"], [tok.encode(PROMPT)], [2], 6)
    assert res["sizes"][0]["rows"][0]["speedup"] > 0
