"""The draft's one-token step under torch.compile (calibration/draft_compile.py): only a CPU low-bit
draft whose kernels trace, kept only when measured faster, and the target never: greedy
speculative output stays plain greedy's, and a sampled run stays the target's distribution
(the draft's q is whatever the compiled step computed, recorded as such)."""
import pytest
import torch
from helpers import fake_pair

from specviz import machine
from specviz.calibration import draft_compile
from specviz.engine import kvcache
from specviz.engine.cpu import lowbit
from specviz.engine.cpu.lean import make_lean
from specviz.engine.decoding import baseline, speculative
from specviz.engine.forward import cache_kind, new_cache, set_cache
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr arr"


def tokens(gen):
    *events, summary = list(gen)
    return summary.token_ids, events


@pytest.fixture(scope="module")
def pair(tok):
    target = lowbit.to_lowbit(make_lean(tiny_model(len(tok), seed=0, layers=3, hidden=128)), "w4")
    draft = lowbit.to_lowbit(make_lean(tiny_model(len(tok), seed=1, layers=1, hidden=128)), "w4")
    return target, draft


def test_compiled_draft_keeps_greedy_identical(tok, pair):
    target, draft = pair
    ids = tok.encode(PROMPT)
    plain, _ = tokens(baseline(target, tok, ids, 24, GREEDY))
    step = draft_compile.compile_draft(draft, keep="compiled")
    try:
        assert step.compiled and step.compiled_ms > 0 and step.eager_ms > 0, step
        cache = new_cache(draft)
        assert cache.compiled is not None and cache.rows == 1  # one-token steps only
        assert cache_kind(target) == ("dynamic", False, False)  # the target stays eager
        out, events = tokens(speculative(target, DraftModelProposer(draft), tok, ids, 24, 3, GREEDY))
        assert out == plain
        assert "compiled" in step.note() and "eager" in step.note()
    finally:
        set_cache(draft, "dynamic")
        kvcache.runtime(draft).rows, kvcache.runtime(draft).dynamic = kvcache.COMPILE_MAX_NEW, None


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no AVX2 kernel here")
def test_w4a8_draft_compiles_through_its_custom_op(tok, pair):
    """Our kernel is an opaque custom op to dynamo (qgemm.block_mm): the step compiles whole
    (unfused layers: a fused w4a8 draft runs its layers as kernel calls and is not compiled)."""
    target, _ = pair
    draft = lowbit.to_lowbit(tiny_model(len(tok), seed=1, layers=1, hidden=128), "w4a8")
    ids = tok.encode(PROMPT)
    plain, _ = tokens(baseline(target, tok, ids, 16, GREEDY))
    step = draft_compile.compile_draft(draft, keep="compiled")
    assert step.compiled and kvcache.runtime(draft).compiled, step
    out, _ = tokens(speculative(target, DraftModelProposer(draft), tok, ids, 16, 3, GREEDY))
    assert out == plain


def test_slower_compiled_step_is_not_kept(tok, pair, monkeypatch):
    _, draft = pair
    times = iter([10.0, 0.0, 12.0])  # eager, the compiling call, compiled
    monkeypatch.setattr(draft_compile, "step_ms", lambda m, steps=8, wait=True: next(times))
    step = draft_compile.compile_draft(draft)
    assert step == draft_compile.DraftStep(False, 10.0, 12.0, step.compile_s)
    assert cache_kind(draft)[0] == "dynamic" and kvcache.runtime(draft).rows == kvcache.COMPILE_MAX_NEW


def test_what_is_never_compiled(tok, monkeypatch):
    fp32 = tiny_model(len(tok), seed=1, layers=1)
    assert draft_compile.unwanted(fp32) == "its weight format does not trace"
    assert draft_compile.compile_draft(None) is None
    w4 = lowbit.to_lowbit(tiny_model(len(tok), seed=1, layers=1, hidden=64), "w4")
    assert draft_compile.unwanted(w4) is None
    if "w4a8" in lowbit.available():
        fused = lowbit.to_lowbit(make_lean(tiny_model(len(tok), seed=1, layers=1, hidden=64)), "w4a8")
        assert "kernel calls" in draft_compile.unwanted(fused)
    monkeypatch.setenv(draft_compile.ENV, "0")
    step = draft_compile.compile_draft(w4)
    assert not step.compiled and step.compiled_ms is None and "SPECVIZ_DRAFT_COMPILE=0" in step.note()
    if "w8a8" in lowbit.FORMATS:  # fbgemm's prepacked kernels do not trace
        monkeypatch.delenv(draft_compile.ENV)
        w8a8 = lowbit.to_lowbit(tiny_model(len(tok), seed=1, layers=1, hidden=64), "w8a8")
        assert draft_compile.unwanted(w8a8) == "its weight format does not trace"


def test_cli_default_cache_keeps_a_compiled_draft(tok):
    from types import SimpleNamespace

    from specviz.run.flags import apply_cache_args
    target, draft = tiny_model(len(tok), seed=0, layers=1), tiny_model(len(tok), seed=1, layers=1)
    set_cache(draft, "static", compile=True, masked=False)
    pair = fake_pair(target=target, draft=draft,
                           draft_step=draft_compile.DraftStep(True, 20.0, 10.0, 1.0))
    assert apply_cache_args(pair, SimpleNamespace(cache="dynamic", compile=False)) == "dynamic"
    assert cache_kind(draft) == ("static", True, False)
    apply_cache_args(pair, SimpleNamespace(cache="static", compile=False))  # asked for: both
    assert cache_kind(draft) == ("static", False, False) == cache_kind(target)


def test_compiled_draft_step_logits_are_close(tok, pair):
    """The compiled step computes the same function (rounding aside)."""
    _, draft = pair
    ids = list(range(3, 40))
    eager = kvcache.StaticKV(64)
    ref = [kvcache.static_forward(draft, ids[:30], eager, 1)]
    ref += [kvcache.static_forward(draft, [t], eager, 1) for t in ids[30:]]
    set_cache(draft, "static", compile=True, masked=False)
    rt = kvcache.runtime(draft)
    rt.rows, rt.dynamic = 1, True
    try:
        with torch.inference_mode():
            cache = new_cache(draft)
            got = [kvcache.static_forward(draft, ids[:30], cache, 1)]
            got += [kvcache.static_forward(draft, [t], cache, 1) for t in ids[30:]]
        torch.testing.assert_close(torch.stack(got), torch.stack(ref), rtol=0.05, atol=0.05)
    finally:
        set_cache(draft, "dynamic")
        rt.rows, rt.dynamic = kvcache.COMPILE_MAX_NEW, None


def test_background_calibration_stop_is_not_a_compile_failure(tok, pair):
    """Loading through a background calibration, the draft's timing waits for runs like the
    calibration's own forwards, and its budget stop ends the load (never 'compile failed')."""
    _, draft = pair
    calls = []

    class Stopped(Exception):
        pass

    def check():
        calls.append(1)
        if len(calls) > 12:  # past the eager timing: at the compile
            raise Stopped

    token = machine.PAUSE.set(check)
    try:
        with pytest.raises(Stopped):
            draft_compile.compile_draft(draft)
    finally:
        machine.PAUSE.reset(token)
        set_cache(draft, "dynamic")
        kvcache.runtime(draft).rows, kvcache.runtime(draft).dynamic = kvcache.COMPILE_MAX_NEW, None
    assert len(calls) == 13


def test_a_compiler_that_fails_leaves_the_eager_step(tok, pair, monkeypatch):
    """No C++ compiler on the host (a slim Space image), or any backend error: the draft stays eager
    and the load goes on."""
    _, draft = pair

    def broken(*args):
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setattr(kvcache, "compiled_call", lambda model: broken)
    with pytest.warns(UserWarning, match="running eagerly"):
        step = draft_compile.compile_draft(draft)
    assert not step.compiled and step.compiled_ms is None
    assert cache_kind(draft) == ("dynamic", False, False)
    kvcache.runtime(draft).compiled = None  # later tests may compile it


@pytest.mark.parametrize("compiled_ms, winner", [(30.0, "w4"), (45.0, "int8")])
def test_calibration_times_a_traceable_draft_compiled(tok, pair, monkeypatch, compiled_ms, winner):
    """The eager winner cannot compile (here: a float model standing in for torch.ao's int8); the
    w4 candidate close behind it is timed compiled and wins only when that is faster."""
    from specviz.calibration import calibrate
    _, w4 = pair
    models = {"int8": tiny_model(len(tok), seed=1, layers=1), "w4": w4}
    timings = {"int8": 0.040, "w4": 0.042}
    monkeypatch.setattr(draft_compile, "compile_draft", lambda m, progress=None: draft_compile.DraftStep(
        True, 42.0, compiled_ms, 1.0))
    chosen = calibrate._compiled_draft(models, timings, "int8", None)
    assert chosen == winner
    assert timings["w4"] == (0.030 if winner == "w4" else 0.042)
    # its prompt read counts too (calibrate.draft_score): a compiled step 10 ms faster, a prompt 1 s slower
    assert calibrate._compiled_draft(models, {"int8": 0.040, "w4": 0.042}, "int8", None,
                                     {"int8": 0.30, "w4": 1.30}) == "int8"
    timings = {"int8": 0.020, "w4": 0.042}  # too far behind: not compiled at all
    monkeypatch.setattr(draft_compile, "compile_draft", lambda *a, **k: pytest.fail("compiled"))
    assert calibrate._compiled_draft(models, timings, "int8", None) == "int8"


def test_a_draft_compiled_before_is_timed_again_compiled_not_recompiled(tok, pair, monkeypatch):
    """The calibration may compile the draft it picks (its input table already swapped); load then
    times that compiled step again, so a recompile from anything load changed happens at load,
    and keeps the measured eager time; a draft compiled elsewhere is timed from eager again."""
    _, draft = pair
    first = draft_compile.compile_draft(draft, keep="compiled")
    assert first.compiled and kvcache.runtime(draft).rows == 1
    kinds = []
    real = draft_compile.step_ms

    def spy(m, steps=8, wait=True):
        kinds.append(cache_kind(m))
        return real(m, steps, wait)

    monkeypatch.setattr(draft_compile, "step_ms", spy)
    try:
        again = draft_compile.compile_draft(draft, keep="compiled")
        assert again.compiled and again.eager_ms == first.eager_ms and again.compile_s == first.compile_s
        assert kinds == [("static", True, False)]
        draft_compile._DONE.pop(draft)
        kinds.clear()
        third = draft_compile.compile_draft(draft, keep="compiled")
        assert third.compiled and kinds[0] == ("dynamic", False, False) and kinds[1] == ("static", True, False)
    finally:
        set_cache(draft, "dynamic")
        kvcache.runtime(draft).rows, kvcache.runtime(draft).dynamic = kvcache.COMPILE_MAX_NEW, None
