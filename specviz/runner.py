"""Glue: one RunRequest + a loaded ModelPair -> an event stream.

The CLI, the UI, the race and the bench all start runs through run_events(),
so they share the exact same engine calls.
"""
from __future__ import annotations

from .engine.decoding import baseline, speculative
from .engine.proposers import make_proposer, target_vocab  # noqa: F401 (re-exported)
from .engine.tree_decoding import tree_speculative
from .errors import RequestError
from .request import RunRequest


def run_events(pair, req: RunRequest, mode: str, prompt_ids: list[int], stop=None, clock=None):
    if mode == "baseline":
        return baseline(pair.target, pair.tokenizer, prompt_ids, req.max_new_tokens, req.sampling,
                        pair.eos_ids, req.seed, stop, clock)
    if mode == "speculative":
        prop = make_proposer(pair, req.method, req)
        engine = tree_speculative if getattr(prop, "tree", False) else speculative
        return engine(pair.target, prop, pair.tokenizer, prompt_ids, req.max_new_tokens, req.gamma,
                      req.sampling, pair.eos_ids, req.seed, stop, clock)
    raise RequestError(f"Unknown mode {mode!r}.")


def with_deadline(events, stop, seconds: float | None):
    """Pass events through; once `seconds` have passed, set `stop` so the
    engine ends the run at its next step (stop_reason "stopped")."""
    import time
    t0 = time.perf_counter()
    for ev in events:
        yield ev
        if seconds and stop is not None and time.perf_counter() - t0 > seconds:
            stop.set()


def is_oom(err: BaseException) -> bool:
    import torch
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(err).lower()


def free_memory() -> None:
    """After an out-of-memory error: drop what the failed run held."""
    import gc

    import torch
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
