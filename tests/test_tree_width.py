"""A tree sized each round from measured costs (a blank budget: engine/gamma.py's TreeWidth)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import check_stream, chi_square_pvalue, noisy_copy, run, sample_sequences
from test_decoding import GREEDY, PROMPT
from test_tree import check_tree_round

from specviz.engine.decoding import baseline
from specviz.engine.gamma import MAX_ORDER, MAX_TREE, TreeWidth, make_width
from specviz.engine.proposers.tree import TreeDraftProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.tree_decoding import tree_speculative
from specviz.models.tiny import tiny_model
from specviz.run.runner import tree_width

FLAT = (0.3, lambda g: 1.0 + 0.001 * g)  # c, v(γ): extra rows nearly free
STEEP = (0.3, lambda g: 1.0 + 0.5 * g)  # each row half a step


def test_the_rule_reads_doubt_and_learns_each_order():
    w = TreeWidth(*FLAT)
    shares = [w.child_share(0.3, r) for r in range(1, MAX_ORDER + 1)]
    assert all(s >= 0 for s in shares) and sum(shares) <= 1 + 1e-9
    assert w.miss(0.05) < w.miss(0.3) < w.miss(0.9)  # a doubtful row's first child fails more
    a2 = w.rate(2)
    w.observe([(0.5, [False, True])] * 20)  # the second choice kept whenever the first failed
    assert w.rate(2) > a2 and w.rate(1) < 0.6
    assert w.pays(1.0, 0.1, 4.0, 2.0) and not w.pays(0.1, 0.1, 4.0, 2.0)
    assert w.row_cost(3) == pytest.approx(0.001)


@pytest.mark.parametrize("costs", [FLAT, STEEP])
def test_greedy_auto_tree_equals_baseline(tok, target, draft, peaked, costs):
    for t, d in ((target, draft), peaked):
        ids = tok.encode(PROMPT + " arr arr arr")
        _, base = run(baseline(t, tok, ids, 40, GREEDY))
        rounds, spec = run(tree_speculative(t, TreeDraftProposer(d), tok, ids, 40, 6, GREEDY,
                                            width=TreeWidth(*costs)))
        assert spec.token_ids == base.token_ids
        check_stream(rounds, spec)
        for r in rounds:
            check_tree_round(r)
            assert 1 <= r.gamma <= MAX_TREE and max(r.tree["depth"]) <= 6


def test_cheap_rows_grow_wider_trees_than_dear_ones(tok, peaked):
    t, d = peaked
    ids = tok.encode(PROMPT)
    sizes = {}
    for name, costs in (("flat", FLAT), ("steep", STEEP)):
        rounds, _ = run(tree_speculative(t, TreeDraftProposer(d), tok, ids, 40, 6, GREEDY,
                                         width=TreeWidth(*costs)))
        sizes[name] = sum(r.gamma for r in rounds) / len(rounds)
    assert sizes["flat"] > 2 * sizes["steep"] and sizes["steep"] < 2


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=2)])
def test_sampled_auto_tree_sequences_follow_target(params):
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)

    def decode(*a, **k):
        return tree_speculative(*a, width=TreeWidth(*FLAT), **k)

    exact, counts, runs = sample_sequences(decode, t, lambda: TreeDraftProposer(d), 2, params, 1000)
    assert chi_square_pvalue(counts, exact, 1000) > 1e-3
    assert max(r.gamma for rounds, _ in runs for r in rounds) > 2  # siblings were drawn


def test_a_blank_budget_is_auto_only_with_measured_costs():
    costs = SimpleNamespace(c=0.3, verify_cost=FLAT[1])
    auto, fixed, shaped = TreeDraftProposer(None), TreeDraftProposer(None, budget=8), \
        TreeDraftProposer(None, shape=(2, 1), budget=64)
    assert isinstance(tree_width(SimpleNamespace(costs=costs), auto), TreeWidth)
    assert tree_width(SimpleNamespace(costs=None), auto) is None
    assert tree_width(SimpleNamespace(costs=costs), fixed) is None
    assert tree_width(SimpleNamespace(costs=costs), shaped) is None
    assert make_width(SimpleNamespace(c=None, verify_cost=FLAT[1]), auto=True) is None


def test_a_flat_stretch_of_v_still_opens_the_next_layer(tok, peaked):
    """Where one more row costs nothing (a flat v, as the running max of a noisy calibration makes)
    siblings are free; once no row can take another, the next draft forward must still be weighed.
    It was not, and every such tree stopped at the root's children."""
    t, d = peaked
    rounds, _ = run(tree_speculative(t, TreeDraftProposer(d), tok, tok.encode(PROMPT), 40, 6, GREEDY,
                                     width=TreeWidth(0.3, lambda g: 1.0)))
    assert max(max(r.tree["depth"]) for r in rounds) >= 2
