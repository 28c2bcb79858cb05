"""γ policies: how many tokens to draft next round (the draft length), at most
the policy's cap (the request's γ under "auto").

`auto` picks, each round, the γ that maximises theory.speedup, expected tokens
per unit of target time, with the *measured* costs of this pair on this machine:
c = draft step / plain target step and v(γ) = verify forward of γ+1 tokens /
plain target step, both from calibration (pair.costs, engine/costs.py); α̂ is
the running Σ min(p, q) over the positions the target actually tested.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .theory import ALPHA_MAX, MAX_GAMMA, best_gamma

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
@dataclass
class AutoGamma:
    """The measured-cost γ policy. next_gamma(cap) before a round, observe() after it."""

    c: float  # draft step / plain step (0 for a proposer without a model)
    verify_cost: Callable[[int], float]  # v(γ), e.g. CostModel.verify_cost
    max_gamma: int = MAX_GAMMA
    s: float = PRIOR_ALPHA * PRIOR_WEIGHT  # discounted Σ min(p, q)
    n: float = PRIOR_WEIGHT  # discounted count of tested positions
    name: str = "auto"

    @property
    def alpha_hat(self) -> float:
        return self.s / self.n

    def next_gamma(self, cap: int) -> int:
        alpha = min(self.alpha_hat, ALPHA_MAX)
        return best_gamma(alpha, self.c, self.verify_cost, max(1, min(cap, self.max_gamma)))

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


def make_policy(costs, *, needs_draft: bool, max_gamma: int = MAX_GAMMA) -> AutoGamma | FixedGamma:
    """The auto-γ policy for a pair's CostModel (None: no calibration, fixed default).
    A proposer without a draft model (prompt lookup) drafts for ~free: c = 0."""
    if costs is None or (needs_draft and costs.c is None):
        return FixedGamma()
    return AutoGamma(costs.c if needs_draft else 0.0, monotone(costs.verify_cost, max_gamma), max_gamma)


def monotone(verify_cost: Callable[[int], float], max_gamma: int = MAX_GAMMA) -> Callable[[int], float]:
    """v(γ) made non-decreasing (running max): verifying more tokens never costs
    less, and a dip in a noisy measured curve (v(6) < v(4) under load) would
    otherwise pull γ to it."""
    env, top = {}, 0.0
    for g in range(1, max_gamma + 1):
        top = env[g] = max(top, verify_cost(g))
    return lambda g: env[min(max(g, 1), max_gamma)]
