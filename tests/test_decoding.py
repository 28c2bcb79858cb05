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
