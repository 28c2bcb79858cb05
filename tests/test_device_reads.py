"""Issue 58 on a CPU: on a graph cache (a GPU's; its graphs run eagerly on a CPU) the baseline reads
its tokens from the device in batches, and a speculative round reads what the page shows in one
copy. Their events equal those of the path that reads as it goes. Reads are counted by patching
every way a tensor's value reaches the host."""
import pytest
import torch

from specviz.engine import decoding
from specviz.engine.decoding import baseline
from specviz.engine.events import RunSummary
from specviz.engine.forward import set_cache
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "def f(arr): arr arr = arr"
GREEDY, SAMPLED = SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=20)
HOST = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


class Reads(list):
    """Grows by one (the method's name) at every read of a tensor's values on the host, while on."""

    def on(self, mp):
        for name in HOST:
            real = getattr(torch.Tensor, name)
            mp.setattr(torch.Tensor, name, lambda t, *a, _r=real, _n=name, **k: self.append(_n) or _r(t, *a, **k))


@pytest.fixture(scope="module")
def graph_target(tok):
    m = tiny_model(len(tok), seed=0, layers=2)
    assert set_cache(m, "graphs") == "graphs"
    return m


def plain(model, tok, n, params, monkeypatch, *, eos=(), batched=True, reads=None):
    """A baseline run on the graph cache -> (token events, summary); batched=False: the path that
    reads every token as it is chosen (the CPU's), on the same cache."""
    with monkeypatch.context() as mp:
        mp.setattr(decoding, "PLAIN_BATCH_S", 1e9)  # batches cut by count only: the reads are exact
        if not batched:
            mp.setattr(decoding, "on_graphs", lambda cache: False)
        if reads is not None:
            reads.on(mp)
        *tokens, summary = baseline(model, tok, tok.encode(PROMPT), n, params, eos_ids=eos, seed=5)
    assert isinstance(summary, RunSummary)
    return tokens, summary


def fields(tokens):
    return [(t.token_id, t.text, t.outcome, t.p, t.gap) for t in tokens]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_baseline_reads_a_batch_at_once_with_the_same_tokens(graph_target, tok, params, monkeypatch):
    one_by_one = Reads()
    ref, ref_s = plain(graph_target, tok, 24, params, monkeypatch, batched=False, reads=one_by_one)
    reads = Reads()
    got, s = plain(graph_target, tok, 24, params, monkeypatch, reads=reads)
    assert fields(got) == fields(ref) and s.token_ids == ref_s.token_ids and s.stop_reason == "max_new_tokens"
    assert reads == ["tolist"] * 4  # the prompt's token alone, then 8 + 8 + 7: one read a batch
    assert len(one_by_one) >= 24  # before: at least one a token
    times = [t.t for t in got]
    assert s.prefill == times[0] and times == sorted(times) and len(set(times)) == len(times)  # split


def test_a_stop_token_inside_a_batch_ends_the_output_exactly_there(graph_target, tok, monkeypatch):
    ref, _ = plain(graph_target, tok, 24, GREEDY, monkeypatch, batched=False)
    ids = [t.token_id for t in ref]
    i = next(i for i in range(10, 16) if ids[i] not in ids[:i])  # inside the third batch (9..16)
    want, want_s = plain(graph_target, tok, 24, GREEDY, monkeypatch, eos=[ids[i]], batched=False)
    reads = Reads()
    got, s = plain(graph_target, tok, 24, GREEDY, monkeypatch, eos=[ids[i]], reads=reads)
    assert fields(got) == fields(want) and [t.token_id for t in got] == ids[:i + 1]
    assert s.token_ids == want_s.token_ids and s.stop_reason == want_s.stop_reason == "eos"
    assert reads == ["tolist"] * 3
    assert s.target_forwards == 17 > want_s.target_forwards == i + 1  # the batch's forwards past EOS ran
