"""Engines on tiny random models: greedy speculative == plain greedy, the
event stream adds up, and under sampling whole sequences follow the target."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import Outcome, RoundEvent, RunSummary
from specviz.engine.metrics import run_stats
from specviz.engine.proposers import AdaptiveDraftProposer, DraftModelProposer, PromptLookupProposer
from specviz.engine.sampling import SamplingParams, warp
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr):"


def run(gen):
    events = list(gen)
    assert isinstance(events[-1], RunSummary)
    return events[:-1], events[-1]


def check_stream(rounds, summary):
    """Accepted + appended tokens of the rounds are exactly the output."""
    assert all(isinstance(r, RoundEvent) for r in rounds)
    out = [t.token_id for r in rounds for t in r.tokens if t.in_output]
    assert out == summary.token_ids
    assert summary.n_tokens == len(out) == rounds[-1].total_tokens
    assert summary.accepted == sum(r.n_accepted for r in rounds)
    for r in rounds:
        kinds = [t.outcome for t in r.tokens]
        assert kinds[: r.n_accepted] == [Outcome.ACCEPTED] * r.n_accepted
        if r.appended_id >= 0:
            assert kinds[-1] == (Outcome.RESAMPLED if r.resampled else Outcome.BONUS)
            assert (Outcome.REJECTED in kinds) == r.resampled
        assert r.t_draft >= 0 and r.t_verify > 0 and r.t_end >= r.t_start
    times = [r.t_end for r in rounds]
    assert times == sorted(times)


def make(which, target, draft, vocab):
    return {
        "same": lambda: DraftModelProposer(target),
        "different": lambda: DraftModelProposer(draft),
        "lookup": lambda: PromptLookupProposer(vocab),
        "adaptive": lambda: AdaptiveDraftProposer(draft),
        "adaptive_same": lambda: AdaptiveDraftProposer(target),
    }[which]()


@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.parametrize("which", ["same", "different", "lookup", "adaptive", "adaptive_same"])
def test_greedy_speculative_equals_baseline(tok, target, draft, gamma, which):
    ids = tok.encode(PROMPT + " arr arr arr")
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    prop = make(which, target, draft, target.config.vocab_size)
    rounds, spec = run(speculative(target, prop, tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    assert spec.text == base.text
    check_stream(rounds, spec)
    if which == "same":  # a perfect draft: every round accepted with a bonus token
        assert spec.accepted == spec.drafted and all(not r.resampled for r in rounds)
    if which in ("different", "lookup"):
        assert any(r.resampled for r in rounds)


def test_adaptive_gamma_moves(tok, target, draft):
    ids = tok.encode(PROMPT)
    rounds, _ = run(speculative(target, AdaptiveDraftProposer(target, confidence=None), tok, ids,
                                60, 2, GREEDY))
    assert [r.gamma for r in rounds[:4]] == [2, 3, 4, 5]  # all accepted: γ grows
    rounds, _ = run(speculative(target, AdaptiveDraftProposer(draft, confidence=None), tok, ids,
                                30, 6, GREEDY))
    assert min(r.gamma for r in rounds) < 6  # rejections: γ shrinks


def test_prompt_lookup_matches_latest_ngram():
    p = PromptLookupProposer(vocab_size=10)
    assert p._match([1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2], 3) == [3, 4, 5]
    assert p._match([1, 2, 3], 3) == []
    prop = p.propose([5, 6, 7, 5, 6], 4, GREEDY, None, frozenset())
    assert prop.tokens == [7, 5, 6] and prop.q.sum(-1).tolist() == [1.0, 1.0, 1.0]

@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_eos_inside_a_draft(tok, target, gamma):
    ids = tok.encode(PROMPT)
    _, full = run(baseline(target, tok, ids, 40, GREEDY))
    eos = full.token_ids[7]  # pretend the 8th token ends the sequence
    _, base = run(baseline(target, tok, ids, 40, GREEDY, eos_ids=[eos]))
    assert base.stop_reason == "eos" and base.token_ids[-1] == eos
    # same model as draft: EOS arrives as an accepted draft token, mid-round
    for prop_model in (target, tiny_model(len(tok), seed=1, layers=1)):
        rounds, spec = run(speculative(target, DraftModelProposer(prop_model), tok, ids, 40,
                                       gamma, GREEDY, eos_ids=[eos]))
        assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
        check_stream(rounds, spec)


@pytest.mark.parametrize("max_new", [1, 2, 5, 13])
def test_max_new_tokens_is_exact(tok, target, max_new):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, max_new, GREEDY))
    rounds, spec = run(speculative(target, DraftModelProposer(target), tok, ids, max_new, 4, GREEDY))
    assert spec.token_ids == base.token_ids and len(spec.token_ids) == max_new
    check_stream(rounds, spec)


def test_stats_are_consistent(tok, target, draft):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 30, GREEDY))
    rounds, spec = run(speculative(target, DraftModelProposer(draft), tok, ids, 30, 3, GREEDY))
    st = run_stats(spec, base)
    assert st.alpha == spec.accepted / spec.drafted
    assert 0 <= st.alpha_hat <= 1 and st.tau == spec.n_tokens / spec.rounds
    assert st.c > 0 and st.speedup > 0 and st.predicted > 0
    # round 1 also reads the prompt: its time is prefill, not in the draft/verify split
    assert rounds[0].prompt_tokens == len(ids) - 1 and spec.prompt_rounds == 1
    assert all(r.prompt_tokens == 0 for r in rounds[1:])
    assert spec.draft_time == pytest.approx(sum(r.t_draft for r in rounds[1:]))
    assert spec.verify_time == pytest.approx(sum(r.t_verify for r in rounds[1:]))
    assert spec.draft_forwards == sum(r.draft_forwards for r in rounds[1:])
    assert spec.prefill == rounds[0].t_end and spec.target_forwards == spec.rounds


def test_stop_event_ends_run(tok, target, draft):
    import threading
    stop = threading.Event()
    gen = speculative(target, DraftModelProposer(draft), tok, tok.encode(PROMPT), 200, 3, GREEDY, stop=stop)
    first = next(gen)
    stop.set()
    rest = list(gen)
    assert isinstance(first, RoundEvent) and rest[-1].stop_reason == "stopped"


# --- the sequence-level distribution test ------------------------------------

class NullTok:
    def decode(self, ids, skip_special_tokens=False):
        return ""


def exact_sequence_probs(model, prompt, length, params):
    """P(sequence) under the warped target, by enumerating all sequences."""
    V = model.config.vocab_size
    probs = {}
    for seq in itertools.product(range(V), repeat=length):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(seq)])).logits[0]
        p = warp(logits[len(prompt) - 1: len(prompt) - 1 + length], params)
        probs[seq] = float(torch.prod(p[torch.arange(length), torch.tensor(seq)]))
    return probs


@pytest.mark.parametrize("method,params,gamma", [
    ("draft", SamplingParams(temperature=1.0), 2),
    ("draft", SamplingParams(temperature=0.8, top_k=3), 3),
    ("lookup", SamplingParams(temperature=1.0), 2),
    ("adaptive", SamplingParams(temperature=1.0, top_p=0.9), 2),
])
def test_sequences_follow_target_distribution(method, params, gamma):
    V, L, N = 4, 3, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = tiny_model(V, seed=10, layers=2, init=0.8)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a noisy copy: accepts often, rejects often
        for w in d.parameters():
            w.add_(torch.randn(w.shape, generator=g) * w.std().clamp_min(0.05))
    prompt = [1, 2, 3, 1, 2]  # repeats give prompt lookup something to copy
    exact = exact_sequence_probs(t, prompt, L, params)
    counts = dict.fromkeys(exact, 0)
    drafted = accepted = 0
    for i in range(N):
        prop = {"draft": lambda: DraftModelProposer(d), "lookup": lambda: PromptLookupProposer(V),
                "adaptive": lambda: AdaptiveDraftProposer(d, confidence=0.5)}[method]()
        rounds, s = run(speculative(t, prop, NullTok(), prompt, L, gamma, params, seed=i))
        counts[tuple(s.token_ids)] += 1
        drafted, accepted = drafted + s.drafted, accepted + s.accepted
    assert 0.05 < accepted / drafted < 0.95, "test needs both accepts and rejections"
    # pool rare sequences so every bin expects >= 5
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for seq, pr in exact.items():
        if pr == 0:
            assert counts[seq] == 0
        elif pr * N >= 5:
            obs.append(counts[seq])
            exp.append(pr * N)
        else:
            rest_o += counts[seq]
            rest_e += pr * N
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    else:
        assert rest_o == 0
    exp = [e * sum(obs) / sum(exp) for e in exp]
    assert chisquare(obs, exp).pvalue > 1e-3
