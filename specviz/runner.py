"""Glue: one RunRequest + a loaded ModelPair -> an event stream.

The CLI, the UI, the race and the bench all start runs through run_events(),
so they share the exact same engine calls.
"""
from __future__ import annotations

from .engine.decoding import baseline, speculative
from .engine.proposers import make_proposer, target_vocab  # noqa: F401 (re-exported)
from .errors import RequestError
from .request import RunRequest


def run_events(pair, req: RunRequest, mode: str, prompt_ids: list[int], *, stop=None, clock=None):
    common = dict(max_new_tokens=req.max_new_tokens, params=req.sampling, eos_ids=pair.eos_ids,
                  seed=req.seed, stop=stop, clock=clock)
    if mode == "baseline":
        return baseline(pair.target, pair.tokenizer, prompt_ids, **common)
    if mode == "speculative":
        return speculative(pair.target, make_proposer(pair, req.method, req), pair.tokenizer, prompt_ids,
                           gamma=req.gamma, **common)
    raise RequestError(f"Unknown mode {mode!r}.")
