"""ZeroGPU with a fake `spaces` package (it is not installed here): both sides of a run inside one
spaces.GPU(duration=...) call, no torch.compile there (said on the page), and a GPU path that never
calls torch.compile at all."""
import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

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
    assert spaces.ZEROGPU_NOTE in loaded.note and "eager" in loaded.note and "Not yet run" in loaded.note


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
