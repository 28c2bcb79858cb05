"""Hugging Face Spaces: the pair a Space starts on, and the ZeroGPU time budget.

A Gradio Space installs requirements.txt only, so the embedded GGUF packages
(requirements-models.txt) are missing there. The same two models then come
from the Hub; the README front matter lists them under `preload_from_hub`, so
the Space downloads them at build time and a cold start only loads them.
"""
from __future__ import annotations

import os

from .. import machine
from ..engine.trained import store as trained
from ..models import PAIRS, PairSpec
from ..models.embedded import DEFAULT_TARGET

HUB_TARGET = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
HUB_DRAFT = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
HUB_DEFAULT = PairSpec("default", HUB_TARGET, HUB_DRAFT,
                       "Qwen2.5-Coder-Instruct 1.5B + 0.5B draft (Hub, preloaded by the Space)", False)
# the same model: a Space without the embedded packages offers the drafts shipped for the embedded one
trained.ALIASES[HUB_TARGET] = DEFAULT_TARGET

# ZeroGPU budget: the run is cut at max_seconds anyway; a short run asks for less
# GPU time so the visitor's quota lasts (ZeroGPU's default is 60 s per call).
ZEROGPU_OVERHEAD_S = 15.0  # moving the pair to the borrowed GPU + warm-up
ZEROGPU_S_PER_TOKEN = 0.1  # both sides together, generous for a 1.5B on a shared GPU (eager, batch 1)
ZEROGPU_MAX_S = 300.0  # ZeroGPU refuses more than this for most accounts


def on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def on_zerogpu() -> bool:
    """A ZeroGPU Space: the `spaces` package's own switch (SPACES_ZERO_GPU=true there)."""
    return machine.on_zerogpu()


# ZeroGPU documents no torch.compile (its route is ahead-of-time compilation, spaces.aoti_*); what the
# page then runs, said where the pair is named. Graphs captured at load would not reach the forked
# process of each GPU call, so each call captures what its run replays, before the race's clocks
# (models/gpu_path.prepare_call); nothing of this has run on ZeroGPU
ZEROGPU_NOTE = ("ZeroGPU: both sides of a run share one borrowed-GPU call (spaces.GPU). torch.compile is "
                "not used there; both sides replay CUDA graphs captured inside each call, before the clocks "
                "(the run's line says how long that took). Not yet run on a real ZeroGPU Space.")
# spaces keeps a call's forked worker for later calls while its GPU stays idle, and a worker holds the
# pair of the moment it was forked: a pair a visitor loaded since would be named on the page while the
# worker raced the old one. So on ZeroGPU the pair is the one the Space starts with (app.py)
ZEROGPU_FIXED = ("On ZeroGPU the model pair is the one this Space starts with: each run happens in a GPU "
                 "worker that keeps the pair it began with.")
ZEROGPU_NO_COMPILE = "--compile is off on ZeroGPU (no torch.compile there): uncompiled forwards."


def embedded_available() -> bool:
    """The embedded default pair can load here: its packages or an intact converted cache."""
    from ..models import embedded
    spec = PAIRS["default"]
    return all(embedded.usable(embedded.model_name(ref)) for ref in (spec.target, spec.draft))


def default_pair() -> PairSpec:
    """The pair `--pair default` means here: the embedded one, or on a Space
    without its packages the same models from the Hub."""
    if on_space() and not embedded_available():
        return HUB_DEFAULT
    return PAIRS["default"]


def zerogpu_seconds(max_new_tokens, max_seconds: float) -> int:
    """GPU seconds to ask ZeroGPU for one run of both sides."""
    try:
        n = max(1, int(float(max_new_tokens)))
    except (TypeError, ValueError):
        n = 64
    want = ZEROGPU_OVERHEAD_S + min(float(max_seconds), 2 * n * ZEROGPU_S_PER_TOKEN)
    return int(min(ZEROGPU_MAX_S, max(ZEROGPU_OVERHEAD_S, want)))


def gpu_decorator(limits, max_tokens_arg: int = 2, methods_arg: int | None = None):
    """spaces.GPU(duration=callable) on a ZeroGPU Space, else a no-op.

    ZeroGPU calls `duration` with the decorated function's own arguments;
    `max_tokens_arg` is the position of max-new-tokens among them, `methods_arg` that of the
    methods a race of all methods runs (each a race beside plain decoding: that many races' time)."""
    try:
        import spaces  # type: ignore
    except Exception:  # noqa: BLE001 - not on a Space
        return lambda fn: fn

    def duration(*args, **kwargs):
        n = kwargs.get("max_new_tokens", args[max_tokens_arg] if len(args) > max_tokens_arg else None)
        one = zerogpu_seconds(n if n is not None else limits.max_new_tokens, limits.max_seconds)
        if methods_arg is None:
            return one
        races = len(args[methods_arg] or []) if len(args) > methods_arg else 1
        return int(min(ZEROGPU_MAX_S, ZEROGPU_OVERHEAD_S + max(1, races) * (one - ZEROGPU_OVERHEAD_S)))

    return spaces.GPU(duration=duration)
