"""ZeroGPU with a fake `spaces` package (it is not installed here): both sides of a run inside one
spaces.GPU(duration=...) call, no torch.compile there (said on the page), and a GPU path that never
calls torch.compile at all."""
import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import copy_into

from specviz.engine.events import RunSummary
from specviz.hosting import spaces
from specviz.hosting.gpu import host_loader
from specviz.models import ModelPair, PairSpec
from specviz.run.request import Limits, make_request

ROOT = Path(__file__).resolve().parents[1]


class FakeSpaces:
    """What `spaces.GPU` does around a function (generators too): borrow, run, give back."""

    calls: list = []
    inside = False

    @classmethod
    def GPU(cls, fn=None, duration=60):
        def wrap(f):
            def run(*a, **kw):
                cls.calls.append(duration(*a, **kw) if callable(duration) else duration)
                cls.inside = True
                try:
                    yield from f(*a, **kw)
                finally:
                    cls.inside = False
            return run
        return wrap(fn) if fn is not None else wrap


@pytest.fixture()
def zerogpu(monkeypatch):
    FakeSpaces.calls = []
    monkeypatch.setitem(sys.modules, "spaces", FakeSpaces)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    return FakeSpaces


def test_zerogpu_is_the_spaces_packages_switch(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert not spaces.on_zerogpu()
    for value, want in (("true", True), ("1", True), ("false", False), ("", False)):
        monkeypatch.setenv("SPACES_ZERO_GPU", value)
        assert spaces.on_zerogpu() is want


def test_both_sides_run_inside_one_gpu_call(zerogpu, tok, target, draft):
    from specviz.run.race import race
    pair = ModelPair(target, draft, tok, PairSpec("t", "t", "d", "t", True), target.device, target.dtype, [0])
    limits = Limits(max_new_tokens=64, max_prompt_tokens=256, max_seconds=60.0)
    seen = []

    def handler(prompt, gamma, max_new_tokens):  # the page's run: prompt, γ, max-new-tokens ... (blocks.py)
        req = make_request(prompt, method="draft", gamma=gamma, max_new_tokens=max_new_tokens, temperature=0.0)
        for side, ev in race(pair, req, tok.encode(prompt), "fair"):
            seen.append((side, type(ev).__name__, zerogpu.inside))
            yield side, ev

    run = spaces.gpu_decorator(limits, max_tokens_arg=2)(handler)
    sums = {s: ev for s, ev in run("def f(x):", 3, 12) if isinstance(ev, RunSummary)}
    assert zerogpu.calls == [spaces.zerogpu_seconds(12, 60.0)]  # one borrowed call for the whole race
    assert {s for s, *_ in seen} == {"baseline", "speculative"} and all(inside for *_, inside in seen)
    assert sums["baseline"].token_ids == sums["speculative"].token_ids


def test_the_page_says_what_runs_on_zerogpu(zerogpu):
    pair = SimpleNamespace(note="")
    loaded = host_loader(devices=[], load=lambda spec, **kw: pair)(PairSpec("t", "t", "d", "t", False))
    assert spaces.ZEROGPU_NOTE in loaded.note and "captured inside each call" in loaded.note
    assert "Not yet run" in loaded.note


def test_no_compile_on_zerogpu(zerogpu, monkeypatch, tok, target, draft):
    from specviz.engine import forward
    from specviz.run import flags
    asked = []
    monkeypatch.setattr(forward, "set_cache", lambda m, kind, compile=False, **kw: asked.append((kind, compile)))
    pair = SimpleNamespace(target=target, draft=draft, draft_step=None, note="")
    flags.apply_cache_args(pair, SimpleNamespace(compile=True, cache="dynamic"))
    assert asked and not any(c for _, c in asked)
    assert spaces.ZEROGPU_NO_COMPILE in pair.note
    monkeypatch.delenv("SPACES_ZERO_GPU")
    asked.clear()
    flags.apply_cache_args(pair, SimpleNamespace(compile=True, cache="dynamic"))
    assert asked == [("static", True), ("static", True)]  # elsewhere --compile still compiles


def test_the_graph_path_never_calls_torch_compile():
    for path in (ROOT / "specviz" / "engine" / "gpu").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "compile":
                pytest.fail(f"{path.name}: {ast.unparse(node)}")


class FakeGraphs:
    """capture_graph as on a GPU, on a CPU: a 'graph' that reruns the forward when replayed."""

    def __init__(self):
        self.captured, self.replays, self.fail = 0, 0, None

    def capture(self, fn, device, warmup=2, stream=None, pool=None):
        if self.fail is not None:
            raise self.fail
        self.captured += 1
        out = fn()
        fakes = self

        class Graph:
            def replay(self):
                fakes.replays += 1
                copy_into(out, fn())
        return Graph(), out


@pytest.fixture()
def graph_pair(monkeypatch):
    """The tiny gpu-check pair on the graph backend as a ZeroGPU load leaves it (nothing captured),
    its StaticModels replaying fake graphs on the CPU."""
    import functools

    import torch

    from specviz.engine.backends import graphs
    from specviz.engine.gpu import measure, static
    from specviz.models import gpu_path
    from specviz.run import gpu_page
    fakes = FakeGraphs()
    monkeypatch.setattr(static, "capture_graph", fakes.capture)
    monkeypatch.setattr(graphs, "StaticModel", functools.partial(static.StaticModel, graphs=True))
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, seed=7, tiny=True)
    d = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=8, tiny=True)
    costs, note = gpu_path.graphs_or_eager(t, d, None)  # SPACES_ZERO_GPU set by the zerogpu fixture
    assert note == gpu_path.PER_CALL_NOTE and fakes.captured == 0  # no GPU held at load: nothing captured
    return gpu_page.page_pair(t, d), fakes


def test_each_zerogpu_call_captures_its_graphs_and_times_its_costs_before_the_clocks(zerogpu, graph_pair):
    """ZeroGPU runs each GPU call in a fresh process, which graphs captured at load never reach: the
    call captures what its run replays (the target's forwards of every verify size in two caches, the
    draft's 1- and 2-row feeds, over the one span the run reaches), times the pair's costs on them
    (nothing could at load: no GPU outside a call), then races without capturing."""
    from specviz.engine import forward
    from specviz.engine.costs import MAX_VERIFY_TOKENS
    from specviz.engine.gpu import measure
    from specviz.models.gpu_path import prepare_call
    from specviz.run.race import race
    pair, fakes = graph_pair
    prompt = measure.prompt_ids(12, pair.target.config.vocab_size)
    req = make_request("x", method="draft", gamma=4, max_new_tokens=20, temperature=0.0)
    assert pair.costs is None  # a ZeroGPU load times nothing
    note = prepare_call(pair, len(prompt) + 20 + 5)
    assert note.startswith("CUDA graphs captured in this GPU call: 12 in ")  # 2 caches × 5 sizes + 2
    assert "costs timed on them in " in note and note.endswith("before the clocks")
    assert fakes.captured == 12
    costs = pair.costs
    assert len(costs.verify_s) == MAX_VERIFY_TOKENS and costs.plain_step_s > 0 and costs.c > 0
    sums = {s: ev for s, ev in race(pair, req, prompt, "fair") if isinstance(ev, RunSummary)}
    assert fakes.captured == 12 and fakes.replays > 0  # the race replayed what the call had captured
    assert sums["baseline"].token_ids == sums["speculative"].token_ids
    assert sums["speculative"].extra["path"] == forward.GRAPHS_PATH
    assert prepare_call(pair, len(prompt) + 25).startswith("CUDA graphs captured in this GPU call: 0 ")
    # a cache the call had not prepared (a third side's) captures no span past the run's either
    from specviz.engine.kvcache import backend
    third = [backend(pair.target)._take(pair.target, 64) for _ in range(3)][-1]
    assert third.capture_upto == third.spans[0] < third.max_len


def test_a_zerogpu_call_whose_capture_fails_runs_eager_and_says_why(zerogpu, graph_pair):
    import torch

    from specviz.engine import forward
    from specviz.models.gpu_path import prepare_call
    pair, fakes = graph_pair
    fakes.fail = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    note = prepare_call(pair, 64)
    assert "could not be captured (OutOfMemoryError" in note and "eager" in note
    assert forward.cache_kind(pair.target)[0] == forward.cache_kind(pair.draft)[0] == "dynamic"
    assert prepare_call(pair, 64) == ""  # nothing to capture on the dynamic cache


def test_no_call_captures_anything_off_zerogpu(monkeypatch, target):
    """Elsewhere the graphs are captured at load: a call has nothing to capture."""
    from specviz.models.gpu_path import prepare_call
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert prepare_call(SimpleNamespace(target=target, draft=None), 64) == ""


def test_a_race_of_all_methods_borrows_one_call_long_enough_for_its_races(zerogpu):
    """The race-all tab's run is decorated too (ui/leaderboard.wire): one call, asking for each
    method's race beside plain (it had run outside any GPU call, where ZeroGPU holds no GPU)."""
    limits = Limits(max_new_tokens=128, max_prompt_tokens=256, max_seconds=60.0)
    run = spaces.gpu_decorator(limits, max_tokens_arg=3, methods_arg=0)(
        lambda methods, prompt, gamma, max_new, *rest: (yield len(methods)))
    assert list(run(["draft", "suffix", "hybrid"], "p", 4, 32)) == [3]
    one = spaces.zerogpu_seconds(32, 60.0)
    assert zerogpu.calls == [spaces.ZEROGPU_OVERHEAD_S + 3 * (one - spaces.ZEROGPU_OVERHEAD_S)]
    list(run(["draft"] * 40, "p", 4, 512))
    assert zerogpu.calls[-1] == spaces.ZEROGPU_MAX_S
    source = (ROOT / "specviz" / "ui" / "leaderboard.py").read_text()
    assert "page_handlers.gpu_call(h.run, max_tokens_arg=3, methods_arg=0)" in source


def test_zerogpu_touches_no_gpu_outside_a_run(zerogpu, monkeypatch):
    """No background calibration and no warm-up run after the load: on ZeroGPU they would run
    outside any GPU call, where none is held (each run's call times what it needs)."""
    from specviz.ui import loader as loader_mod
    started, warmed = [], []
    monkeypatch.setattr(loader_mod.BackgroundCalibration, "start", lambda self: started.append(self))
    monkeypatch.setattr(loader_mod, "prewarm", lambda pair: warmed.append(pair))
    pair = SimpleNamespace(calibration="untimed", note="")
    manager = loader_mod.ModelManager(loader=lambda spec, **kw: pair, prewarm=True)
    manager._run(PairSpec("t", "t", "d", "t", False))  # the load thread's body, here: nothing left running
    assert manager.pair is pair and not started and not warmed
    monkeypatch.delenv("SPACES_ZERO_GPU")
    manager._run(PairSpec("t2", "t", "d", "t", False))
    assert started and warmed  # elsewhere both run as before


def test_the_target_as_its_own_draft_keeps_its_verify_sizes(zerogpu, graph_pair):
    from specviz.engine.kvcache import runtime
    from specviz.models.gpu_path import prepare_call
    from specviz.run import gpu_page
    pair, fakes = graph_pair
    same = gpu_page.page_pair(pair.target, pair.target)
    assert prepare_call(same, 40).startswith("CUDA graphs captured in this GPU call: 15 ")  # 3 caches × 5
    assert runtime(pair.target).sizes == (1, 2, 4, 8, 17)
