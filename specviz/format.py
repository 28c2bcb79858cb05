"""Numbers as text for tables, the terminal and the page: the one None-to-dash formatter."""
from __future__ import annotations

import math


def number(x: float | None, fmt: str = "{:.3f}", missing: str = "n/a") -> str:
    """`fmt.format(x)`, or `missing` when x is None, NaN or infinite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return missing
    return fmt.format(x)
