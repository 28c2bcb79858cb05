"""Issue 58 on a CPU: on a graph cache (a GPU's; its graphs run eagerly on a CPU) the baseline reads
its tokens from the device in batches, and a speculative round reads what the page shows in one
copy. Their events equal those of the path that reads as it goes. Reads are counted by patching
every way a tensor's value reaches the host."""
import dataclasses

import pytest
import torch
from helpers import noisy_copy

from specviz.engine import decoding
from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import RoundEvent, RunSummary
from specviz.engine.forward import GRAPHS_PATH, set_cache
from specviz.engine.proposers import DraftModelProposer, PromptLookupProposer
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


# ------------------------------------------------ a speculative round: what the page shows, one copy

def strip(ev):
    """An event as the page shows it, times left out (measured, never equal)."""
    d = dataclasses.asdict(ev)
    for k in ("t_start", "t_draft", "t_verify", "t_end", "elapsed", "prefill", "draft_time", "verify_time"):
        d.pop(k, None)
    for t in d.get("tokens", []):
        t.pop("t")
    return d


def spec(target, proposer, tok, params, monkeypatch, *, prompt=PROMPT, copied=True, reads=None, gamma=4):
    """A speculative run on the graph cache -> its events; copied=False: the path that reads as it
    goes (the CPU's), on the same cache. reads: counted per round (a list of counts)."""
    with monkeypatch.context() as mp:
        if not copied:
            mp.setattr(decoding, "on_graphs", lambda cache: False)
        per_round = Reads()
        if reads is not None:
            per_round.on(mp)
        evs = []
        for ev in speculative(target, proposer, tok, tok.encode(prompt), 24, gamma, params, seed=5):
            if isinstance(ev, RoundEvent) and reads is not None:
                reads.append(len(per_round))
                per_round.clear()
            evs.append(ev)
    return evs


REPEAT = "def f(arr): return arr + 1\ndef g(arr): return arr + 1\ndef h(arr): return arr"


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_a_round_on_a_graph_cache_shows_the_same_in_one_copy(graph_target, tok, params, method, monkeypatch):
    """Verdict, p/q/u, gaps, the inspector's top-k and residual, the appended token's p: the same
    events as the per-read path's (rounds that accept and reject, resample and bonus)."""
    if method == "draft":
        draft = noisy_copy(graph_target, 0, scale=0.05)  # accepts some drafts, rejects others
        set_cache(draft, "graphs")
        make = lambda: DraftModelProposer(draft)  # noqa: E731
    else:
        make = lambda: PromptLookupProposer(len(tok), min_ngram=1)  # noqa: E731
    want = spec(graph_target, make(), tok, params, monkeypatch, prompt=REPEAT, copied=False)
    got = spec(graph_target, make(), tok, params, monkeypatch, prompt=REPEAT)
    assert [strip(e) for e in got] == [strip(e) for e in want]
    rounds = [e for e in got if isinstance(e, RoundEvent)]
    assert any(r.dists for r in rounds) and got[-1].extra["path"] == GRAPHS_PATH
    if method == "draft":
        assert {r.resampled for r in rounds} == {True, False}
        assert any(r.residual for r in rounds) == (params is SAMPLED)  # greedy shows no residual


def test_a_round_reads_the_device_once(graph_target, tok, monkeypatch):
    """Prompt lookup drafts on the host, so every read in its rounds is the engine's: one a round
    on a graph cache, against a dozen and more where each part is read apart."""
    make = lambda: PromptLookupProposer(len(tok), min_ngram=1)  # noqa: E731
    for params in (GREEDY, SAMPLED):
        copied, apart = [], []
        spec(graph_target, make(), tok, params, monkeypatch, prompt=REPEAT, reads=copied)
        spec(graph_target, make(), tok, params, monkeypatch, prompt=REPEAT, copied=False, reads=apart)
        assert copied == [1] * len(copied) and len(copied) > 3
        assert min(apart) > 5


# ------------------------------------------------ the draft model's chain: read one step behind

def draft_model(target, sharp: float = 1.0):
    """A near draft; sharp > 1 scales its output layer (confidences 0.34-0.93 at 4, not ~0.1)."""
    d = noisy_copy(target, 0, scale=0.05)
    with torch.no_grad():
        d.lm_head.weight.mul_(sharp)
    set_cache(d, "graphs")
    return d


def order(target, tok, monkeypatch, make, eos=frozenset()):
    """One proposal from the prompt on a graph cache, and the order of its draft steps and reads."""
    from specviz.engine.gpu import cache as gpu_cache
    prop = make(draft_model(target, sharp=4.0))
    log = []
    real_logits, real_read = prop._logits, gpu_cache.Behind.read
    monkeypatch.setattr(prop, "_logits", lambda *a, **k: log.append("step") or real_logits(*a, **k))
    monkeypatch.setattr(gpu_cache.Behind, "read", lambda self: log.append("read") or real_read(self))
    reads = Reads()
    with monkeypatch.context() as mp:
        reads.on(mp)
        prompt = tok.encode(REPEAT)
        prop.reset(prompt)
        log.clear()
        p = prop.propose(prompt, 4, GREEDY, None, eos)
    return p, log, reads


def test_a_fixed_chain_reads_each_token_a_step_behind(graph_target, tok, monkeypatch):
    """No stop rule but EOS: token i+1's step is enqueued before token i is read (gpu/cache.Behind),
    so the device always has a step to run while the host reads. One read a token, nothing else."""
    p, log, reads = order(graph_target, tok, monkeypatch, DraftModelProposer)
    assert log == ["step", "step", "read", "step", "read", "step", "read", "read"]
    assert len(p.tokens) == p.forwards == 4 and p.q.shape[0] == 4
    assert reads == ["tolist"] * 4
    # an EOS at token i < 4: token i+1's step ran already, for nothing, and is counted
    i = next(i for i in range(1, 3) if p.tokens[i] not in p.tokens[:i])
    p2, log, _ = order(graph_target, tok, monkeypatch, DraftModelProposer, eos=frozenset([p.tokens[i]]))
    assert p2.tokens == p.tokens[:i + 1] and p2.forwards == i + 2
    assert log == ["step", "step"] + ["read", "step"] * i + ["read"]


def test_a_chain_with_a_stop_rule_reads_a_token_before_its_next_step(graph_target, tok, monkeypatch):
    """A stop rule would waste a whole draft step on most rounds: the host reads token i (with its
    confidence, one read) before it enqueues step i+1, and no step runs past the stop."""
    def make(d):
        return DraftModelProposer(d, confidence=0.5)
    p, log, reads = order(graph_target, tok, monkeypatch, make)
    n = len(p.tokens)
    assert log == ["step", "read"] * n and p.forwards == n
    assert reads == ["tolist"] * n  # the token and its confidence together: one read a step


def chains(target, tok, params, rule, monkeypatch, rounds=6):
    """The same rounds drafted on the device (a graph cache) and by the loop that reads as it goes
    (the CPU's, forced on a graph cache) -> [(device, as it goes)] proposals; each round's
    generators start from one seed, and every draft is taken as accepted."""
    from specviz.engine.gamma import ChainLength
    from specviz.engine.proposers import draft as draft_module
    d = draft_model(target, sharp=4.0)
    pair = []
    for on_device in (True, False):
        prop = DraftModelProposer(d)
        if rule == "confidence":
            prop.confidence = 0.45
        else:  # the hybrid's and γ auto's length: a token drafted while it pays by its confidence
            prop.length = ChainLength(0.1, lambda n: 1.0 + 0.05 * n)
        committed = tok.encode(REPEAT)
        prop.reset(committed)
        out = []
        for r in range(rounds):
            with monkeypatch.context() as mp:
                if not on_device:
                    mp.setattr(draft_module, "on_graphs", lambda cache: False)
                gen = torch.Generator().manual_seed(r)
                p = prop.propose(committed, 6, params, gen, frozenset())
            out.append(p)
            committed = committed + p.tokens + [p.tokens[-1]]
            prop.rollback(committed, len(p.tokens), len(p.tokens))
            if prop.length is not None:
                prop.length.observe(len(p.tokens) // 2)
        pair.append(out)
    return list(zip(*pair, strict=True))


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("rule", ["confidence", "length"])
def test_a_chain_drafted_on_the_device_is_the_chain_read_as_it_goes(graph_target, tok, params, rule,
                                                                    monkeypatch):
    """The stop rules read the same values from one read a step: the same tokens, q and forwards,
    round after round, at lengths the rule chose."""
    got = chains(graph_target, tok, params, rule, monkeypatch)
    for dev, ahead in got:
        assert dev.tokens == ahead.tokens and torch.equal(dev.q, ahead.q)
        assert dev.forwards == ahead.forwards == len(ahead.tokens)
    assert len({len(b.tokens) for b, _ in got}) > 1  # the rule stopped chains at different lengths
