"""The speedup theory, once: what α (acceptance), γ (draft length), c (draft
step ÷ plain target step) and v(γ) (a verify forward of γ+1 tokens, in plain
target steps) predict. Used by auto γ (gamma.py), the run statistics
(metrics.py), self-speculation calibration (calibration/selfspec.py), the page's theory
tab (ui/theory.py) and the bench.

    E[tokens per round](α, γ) = (1 - α^{γ+1}) / (1 - α)
    speedup(α, γ, c, v)        = E[tokens per round] / (γc + v)

Leviathan et al.'s formula is the special case v ≡ 1.
"""
from __future__ import annotations

from typing import Callable, Sequence

MAX_GAMMA = 16  # the longest draft (and the auto-γ cap, and the deepest tree) anywhere
ALPHA_MAX = 0.999  # auto γ's running α̂ is clamped here: α̂ → 1 would make every γ "free"


def expected_tokens(alpha: float, gamma: float) -> float:
    """E[tokens per verify] = (1 - α^{γ+1}) / (1 - α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speedup(alpha: float, gamma: float, c: float, v: float = 1.0) -> float:
    """(1 - α^{γ+1}) / ((1 - α)(γc + v)); v = 1 is Leviathan et al.'s assumption
    that verifying γ+1 tokens costs one plain target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)


def v_at(curve: Sequence[float], gamma: float) -> float:
    """v(γ) on a curve indexed by k = 0..MAX_GAMMA, linear between integer γ."""
    g = min(max(gamma, 0.0), len(curve) - 1)
    lo = int(g)
    hi = min(lo + 1, len(curve) - 1)
    return curve[lo] + (curve[hi] - curve[lo]) * (g - lo)


def best_gamma(alpha: float, c: float, v: Callable[[int], float] | Sequence[float] | None = None,
               max_gamma: int = MAX_GAMMA) -> int:
    """argmax over γ = 1..max_gamma of the predicted speedup, v(γ) a function, a
    curve (v_at) or None (v ≡ 1); ties go to the smaller γ."""
    def cost(g: int) -> float:
        if v is None:
            return 1.0
        return v(g) if callable(v) else v_at(v, g)
    return max(range(1, max_gamma + 1), key=lambda g: speedup(alpha, g, c, cost(g)))


def verify_curve(costs=None, v_measured: float | None = None, gamma: float | None = None):
    """v(k) for k = 0..MAX_GAMMA drafts, in plain target steps, or None.

    From the CostModel measured at load when there is one; else a line through
    v(0) = 1 (a plain step) and the run's own measured verify cost at its mean γ
    (a one-point fit: label it as such). A measured v ≤ 1 (timing noise, a GPU
    with spare compute) gives the flat curve v(k) = v."""
    if costs is not None:
        return [1.0] + [costs.verify_cost(k) for k in range(1, MAX_GAMMA + 1)]
    if v_measured is None or not gamma or v_measured <= 0:
        return None
    if v_measured <= 1.0:
        return [v_measured] * (MAX_GAMMA + 1)
    slope = (v_measured - 1.0) / gamma
    return [1.0 + slope * k for k in range(MAX_GAMMA + 1)]


# the 0.5B draft's α̂ on the 1.5B target's code prompts (docs/benchmarks.md: α̂ ≈ 0.9): an optimistic α,
# so that a chain this cannot make pay will not pay on a visitor's prompt either
TYPICAL_ALPHA = 0.9
CHAIN_PAYS = 1.2  # below this predicted speedup a draft chain is not worth recommending


def recommend(c: float | None, curve: Sequence[float] | None) -> tuple[str, str]:
    """(method, why) for a pair on this machine, from its measured draft cost c and verify curve
    v(k) (k = 0..16, in plain steps): the hybrid, which copies drafts from text for free and calls the
    draft model only where a round is priced in, and says what a draft chain would give."""
    if c is None or not curve:
        return "hybrid", "drafts copied from text cost no draft step; the draft model joins where it pays"
    g = best_gamma(TYPICAL_ALPHA, c, curve)
    chain = speedup(TYPICAL_ALPHA, g, c, v_at(curve, g))
    free = f"a verify of 16 drafts costs {v_at(curve, min(16, len(curve) - 1)):.2f} plain steps"
    if chain < CHAIN_PAYS:
        return "hybrid", (f"the draft model costs c = {c:.2f} of a target step here, so even at α "
                          f"{TYPICAL_ALPHA} its best chain (γ {g}) predicts {chain:.2f}×; drafts copied "
                          f"from text cost nothing and {free}")
    return "hybrid", (f"a draft chain pays here (c = {c:.2f}: {chain:.2f}× predicted at α {TYPICAL_ALPHA}, "
                      f"γ {g}), and the hybrid adds free drafts copied from text; {free}")
