"""EAGLE on the graph path (engine/gpu/head.py, the target's states kept by its StaticModel) on a CPU:
graphs off (the same forwards, eager) and fake captures (padded reads replayed through the input
buffers). The head over its fixed buffer gives the eager cache's rows; a run over the target's graph
cache drafts what the dynamic cache's run drafts, and greedy output is plain's; under sampling the
sequences follow the target's law."""
import functools

import pytest
import torch
from helpers import check_stream, counting_capture, follows_target, run
from test_eagle import drafter

from specviz.engine.decoding import baseline, speculative
from specviz.engine.forward import set_cache
from specviz.engine.gpu import head as gpu_head
from specviz.engine.gpu.head import StaticHead
from specviz.engine.proposers.eagle import EagleProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained.eagle_head import KV
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"


@pytest.fixture()
def fake_graphs(monkeypatch):
    """capture_graph on a CPU: a 'graph' that reruns its forward into the captured outputs; the sizes
    replayed are counted."""
    sizes = []
    monkeypatch.setattr(gpu_head, "capture_graph", counting_capture(lambda out: out[0].shape[0], sizes))
    return sizes


@pytest.mark.parametrize("graphs", [False, True])
def test_the_fixed_buffer_gives_the_eager_cache_rows(target, graphs, request):
    """Reads of 4, 3 (cropped back to 4), 2 and 1 rows, rotary positions apart from slots: the same
    states and logits as the head over its growing KV."""
    sizes = request.getfixturevalue("fake_graphs") if graphs else None
    d = drafter(target)
    st = StaticHead(d, capacity=40, graphs=graphs)
    kv, h = KV(), target.config.hidden_size
    torch.manual_seed(3)
    feats = torch.randn(10, h)
    ids = torch.randint(0, target.config.vocab_size, (10,)).tolist()
    for lo, hi, crop in ((0, 4, None), (4, 7, 4), (4, 6, None), (6, 7, None)):
        if crop is not None:
            kv.crop(crop)
            st.kv.crop(crop)
        pos = list(range(lo + 5, hi + 5))  # the rows' positions: past a prompt's first rows
        e = d.embed(torch.tensor([ids[lo:hi]]))
        ref = d.head(e, feats[None, lo:hi], torch.tensor(pos), kv)[0]
        f, logits = st.run(ids[lo:hi], feats[lo:hi], pos)
        torch.testing.assert_close(f, ref, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(logits, d.lm(ref), atol=1e-4, rtol=1e-4)
    if graphs:  # every read ran in a captured size: 4, 4 (3 padded), 2, 1
        assert sizes == [4, 4, 2, 1]


@pytest.fixture()
def graph_target(tok):
    m = tiny_model(len(tok), seed=0, layers=3)
    assert set_cache(m, "graphs") == "graphs"
    return m


@pytest.mark.parametrize("gamma", [1, 3])
def test_a_run_on_the_graph_cache_drafts_as_the_dynamic_cache(target, graph_target, tok, gamma):
    """The same head over the target's graph cache (its states read from the cache, the head on its
    fixed buffer) drafts the dynamic cache's drafts every round, and the output is plain's."""
    ids = tok.encode(PROMPT)
    _, base = run(baseline(graph_target, tok, ids, 40, GREEDY))
    d = drafter(target)
    ref_rounds, ref = run(speculative(target, EagleProposer(target, d, stop_below=0.0), tok, ids, 40, gamma,
                                      GREEDY))
    prop = EagleProposer(graph_target, d, stop_below=0.0)
    rounds, spec = run(speculative(graph_target, prop, tok, ids, 40, gamma, GREEDY))
    assert prop.static is not None  # it ran on the graph path
    assert spec.token_ids == base.token_ids == ref.token_ids
    check_stream(rounds, spec)
    assert spec.drafted > 0 and [r.draft_ids for r in rounds] == [r.draft_ids for r in ref_rounds]


def test_the_head_goes_back_to_its_pool(graph_target, tok):
    """A run's StaticHead returns to the drafter's pool when the run drops it: the next run reuses it
    (its graphs captured once)."""
    import gc
    d = drafter(graph_target)
    run(speculative(graph_target, EagleProposer(graph_target, d), tok, tok.encode(PROMPT), 12, 2, GREEDY))
    gc.collect()
    assert len(d.statics) == 1
    first = d.statics[0]
    prop = EagleProposer(graph_target, d)
    run(speculative(graph_target, prop, tok, tok.encode(PROMPT), 12, 2, GREEDY))
    assert prop.static is first


def test_sampled_sequences_on_the_graph_cache_follow_the_target(monkeypatch):
    """Lossless on the graph path: whole sequences against the warped target's exact law (χ²)."""
    from specviz.engine.backends import graphs
    from specviz.engine.gpu import static
    monkeypatch.setattr(graphs, "StaticModel", functools.partial(static.StaticModel, graphs=False))
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    set_cache(t, "graphs")
    d = drafter(t, seed=2, scale=0.5)
    params = SamplingParams(temperature=1.0)
    assert follows_target(t, lambda: EagleProposer(t, d, stop_below=0.0), [1, 2, 3, 1, 2], 4, 2, params, 1200) \
        > 1e-3
