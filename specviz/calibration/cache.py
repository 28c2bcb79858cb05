"""The calibration cache: one Choice per pair, machine and kernel build (calibrate.py measures it)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.costs import CostModel

# 2: the target choice counts the prompt's forward; 3: the draft's too; 4: the target's score is a
# whole request, plain run and speculative run (choice.PLAIN_WEIGHT); 5: entries timed again after a
# packed load may hold the costs of a model cast under its kernels (docs/why.md#packed-not-fp32)
CACHE_VERSION = 5


@dataclass
class Choice:
    """What runs on each side, why, and what it costs."""

    target: str  # "fp32" | "bf16" | "fp16" | "int8" | a low-bit format (lowbit.FORMATS)
    draft: str | None  # same names; None without a draft model
    note: str  # one line for page/CLI/bench/traces, e.g. "target bfloat16 (128 ms/step vs 279 ms fp32 ...)"
    costs: CostModel | None = None
    timings: dict = field(default_factory=dict)  # {"target": {prec: {n: s}}, "draft": {prec: s}}
    cached: bool = False

    @property
    def noisy(self) -> bool:
        """Measured under load (kept until a quiet measurement replaces it)."""
        return bool(self.timings.get("noisy"))

    @property
    def untimed(self) -> bool:
        return bool(self.timings.get("untimed"))

    def to_dict(self) -> dict:
        return {"version": CACHE_VERSION, "target": self.target, "draft": self.draft, "note": self.note,
                "costs": self.costs.to_dict() if self.costs else None, "timings": self.timings}

    @classmethod
    def from_dict(cls, d: dict) -> "Choice":
        costs = CostModel.from_dict(d["costs"]) if d.get("costs") else None
        timings = dict(d["timings"])  # JSON made the token counts strings
        timings["target"] = {p: {int(n): s for n, s in t.items()}
                             for p, t in timings.get("target", {}).items()}
        return cls(d["target"], d["draft"], d["note"], costs, timings, cached=True)


# ------------------------------------------------------------------- cache


def cache_path(root: Path, *, target_ref: str, draft_ref: str | None, precision: str,
               quantize: str | None, device: str) -> Path:
    import hashlib

    from ..engine.cpu import qgemm
    from ..machine import machine_key
    # the kernel's identity too: timings of an older kernel would choose by numbers no longer true
    key = "|".join([target_ref, draft_ref or "", precision, quantize or "none", device, machine_key(),
                    qgemm.source_key()])
    return Path(root) / "calibration" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def load_cached(path: Path) -> Choice | None:
    try:
        d = json.loads(Path(path).read_text())
        return Choice.from_dict(d) if d.get("version") == CACHE_VERSION else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing or unreadable: measure again


def save(path: Path, choice: Choice) -> None:
    import os
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(choice.to_dict(), indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a re-measurement next time
