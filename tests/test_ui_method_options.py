"""The page's "Method settings": controls generated from each method's declared
options (ui/method_options.py), the options a run sends, friendly errors for bad
values, and options in traces.
In process on the tiny pair; no server, no browser."""
import inspect
from types import SimpleNamespace

import gradio as gr
import pytest

from specviz.cli.main import build_parser
from specviz.engine.proposers import REGISTRY, method_names
from specviz.run.flags import method_flags
from specviz.run.trace import load_trace
from specviz.ui import method_options as mo
from specviz.ui import render
from specviz.ui import replay as rp
from specviz.ui.handlers import Handlers, pair_choices

REQ = SimpleNamespace(session_hash="opts-test")
# prompt, γ, max new, T, top-p, top-k, seed, chat, mode
BASE = ("def f(x):", 3, 6, 0.0, 1.0, 0, 0, False, "fair")


def test_page_and_cli_come_from_the_declared_options():
    # a visitor never picks a server path (rest's datastore) nor makes the server fetch a Hub repo (EAGLE's
    # published head); EAGLE's confidence is the CLI's and bench's
    assert set(mo.KEYS) == set(method_flags()) - {"datastore", "confidence", "eagle_head"}
    assert {o.method for o in mo.OPTIONS} <= set(method_names())
    assert all(o.option.help and o.option.label for o in mo.OPTIONS)
    declared = [(m, o.name) for m in method_names() for o in REGISTRY[m].options]
    assert len(declared) == len(set(declared))  # each declared once
    text = build_parser().format_help() + build_parser()._subparsers._group_actions[0].choices[
        "generate"].format_help()
    assert all(o.flag in text for m, uses in method_flags().items() for _, o in uses)
    assert "--kv-reuse" not in text  # bench and API only


def test_page_run_takes_the_options_positionally_in_key_order(handlers):
    params = list(inspect.signature(handlers.page_run()).parameters)
    i = params.index("gamma_auto")
    assert params[i + 1:] == [*mo.KEYS, "fresh_memory", "share_memory", "request"]  # the boxes under Run last
    assert mo.as_mapping(range(len(mo.KEYS))) == dict(zip(mo.KEYS, range(len(mo.KEYS)), strict=True))
    with pytest.raises(TypeError):
        mo.as_mapping([1])


@pytest.mark.parametrize("method, shown", [
    ("tree", {"tree_shape", "tree_budget"}), ("lookahead", {"window", "guesses"}),
    ("early-exit", {"exit_layer", "trained"}), ("layer-skip", {"skip_layers"}),
    ("draft", set()), ("lookup", set()), ("rest", set()), ("staged", set()),
])
def test_only_the_picked_methods_controls_show(method, shown):
    note, *controls = mo.on_method(method)
    # the note shows for every method: at least when it tends to lose (issue 71); "no settings" only
    # for a method without controls
    assert note["visible"] and "When it tends to lose" in note["value"]
    assert (mo.NO_SETTINGS in note["value"]) == (not shown and not REGISTRY[method].note)
    assert ("--datastore" in note["value"]) == (method == "rest")
    assert {k for k, u in zip(mo.KEYS, controls, strict=True) if u["visible"]} == shown


def test_collect_omits_blanks_types_numbers_and_ignores_other_methods():
    values = dict(tree_shape=" 4-2-2-1 ", tree_budget=12.0, window=5, guesses=3, exit_layer=None,
                  skip_layers="")
    assert mo.collect("tree", values) == {"tree_shape": "4-2-2-1", "tree_budget": 12.0}
    assert REGISTRY["tree"].check_options(mo.collect("tree", values)) == {"tree_shape": [4, 2, 2, 1],
                                                                           "tree_budget": 12}
    assert type(REGISTRY["tree"].check_options(mo.collect("tree", values))["tree_budget"]) is int
    assert mo.collect("lookahead", values) == {"window": 5, "guesses": 3}
    assert mo.collect("early-exit", values) == {}
    assert mo.collect("layer-skip", {**values, "skip_layers": "4,6-9"}) == {"skip_layers": "4,6-9"}
    assert mo.collect("draft", values) == {}
    with pytest.raises(Exception, match="Exit layer L must be a whole number, got 2.5"):
        REGISTRY["early-exit"].check_options(mo.collect("early-exit", {"exit_layer": 2.5}))


def test_options_text():
    assert mo.options_text("tree", {"tree_shape": [4, 2, 2, 1], "tree_budget": None}) == "shape 4-2-2-1"
    assert mo.options_text("layer-skip", {"skip_layers": [4, 6, 7, 8, 9]}) == "layers skipped 4,6-9"
    assert mo.options_text("lookahead", {"window": 4, "guesses": 2}) == "W 4 · G 2"
    assert mo.options_text("draft", {}) == "" and mo.options_text("tree", None) == ""
    # an uploaded trace may hold anything: text, never a crash
    assert mo.options_text("layer-skip", {"skip_layers": ["<b>", 1]}) == "layers skipped ['<b>', 1]"
    assert mo.options_text("tree", ["x"]) == "" and mo.options_text("tree", "4-2") == ""


def test_page_builds_with_the_group_hidden_for_draft():
    from specviz.run.request import Limits
    from specviz.ui.layout import build_page
    from specviz.ui.loader import ModelManager

    presets = [dict(name="p", prompt="x", gamma=3, max_new_tokens=8, chat_template=False)]
    with gr.Blocks():
        page = build_page(presets=presets, choices=pair_choices(None, network=False), limits=Limits(),
                          default_mode="fair", status=ModelManager().status(), allow_local_paths=False,
                          fixed_pair=False)
    assert len(page.run_inputs) == 11 + len(mo.KEYS) + 2
    assert page.run_inputs[11:-2] == page.method_options.inputs
    assert page.run_inputs[-2:] == [page.fresh_memory, page.share_memory]
    assert page.share_memory.value is False  # other visitors' runs only when the visitor turns it on
    assert not any(c.visible for c in page.method_options.inputs) and page.method_options.note.visible


# ---------------------------------------------------------------- the run handler on the tiny pair


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    from specviz.models import resolve_pair
    from specviz.models.tiny import save_tiny_pair
    from specviz.run.request import Limits
    from specviz.ui.loader import ModelManager

    target, draft = save_tiny_pair(tmp_path_factory.mktemp("tiny"))
    manager = ModelManager(device="cpu")
    spec = resolve_pair(None, target, draft, allow_local_paths=True)
    manager.start(spec)
    assert manager.wait(60), manager.status()
    return Handlers(manager, Limits(), [], pair_choices(spec, network=False))


def run(handlers, method, **options):
    values = dict.fromkeys(mo.KEYS) | dict(window=4, guesses=2) | options
    return list(handlers.run(*BASE, method, False, values, request=REQ))


@pytest.mark.parametrize("method, options, message", [
    ("tree", dict(tree_shape="4-x"), "Tree shape must look like 4-2-2-1"),
    ("tree", dict(tree_budget=0), "Tree budget (nodes) must be a whole number between 1 and 64, got 0."),
    ("lookahead", dict(window=0), "Lookahead window W must be a whole number between 1 and 16, got 0."),
    ("early-exit", dict(exit_layer=0), "Exit layer L must be a whole number of at least 1, got 0."),
    ("layer-skip", dict(skip_layers="4,x"), "Skip layers: 'x' is not a layer number"),
    ("early-exit", dict(exit_layer=9), "Exit layer 9 is out of range: this target has 3 layers"),  # at build
    ("layer-skip", dict(skip_layers="0-2"), "That skip set skips all 3 layers"),
])
def test_bad_value_is_a_friendly_error(handlers, method, options, message):
    outs = []
    with pytest.raises(gr.Error) as info:  # the toast; the page's error box gets the same words
        for out in handlers.run(*BASE, method, False, {"window": 4, "guesses": 2} | options, request=REQ):
            outs.append(out)
    assert message in info.value.message
    assert outs and "sv-status-error" in outs[-1][3] and render.esc(message) in outs[-1][3]


def test_a_first_calibration_is_said_before_the_race(handlers, monkeypatch, tmp_path):
    """A self-speculative method's one-time calibration runs before the race: the page says so, with
    fresh panes, instead of "Press Run" (a visitor's first layer-skip run sat 35-45 s that way)."""
    from specviz.calibration import selfspec
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(selfspec, "calibrate_skip_layers", lambda p: calls.append(1) or {"skip_layers": [1]})
    pair = handlers.manager.pair
    assert selfspec.pending(pair, "layer-skip", {}) == "layer-skip"
    assert selfspec.pending(pair, "layer-skip", {"skip_layers": "1"}) is None  # given: nothing to measure
    assert selfspec.pending(pair, "draft", {}) is None
    first = run(handlers, "layer-skip")
    assert calls == [1] and "Measuring, once for this pair on this machine" in first[0][3]
    assert "sv-status-loading" in first[0][3] and "measuring first" in first[0][0]
    assert "identical outputs" in first[-1][3]
    assert selfspec.pending(pair, "layer-skip", {}) is None  # cached now
    again = run(handlers, "layer-skip")
    assert calls == [1] and not any("Measuring, once" in str(out[3]) for out in again)


def test_tree_options_reach_the_run_and_its_trace(handlers, tmp_path):
    outs = run(handlers, "tree", tree_shape="2-1", tree_budget=3.0)
    assert "shape 2-1 · budget 3" in outs[-1][3]  # the run header, next to the method
    tr, _ = handlers.records.get(REQ.session_hash)
    assert tr.meta["settings"]["options"] == {"tree_shape": [2, 1], "tree_budget": 3}
    back = load_trace(tr.save(tmp_path / "t.json"))  # round trip: the replay shows them too
    view, _ = rp.view_for(back)
    assert view.options == {"tree_shape": [2, 1], "tree_budget": 3}
    assert "shape 2-1 · budget 3" in rp.describe_html(back, "upload")
    assert "shape 2-1 · budget 3" in render.run_info_html(view.snapshot())


def test_the_memory_boxes_reach_the_run_and_its_replay(handlers):
    """The page's two boxes under Run, last among /run's inputs: share memory (off by default, issue 71)
    reaches the request, the trace and a replay's box; left out by an API caller, both are off."""
    handler = handlers.page_run()
    keys = [None] * len(mo.KEYS)
    list(handler(*BASE, "suffix", False, *keys, False, True, REQ))
    tr, _ = handlers.records.get(REQ.session_hash)
    assert tr.meta["settings"]["share_memory"] is True and tr.meta["settings"]["fresh_memory"] is False
    view, _ = rp.view_for(tr)
    assert view.reads_memory and view.shares_memory and view.snapshot()["memory"]["shared"]
    list(handler(*BASE, "suffix", False, *keys, REQ))  # an API call without the boxes
    tr, _ = handlers.records.get(REQ.session_hash)
    assert tr.meta["settings"]["share_memory"] is False and tr.meta["settings"]["fresh_memory"] is False


def test_early_exit_layer_runs(handlers):
    outs = run(handlers, "early-exit", exit_layer=2)
    assert "L 2" in outs[-1][3]
    tr, _ = handlers.records.get(REQ.session_hash)
    assert tr.meta["settings"]["options"]["exit_layer"] == 2


def test_old_trace_without_options_still_loads(handlers, tmp_path):
    run(handlers, "draft")
    tr, _ = handlers.records.get(REQ.session_hash)
    tr.meta["settings"].pop("options")  # as recorded before options were kept
    back = load_trace(tr.save(tmp_path / "old.json"))
    view = rp.final_view(back)
    assert view.options == {} and view.spec.n_tokens > 0
    assert "draft" in rp.describe_html(back, "upload")
    back.meta["settings"].update(method="layer-skip", options=["<script>"])  # hostile upload
    assert rp.view_for(back)[0].options == {} and "<script>" not in rp.describe_html(back, "upload")


def test_an_on_off_option_is_a_checkbox_that_reaches_the_run_as_sent():
    """early-exit's trained exit (a FLAG): a checkbox at its default, and unticked it stays in the
    options (False is not a blank), so the run drafts untrained."""
    import gradio as gr
    with gr.Blocks():
        controls = mo.build("early-exit")
    box = controls.inputs[mo.KEYS.index("trained")]
    assert isinstance(box, gr.Checkbox) and box.value is True
    values = dict.fromkeys(mo.KEYS, "") | {"trained": False}
    assert mo.collect("early-exit", values) == {"trained": False}
