"""Sampling math: the accept test + residual draw must reproduce the target's
distribution exactly, for any draft distribution (chi-square tests)."""
import pytest
import torch
from scipy.stats import chisquare

from specviz.engine.sampling import SamplingParams, accept_mask, overlap, residual, sample, verify, warp

N = 10000
ALPHA = 1e-3  # false-alarm rate of each test


def first_token_counts(p, q, n=N, seed=0):
    """Run γ=1 speculative rounds and count the first output token."""
    g = torch.Generator().manual_seed(seed)
    V = p.shape[-1]
    counts = torch.zeros(V)
    pp = torch.stack([p, p])  # second row: bonus distribution (not counted)
    for _ in range(n):
        x = sample(q, g)
        v = verify(x.view(1), q.view(1, -1), pp, g)
        counts[int(x) if v.n_accepted == 1 else v.token] += 1
    return counts


def assert_matches(counts, p):
    n = counts.sum()
    assert (counts[p == 0] == 0).all(), "a token with p = 0 was produced"
    keep = p > 0
    res = chisquare(counts[keep].numpy(), (p[keep] * n).numpy())
    assert res.pvalue > ALPHA, f"chi-square p={res.pvalue:.2e}, counts={counts.tolist()}"


def dirichlet(v, seed):
    g = torch.Generator().manual_seed(seed)
    x = -torch.log(torch.rand(v, generator=g))
    return x / x.sum()


CASES = {
    "random": (dirichlet(6, 1), dirichlet(6, 2)),
    "q_has_zeros": (dirichlet(6, 3), torch.tensor([0.5, 0.5, 0, 0, 0, 0.0])),
    "p_has_zeros": (torch.tensor([0.0, 0.3, 0.7, 0, 0, 0]), dirichlet(6, 4)),
    "p_equals_q": (dirichlet(6, 5), None),
    "disjoint": (torch.tensor([0.6, 0.4, 0, 0, 0, 0.0]), torch.tensor([0, 0, 0.2, 0.3, 0.5, 0.0])),
    "one_hot_q": (dirichlet(6, 6), torch.tensor([0, 0, 1.0, 0, 0, 0])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_output_follows_target(name):
    p, q = CASES[name]
    q = p.clone() if q is None else q
    assert_matches(first_token_counts(p, q), p)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=4, top_p=0.9),
])
def test_warped_distributions(params):
    g = torch.Generator().manual_seed(7)
    lp, lq = torch.randn(2, 8, generator=g) * 1.5
    p, q = warp(lp, params), warp(lq, params)
    assert_matches(first_token_counts(p, q, n=10000), p)


def test_warp_greedy_is_argmax_one_hot():
    logits = torch.tensor([[0.1, 3.0, 2.9], [5.0, 5.0, 1.0]])
    p = warp(logits, SamplingParams(temperature=0))
    assert p.tolist() == [[0, 1, 0], [1, 0, 0]]  # ties -> lowest index, like argmax


def test_warp_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0, 0]))
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0, 0]))  # 0.5 < 0.75 -> keep 2nd
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.1))
    assert p.tolist() == [1, 0, 0, 0]  # the top token is always kept


def test_accept_test_edges():
    p = torch.tensor([0.2, 0.5, 0.0])
    q = torch.tensor([0.4, 0.0, 0.3])
    u = torch.tensor([0.49, 0.99, 0.0])
    # 0.49 < 0.2/0.4 accepts; q=0 rejects; p=0 rejects even with u=0
    assert accept_mask(p, q, u).tolist() == [True, False, False]
    assert not accept_mask(torch.tensor([0.2]), torch.tensor([0.4]), torch.tensor([0.5])).item()


def test_residual_and_fallback():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.8, 0.1, 0.1])
    assert torch.allclose(residual(p, q), torch.tensor([0.0, 1.0, 0.0]))
    assert torch.equal(residual(p, p), p)  # empty residual falls back to p
    assert overlap(p, q).item() == pytest.approx(0.6)


def test_greedy_verify_reduces_to_argmax():
    gp = SamplingParams(temperature=0)
    p = warp(torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]), gp)
    q = warp(torch.tensor([[0.0, 1.0, 2.0]]), gp)
    v = verify(torch.tensor([2]), q, p)
    assert (v.n_accepted, v.token, v.resampled) == (0, 1, True)
    v = verify(torch.tensor([1]), p[:1], p)
    assert (v.n_accepted, v.token, v.resampled) == (1, 0, False)
