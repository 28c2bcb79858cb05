"""Models handed to a calibration, and memory handed back to the OS after it (calibration/calibrate.py)."""
from __future__ import annotations

from dataclasses import dataclass


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass
class Loaded:
    """Callables that give a side's model back from disk in fp32 (after a lossy cast)."""

    target: object
    draft: object = None


class Handoff:
    """A model handed to calibrate() so that calibrate holds the only reference: a caller's local
    would keep the fp32 original (6.2 GB for the 1.5B) resident until calibrate returned, through
    the draft's whole timing. With a `reload`, the model may also be let go while the other side
    is timed and loaded again from disk (page cache, ~1 s) when its turn comes
    (docs/why.md#handoff)."""

    def __init__(self, model, reload=None):
        self._model, self._reload = model, reload
        self.n_params = n_params(model)

    def release(self) -> None:
        """Let go of the model until take(), when it can be loaded again."""
        if self._reload is not None:
            self._model = None

    def take(self):
        m, self._model = self._model, None
        if m is None and self._reload is None:
            raise RuntimeError("handed over already: a model without a way back is taken once")
        return m if m is not None else self._reload()


def take(m):
    return m.take() if isinstance(m, Handoff) else m
