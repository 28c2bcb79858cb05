"""Staged speculation (prompt lookup -> draft model -> target) on tiny fp32
models: the draft's chain is its own, forwards are saved, greedy output equals
plain decoding, and sampled sequences follow the target."""

import pytest
import torch
from helpers import (
    acceptance,
    assert_follows_target,
    check_stream,
    fake_pair,
    noisy_copy,
    run,
    sample_sequences,
)

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import DraftModelProposer, PromptLookupProposer
from specviz.engine.proposers.staged import StagedProposer, check_guesses
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model
from specviz.run.request import make_request
from specviz.run.runner import run_events

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr arr"


pytestmark = pytest.mark.usefixtures("one_thread")


def staged(model, vocab):
    return StagedProposer(model, lookup=PromptLookupProposer(vocab))


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("which", ["same", "different"])
def test_greedy_staged_equals_baseline(tok, target, draft, gamma, which):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    prop = staged(target if which == "same" else draft, target.config.vocab_size)
    rounds, spec = run(speculative(target, prop, tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    check_stream(rounds, spec)
    saved = sum(r.info["draft_forwards_saved"] for r in rounds)
    assert all(r.draft_forwards + r.info["draft_forwards_saved"] == r.gamma for r in rounds)
    if gamma >= 3 and which == "same":
        assert saved > 0  # the draft checked lookup guesses several at a time
    if which == "same":
        assert spec.accepted == spec.drafted


def test_greedy_chain_is_the_drafts_own(tok, target, draft):
    """Under greedy, lookup only saves forwards: the chain is what the draft alone drafts."""
    ids = tok.encode(PROMPT)
    _, full = run(baseline(draft, tok, ids, 30, GREEDY))
    vocab = target.config.vocab_size
    for cut in (0, 5, 11, 20):
        committed = ids + full.token_ids[:cut]
        a, b = staged(draft, vocab), DraftModelProposer(draft, vocab_size=vocab)
        a.reset(ids)
        b.reset(ids)
        pa = a.propose(committed, 6, GREEDY, None, frozenset())
        pb = b.propose(committed, 6, GREEDY, None, frozenset())
        assert pa.tokens == pb.tokens and torch.equal(pa.q, pb.q)
        assert pa.forwards <= pb.forwards


def test_check_guesses_keeps_the_drafts_law():
    """The draft's own rejection test of a one-hot guess yields a token ~ q."""
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        k, x = check_guesses(q, [1], SamplingParams(1.0), g)
        counts[1 if k == 1 else x] += 1
    torch.testing.assert_close(counts / n, q[0], atol=0.015, rtol=0)


def test_eos_inside_a_staged_draft(tok, target):
    ids = tok.encode(PROMPT)
    _, full = run(baseline(target, tok, ids, 40, GREEDY))
    eos = full.token_ids[8]
    _, base = run(baseline(target, tok, ids, 40, GREEDY, eos_ids=[eos]))
    for gamma in (2, 5):
        rounds, spec = run(speculative(target, staged(target, target.config.vocab_size), tok, ids, 40, gamma,
                                       GREEDY, eos_ids=[eos]))
        assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
        check_stream(rounds, spec)


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 3),
                                          (SamplingParams(temperature=0.8, top_k=3), 2)])
def test_staged_sequences_follow_target_distribution(params, gamma):
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)  # accepts often, rejects often
    exact, counts, runs = sample_sequences(speculative, t, lambda: staged(d, V), gamma, params, N)
    guessed = sum(r.info["lookup_guessed"] for rounds, _ in runs for r in rounds)
    assert 0.05 < acceptance(runs) < 0.95 and guessed > 0
    assert_follows_target(counts, exact, N)


def test_staged_needs_a_draft(tok, target):
    from specviz.errors import RequestError
    pair = fake_pair(target=target, draft=None, tokenizer=tok, eos_ids=[])
    with pytest.raises(RequestError, match="no draft model"):
        run_events(pair, make_request("ab", method="staged"), "speculative", [1, 2])
