"""Engines on tiny random models: greedy speculative == plain greedy, the
event stream adds up, and under sampling whole sequences follow the target."""
import pytest
from helpers import (
    acceptance,
    assert_follows_target,
    check_stream,
    noisy_copy,
    run,
    sample_sequences,
)

from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import RoundEvent
from specviz.engine.metrics import run_stats
from specviz.engine.proposers import AdaptiveDraftProposer, DraftModelProposer, PromptLookupProposer
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr):"


def make(which, target, draft, vocab):
    return {
        "same": lambda: DraftModelProposer(target),
        "different": lambda: DraftModelProposer(draft),
        "lookup": lambda: PromptLookupProposer(vocab),
        "lookup_priced": lambda: PromptLookupProposer(vocab, verify_cost=lambda k: 1.0 + 0.2 * k),
        "adaptive": lambda: AdaptiveDraftProposer(draft),
        "adaptive_same": lambda: AdaptiveDraftProposer(target),
    }[which]()


@pytest.mark.parametrize("gamma", range(1, 9))
@pytest.mark.parametrize("which", ["same", "different", "lookup", "lookup_priced", "adaptive",
                                   "adaptive_same"])
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


def test_priced_lookup_guesses_what_pays():
    seq = [5, 6, 7, 8, 9, 5, 6]  # (5, 6) recurs: the guesses are 7, 8, 9, 5
    def guesses(p, seq):
        return p.propose(seq, 4, GREEDY, None, frozenset()).tokens
    dear = PromptLookupProposer(100, verify_cost=lambda k: 1.0 + 0.6 * k)
    dear.reset(seq)
    assert guesses(dear, seq) == []  # a prior of 1 in 2 right does not pay 0.6 of a step a guess
    cheap = PromptLookupProposer(100, verify_cost=lambda k: 1.0 + 0.05 * k)
    cheap.reset(seq)
    assert guesses(cheap, seq) == [7, 8, 9, 5]
    # wrong first guesses bring it down to plain steps...
    p = PromptLookupProposer(100, verify_cost=lambda k: 1.0 + 0.3 * k)
    p.reset(seq)
    assert guesses(p, seq)
    for i in range(8):
        seq = seq + [20 + i, 5, 6]  # after (5, 6) comes a token it has never seen there
        got = guesses(p, seq)
    assert got == [] and p.first.value < 0.3
    # ...and right ones, checked against the committed token while it is not guessing, back up
    for _ in range(12):
        seq = seq + [3, 5, 6]  # from the second time on, (5, 6) -> 3 is its guess, and it comes
        if guesses(p, seq):
            break
    assert guesses(p, seq)[:1] == [3] and p.first.value > 0.3


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

@pytest.mark.parametrize("method,params,gamma", [
    ("draft", SamplingParams(temperature=1.0), 2),
    ("draft", SamplingParams(temperature=0.8, top_k=3), 3),
    ("lookup", SamplingParams(temperature=1.0), 2),
    ("lookup_priced", SamplingParams(temperature=1.0), 2),  # what it guesses depends on past hits
    ("adaptive", SamplingParams(temperature=1.0, top_p=0.9), 2),
])
def test_sequences_follow_target_distribution(method, params, gamma):
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)  # accepts often, rejects often
    new = {"draft": lambda: DraftModelProposer(d), "lookup": lambda: PromptLookupProposer(V),
           "lookup_priced": lambda: PromptLookupProposer(V, verify_cost=lambda k: 1.0 + 0.2 * k),
           "adaptive": lambda: AdaptiveDraftProposer(d, confidence=0.5)}[method]
    exact, counts, runs = sample_sequences(speculative, t, new, gamma, params, N)
    assert 0.05 < acceptance(runs) < 0.95, "test needs both accepts and rejections"
    assert_follows_target(counts, exact, N)
