"""Measured statistics of a run and the Leviathan et al. (2023) theory.

Everything measured is computed from events (RunSummary / RoundEvent); the
theory functions take α, γ, c and return what the analysis predicts.
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import RunSummary


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    """E[tokens per verify] = (1 - α^{γ+1}) / (1 - α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al.: (1 - α^{γ+1}) / ((1 - α)(γc + 1))."""
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1)


def best_gamma(alpha: float, c: float, max_gamma: int = 16) -> int:
    return max(range(1, max_gamma + 1), key=lambda g: predicted_speedup(alpha, g, c))


@dataclass
class Stats:
    """The numbers shown for a speculative run (None where not measurable)."""

    alpha: float | None  # accepted / drafted
    alpha_hat: float | None  # mean Σ_x min(p, q): unbiased estimate of α
    tau: float | None  # tokens per verification round (one target forward each)
    c: float | None  # draft forward time / target forward time
    t_draft_step: float | None  # seconds per draft forward
    t_target_step: float | None  # seconds per plain target forward
    speedup: float | None  # measured tokens/s ratio vs the baseline
    predicted: float | None  # Leviathan prediction at the measured α̂, γ, c
    best_gamma: int | None
    # a verification forward (γ+1 tokens) in plain target steps; the theory
    # assumes 1 (None without a baseline to compare with)
    verify_cost: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def target_step_time(base: RunSummary) -> float | None:
    """Seconds per plain decoding step, prefill excluded."""
    if base.n_tokens < 2:
        return None
    return (base.elapsed - base.prefill) / (base.n_tokens - 1)


def run_stats(spec: RunSummary, base: RunSummary | None = None) -> Stats:
    alpha = spec.accepted / spec.drafted if spec.drafted else None
    alpha_hat = spec.overlap_sum / spec.drafted if spec.drafted else None
    tau = spec.n_tokens / spec.rounds if spec.rounds else None
    t_d = spec.draft_time / spec.draft_forwards if spec.draft_forwards else None
    # c needs the cost of a plain target step; without a baseline the verify
    # forward (γ+1 tokens) is the closest measurement we have
    step = target_step_time(base) if base is not None else None
    verify = spec.verify_time / spec.timed_rounds if spec.timed_rounds else None
    t_t = step if step is not None else verify
    c = t_d / t_t if (t_d is not None and t_t) else (0.0 if spec.draft_forwards == 0 and t_t else None)
    speedup = None
    if base is not None and base.tokens_per_s > 0 and spec.elapsed > 0:
        speedup = spec.tokens_per_s / base.tokens_per_s
    gamma = spec.gamma
    pred = best = None
    if alpha_hat is not None and c is not None:
        pred = predicted_speedup(alpha_hat, gamma, c)
        best = best_gamma(alpha_hat, c)
    verify_cost = verify / step if (verify is not None and step) else None
    return Stats(alpha, alpha_hat, tau, c, t_d, t_t, speedup, pred, best, verify_cost)
