"""Measured forward costs of a loaded pair on this machine: the seam between
calibration (which times real forwards at load) and the theory (which needs
v(k), the cost of verifying k drafts in plain target steps).

Filled in by calibration, cached per pair and machine, read by metrics, the
γ policy, the page, the CLI and the bench. Every number here is measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

MAX_VERIFY_TOKENS = 17  # v(k) is measured for k = 1..16 drafts (k+1 tokens per forward)


@dataclass(frozen=True)
class CostModel:
    plain_step_s: float  # seconds per KV-cached 1-token target forward
    # verify_s[n - 1]: seconds for one KV-cached target forward of n new tokens, n = 1..17
    verify_s: tuple[float, ...]
    draft_step_s: float | None = None  # seconds per 1-token draft forward (None: no draft model)
    target_precision: str = ""  # e.g. "bfloat16"
    draft_precision: str = ""  # e.g. "int8 dynamic"
    machine: str = ""  # CPU model / GPU name it was measured on
    notes: dict = field(default_factory=dict)  # free-form: the timings behind the precision choice

    def verify_cost(self, gamma: int) -> float:
        """v(γ): a verify forward of γ drafts (γ+1 tokens) in plain target steps."""
        n = min(max(gamma + 1, 1), len(self.verify_s))
        return self.verify_s[n - 1] / self.plain_step_s

    @property
    def c(self) -> float | None:
        """Draft step ÷ plain target step, both measured at calibration."""
        return self.draft_step_s / self.plain_step_s if self.draft_step_s is not None else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verify_s"] = list(self.verify_s)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        d = dict(d)
        d["verify_s"] = tuple(d["verify_s"])
        return cls(**d)
