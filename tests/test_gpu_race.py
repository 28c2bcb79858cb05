"""Issue 58 on a CPU: the one-thread race scheduler (fake streams and events), its watchdog, the
graph backend's cache pool, the page's GPU path with graphs off (every chain method gives plain's
greedy tokens; self-speculation goes eager and says so), the draft = target honesty check, and
greedy_pick's tie rule. What only a GPU can show is gpu-check's (docs/every_gpu.md)."""
import time

import pytest
import torch
from helpers import fake_pair, run

from specviz.engine import forward
from specviz.engine.decoding import baseline, speculative
from specviz.engine.forward import EAGER_PATH, GRAPHS_PATH
from specviz.engine.gpu import measure
from specviz.engine.gpu.scheduler import RaceStuck, run_sides
from specviz.engine.kvcache import backend
from specviz.engine.sampling import SamplingParams, greedy_pick, top2_gap
from specviz.models.gpu_path import use_graphs
from specviz.models.tiny import tiny_model
from specviz.run import gpu_page
from specviz.run.request import RunRequest
from specviz.run.runner import build_proposer

GREEDY = SamplingParams(temperature=0)


class FakeEvent:
    """Done after `polls` query() calls (never, if polls is None)."""

    def __init__(self, polls):
        self.polls = polls

    def query(self):
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return 1.0


class FakeParts:
    """Streams and events as the scheduler asks for them, recording the order of work."""

    def __init__(self, polls):
        self.polls, self.log = polls, []

    def stream(self):
        return object()

    def on(self, stream):
        import contextlib
        return contextlib.nullcontext()

    def event(self, stream):
        return FakeEvent(self.polls)

    def done(self, event):
        return event is None or event.query()

    def seconds(self, start, end):
        return 0.001


def loop(name, n, log):
    for i in range(n):
        log.append((name, i))
        yield
    return f"{name} done"


def test_one_thread_runs_both_sides_to_the_end_interleaved():
    parts = FakeParts(polls=2)
    log = []
    values, secs = run_sides({"baseline": loop("b", 5, log), "speculative": loop("s", 3, log)}, "cpu",
                             parts=parts)
    assert values == {"baseline": "b done", "speculative": "s done"}
    assert set(secs) == {"baseline", "speculative"}
    firsts = [name for name, _ in log[:4]]
    assert firsts.count("b") == 2 and firsts.count("s") == 2  # neither side waits for the other to end


def test_a_stuck_side_trips_the_watchdog_with_one_line():
    clock = iter(range(0, 10_000)).__next__  # one "second" per reading
    with pytest.raises(RaceStuck, match="no progress for 5 s"):
        run_sides({"baseline": loop("b", 3, [])}, "cpu", parts=FakeParts(polls=None), watchdog_s=5,
                  clock=lambda: float(clock()))


def test_the_measured_race_gives_each_side_its_alone_tokens():
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, tiny=True)
    d = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=1, tiny=True)
    prompt = measure.prompt_ids(8, t.config.vocab_size)
    r = measure.race(t, d, prompt, 16, 3, measure.cache_len(8, 16, 3), repeats=1)
    assert r["identical_to_alone"] and r["identical_to_plain"]
    assert set(r["interference"]) == {"baseline", "speculative"}


def test_the_pool_reuses_a_dropped_cache_and_splits_held_ones():
    m = tiny_model(64, seed=2, layers=1)
    forward.set_cache(m, "graphs")
    b = backend(m)
    first = forward.new_cache(m)
    sm = first.static
    del first
    again = forward.new_cache(m)
    assert again.static is sm  # reused: its graphs need no new capture
    other = forward.new_cache(m)
    assert other.static is not sm  # a race's two target caches never share buffers
    assert b.pool == []


@pytest.fixture(scope="module")
def graph_pair():
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, tiny=True)
    d = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=1, tiny=True)
    use_graphs(t, d, None)
    return t, d


@pytest.mark.parametrize("method", gpu_page.CHAIN)
def test_every_chain_method_on_the_graph_path_gives_plain_greedy(graph_pair, method):
    t, d = graph_pair
    prompt = measure.prompt_ids(10, t.config.vocab_size) * 2  # a repeat: the copying methods find drafts
    req = RunRequest(prompt="", method=method, gamma=4, max_new_tokens=20, temperature=0.0)
    r = gpu_page.shown(gpu_page.page_pair(t, d), req, prompt)
    assert r["identical"] and r["path"] == GRAPHS_PATH


def test_self_speculation_goes_eager_on_graphs_and_says_so(graph_pair, tok):
    t, _ = graph_pair
    prompt = measure.prompt_ids(10, t.config.vocab_size)
    pair = fake_pair(target=t, tokenizer=gpu_page.IdTokenizer())
    req = RunRequest(prompt="", method="early-exit", gamma=3, max_new_tokens=16, options={"exit_layer": 2})
    _, base = run(baseline(t, pair.tokenizer, prompt, 16, GREEDY))
    _, spec = run(speculative(t, build_proposer(pair, "early-exit", req), pair.tokenizer, prompt, 16, 3, GREEDY))
    assert spec.token_ids == base.token_ids and spec.extra["path"] == EAGER_PATH
    assert base.extra["path"] == GRAPHS_PATH


@pytest.mark.parametrize("method", ["tree", "lookahead"])
def test_tree_and_jacobi_methods_run_eager_beside_graphs_and_say_so(graph_pair, method):
    t, d = graph_pair
    prompt = measure.prompt_ids(10, t.config.vocab_size) * 2
    req = RunRequest(prompt="", method=method, gamma=3, max_new_tokens=16, temperature=0.0)
    r = gpu_page.shown(gpu_page.page_pair(t, d), req, prompt)
    assert r["identical"] and r["path"] == EAGER_PATH


def test_the_page_shows_each_sides_forward_path():
    from specviz.ui.speedup_box import stats_html
    side = dict(n_tokens=4, elapsed=0.1, tokens_per_s=40.0, target_forwards=4, state="done")
    snap = dict(baseline={**side, "path": GRAPHS_PATH}, speculative={**side, "path": EAGER_PATH}, stats={})
    html = stats_html(snap)
    assert "forward path" in html and "CUDA graphs" in html and "eager (dynamic cache)" in html
    assert "forward path" not in stats_html(dict(baseline=side, speculative=side, stats={}))


def test_a_draft_that_is_the_target_costs_one_step(graph_pair, monkeypatch):
    """Issue 58: on the H100 a draft identical to the target showed c 0.34 and 2.0x. Here every
    forward costs the same fixed time and nothing else takes any (a clock that only the forwards
    move, as a launch-bound GPU step whatever its rows): the page must show c 1 and no speedup."""
    t, _ = graph_pair
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])  # the engines' clocks read this
    hook = t.model.embed_tokens.register_forward_hook(lambda *a: now.__setitem__(0, now[0] + 0.05))
    try:
        prompt = measure.prompt_ids(8, t.config.vocab_size)
        req = RunRequest(prompt="", method="draft", gamma=4, max_new_tokens=16, temperature=0.0)
        r = gpu_page.shown(gpu_page.page_pair(t, t), req, prompt)
    finally:
        hook.remove()
    assert r["c"] == pytest.approx(1.0), r
    assert r["shown_speedup"] <= (4 + 1) / (4 + r["v"]) + 1e-9, r
    assert r["identical"]


def test_greedy_pick_is_argmax_and_the_gap():
    for row in (torch.tensor([0.5, 2.0, 2.0, 1.0]), torch.tensor([3.0, 3.0, 3.0]), torch.randn(50)):
        x, gap = greedy_pick(row)
        assert x == int(row.argmax())
        ref = top2_gap(row)[0]
        assert float(gap) == float(ref) and (gap.top, gap.second) == (ref.top, ref.second)


def test_costs_are_timed_again_on_the_graph_path_and_a_method_recommended():
    from specviz.engine.costs import MAX_VERIFY_TOKENS, CostModel
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, seed=5, tiny=True)
    d = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=6, tiny=True)
    old = CostModel(plain_step_s=9.0, verify_s=(9.0,) * MAX_VERIFY_TOKENS, draft_step_s=9.0)
    costs, note = use_graphs(t, d, old)
    assert costs.plain_step_s < 1 and len(costs.verify_s) == MAX_VERIFY_TOKENS and costs.draft_step_s < 1
    assert forward.cache_kind(t)[0] == forward.cache_kind(d)[0] == "graphs"
    assert "costs timed on them" in note and "recommended here: hybrid" in note


def test_the_recommendation_prices_the_chain():
    from specviz.engine.theory import recommend
    flat = [1.0] + [1.1] * 16  # a GPU: launch-bound, verify rows nearly free
    method, why = recommend(0.7, flat)
    assert method == "hybrid" and "c = 0.70" in why and "predicts" in why
    assert "pays here" in recommend(0.2, flat)[1]


def test_graphs_are_wanted_on_cuda_zerogpu_too(monkeypatch):
    from specviz.models import gpu_path
    assert gpu_path.wanted(torch.device("cuda")) and not gpu_path.wanted(torch.device("cpu"))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # captured inside each call (tests/test_zerogpu.py)
    assert gpu_path.wanted(torch.device("cuda"))
    monkeypatch.setenv("SPACES_ZERO_GPU", "")
    monkeypatch.setenv("SPECVIZ_GPU_GRAPHS", "0")
    assert not gpu_path.wanted(torch.device("cuda"))


@pytest.mark.parametrize("method", ["draft", "adaptive"])
def test_sampled_acceptance_on_the_graph_path_follows_the_target(method):
    """Modified rejection sampling over graph caches (both sides, graphs eager on a CPU): whole
    sequences follow the warped target's exact law (χ²), with accepts and rejections both. The draft
    model's chain stays on the device: read a step behind (draft), or before each next step under a
    stop rule (adaptive's confidence)."""
    from helpers import acceptance, assert_follows_target, noisy_copy, sample_sequences

    from specviz.engine.proposers import AdaptiveDraftProposer, DraftModelProposer
    V, N = 4, 600
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)
    use_graphs(t, d, None)
    make = {"draft": lambda: DraftModelProposer(d), "adaptive": lambda: AdaptiveDraftProposer(d, confidence=0.6)}
    exact, counts, runs = sample_sequences(speculative, t, make[method], 2, SamplingParams(temperature=1.0), N)
    assert forward.cache_kind(t)[0] == "graphs"
    assert 0.05 < acceptance(runs) < 0.95
    assert_follows_target(counts, exact, N)


def test_a_capture_that_fails_at_load_leaves_both_sides_eager_and_says_why(monkeypatch):
    """A small card out of memory while capturing (or a driver refusing a capture): the load goes on,
    both models on the dynamic cache, the costs as timed before, and the pair's note says why."""
    from specviz.engine.backends.graphs import Graphs
    from specviz.engine.costs import MAX_VERIFY_TOKENS, CostModel
    from specviz.models import gpu_path
    t = measure.build(measure.TARGET_CONFIG, "cpu", torch.float32, seed=7, tiny=True)
    d = measure.build(measure.DRAFT_CONFIG, "cpu", torch.float32, seed=8, tiny=True)
    costs = CostModel(plain_step_s=0.5, verify_s=(0.5,) * MAX_VERIFY_TOKENS, draft_step_s=0.2)

    def fail(self, model, caches):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    monkeypatch.setattr(Graphs, "prewarm", fail)
    got, note = gpu_path.graphs_or_eager(t, d, costs)
    assert got is costs and "could not be captured (OutOfMemoryError: CUDA out of memory" in note
    assert "more" not in note and "eager" in note
    assert forward.cache_kind(t)[0] == forward.cache_kind(d)[0] == "dynamic"
    prompt = measure.prompt_ids(8, t.config.vocab_size)
    tok = gpu_page.IdTokenizer()
    _, base = run(baseline(t, tok, prompt, 12, GREEDY))
    from specviz.engine.proposers import DraftModelProposer
    _, spec = run(speculative(t, DraftModelProposer(d), tok, prompt, 12, 3, GREEDY))
    assert spec.token_ids == base.token_ids and "path" not in spec.extra
    # a device the failed capture left unusable: the capture's own error, nothing hidden
    monkeypatch.setattr(gpu_path, "_device_works", lambda device: False)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        gpu_path.graphs_or_eager(t, d, costs)
