"""γ policies: how many tokens to draft next round.

`auto` picks, each round, the γ that maximises expected tokens per unit of
target time with the *measured* costs of this pair on this machine:

    E[rate](γ) = (1 - α̂^{γ+1}) / ((1 - α̂)(γc + v(γ)))

c = draft step / plain target step and v(γ) = verify forward of γ+1 tokens /
plain target step, both from calibration (pair.costs, engine/costs.py); α̂ is
the running Σ min(p, q) over the positions the target actually tested.
Leviathan et al.'s formula is the special case v ≡ 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

AUTO = "auto"
DEFAULT_GAMMA = 4  # without measured costs (tiny/test pairs) auto is a plain fixed γ=4
# before any round: acceptance of a same-family draft model is typically
# 0.6-0.8 (α̂ 0.71 on the default pair, code prompts); the prior weighs as much
# as 4 tested positions, so the first rounds move it quickly
PRIOR_ALPHA = 0.6
PRIOR_WEIGHT = 4.0
# forgetting per tested position: acceptance changes along a text (code body
# vs prose); a memory of ~33 positions (~10 rounds) still averages out 0/1 noise
DECAY = 0.97
ALPHA_MAX = 0.999  # α̂ = 1 would make every γ "free": keep the formula finite


def expected_rate(alpha: float, gamma: int, c: float, v: float) -> float:
    """Expected tokens per plain-target-step of time for one round of γ drafts."""
    alpha = min(alpha, ALPHA_MAX)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + v))


def best_gamma(alpha: float, c: float, verify_cost: Callable[[int], float], max_gamma: int = 16) -> int:
    """argmax over γ = 1..max_gamma of expected_rate with the measured v(γ); ties go to the smaller γ."""
    return max(range(1, max_gamma + 1), key=lambda g: (expected_rate(alpha, g, c, verify_cost(g)), -g))


@dataclass
class AutoGamma:
    """The measured-cost γ policy. next_gamma(cap) before a round, observe() after it."""

    c: float  # draft step / plain step (0 for a proposer without a model)
    verify_cost: Callable[[int], float]  # v(γ), e.g. CostModel.verify_cost
    max_gamma: int = 16
    s: float = PRIOR_ALPHA * PRIOR_WEIGHT  # discounted Σ min(p, q)
    n: float = PRIOR_WEIGHT  # discounted count of tested positions
    name: str = "auto"

    @property
    def alpha_hat(self) -> float:
        return self.s / self.n

    def next_gamma(self, cap: int) -> int:
        return best_gamma(self.alpha_hat, self.c, self.verify_cost, max(1, min(cap, self.max_gamma)))

    def observe(self, overlap: list[float], n_accepted: int) -> None:
        # positions after the first rejection were never tested and were read
        # after a wrong token: they say little about the real text
        tested = overlap[: n_accepted + 1]
        keep = DECAY ** len(tested)
        self.s = keep * self.s + sum(tested)
        self.n = keep * self.n + len(tested)


@dataclass
class FixedGamma:
    """What auto falls back to without measured costs: a fixed γ, said plainly."""

    gamma: int = DEFAULT_GAMMA
    name: str = f"fixed γ={DEFAULT_GAMMA} (no measured costs)"

    def next_gamma(self, cap: int) -> int:
        return max(1, min(cap, self.gamma))

    def observe(self, overlap: list[float], n_accepted: int) -> None:
        pass


def make_policy(costs, *, needs_draft: bool, max_gamma: int = 16) -> AutoGamma | FixedGamma:
    """The auto-γ policy for a pair's CostModel (None: no calibration, fixed default).
    A proposer without a draft model (prompt lookup) drafts for ~free: c = 0."""
    if costs is None or (needs_draft and costs.c is None):
        return FixedGamma()
    return AutoGamma(costs.c if needs_draft else 0.0, costs.verify_cost, max_gamma)
