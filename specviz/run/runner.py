"""Glue: one RunRequest + a loaded ModelPair -> an event stream.

The CLI, the UI, the race and the bench all start runs through run_events(),
so they share the exact same engine calls.
"""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from ..calibration.selfspec import resolve_options
from ..engine.decoding import baseline, speculative
from ..engine.gamma import OwnGamma, make_policy, make_width
from ..engine.pair import OURS, Pair
from ..engine.proposers import make_proposer, method_spec, target_vocab  # noqa: F401 (re-exported)
from ..engine.proposers.lookahead import lookahead
from ..engine.tree_decoding import tree_speculative
from ..errors import RequestError
from .request import RunRequest


def run_events(pair: Pair, req: RunRequest, side: str, prompt_ids: list[int], *, stop=None, clock=None):
    """The events of one side ("baseline" or "speculative") of `req` on `pair`."""
    if pair.engine != OURS:  # another engine (hosting/vllm.py) producing the same events
        return pair.run_events(req, side, prompt_ids, stop=stop, clock=clock)
    pair = side_pair(pair, side)
    common = dict(max_new_tokens=req.max_new_tokens, params=req.sampling, eos_ids=pair.eos_ids,
                  seed=req.seed, stop=stop, clock=clock)
    if side == "baseline":
        return baseline(pair.target, pair.tokenizer, prompt_ids, **common)
    if side == "speculative":
        # the verifier is chosen by the method's declared kind (engine/proposer.py); same events
        prop = build_proposer(pair, req.method, req)
        kind = method_spec(req.method).kind
        if kind == "tree":  # γ is the tree depth (auto: chosen each round, as a chain's γ)
            return tree_speculative(pair.target, prop, pair.tokenizer, prompt_ids, depth=req.gamma,
                                    policy=gamma_policy(pair, req), width=tree_width(pair, prop, req),
                                    **common)
        if kind == "jacobi":  # γ set the proposer's n-gram length; greedy only: no seed
            common.pop("seed")
            return lookahead(pair.target, prop, pair.tokenizer, prompt_ids, **common)
        # γ is the draft length, or the auto policy's cap
        return speculative(pair.target, prop, pair.tokenizer, prompt_ids,
                           gamma=req.gamma, policy=gamma_policy(pair, req), **common)
    raise RequestError(f"Unknown side {side!r}: baseline or speculative.")


def build_proposer(pair, method: str, req=None):
    """The method's proposer, its calibrated options (self-speculation's layer choice)
    resolved first: builders receive values, the engine never calibrates."""
    options = resolve_options(pair, method, getattr(req, "options", None))
    return make_proposer(pair, method, replace(req, options=options) if req is not None
                         else SimpleNamespace(options=options))


def side_pair(pair: Pair, side: str) -> Pair:
    """The pair that runs `side`: with two GPUs the baseline has its own copy of
    the target on its own device (hosting/gpu.py), else both share `pair`."""
    return (pair.baseline_pair or pair) if side == "baseline" else pair


def tree_width(pair: Pair, prop, req=None):
    """The measured-cost sizing of a dynamic tree whose budget is auto (None: its own budget). A method
    that prices its own draft (MethodSpec.cost: eagle-tree's head) is sized by that c, else by the
    draft model's; none where its c is unmeasured."""
    auto = not prop.shape and prop.budget is None
    spec = method_spec(req.method) if req is not None else None
    if spec is not None and spec.cost is not None:
        c = spec.cost(pair, req) if auto else None
        return make_width(pair.costs, auto=auto, c=c) if c is not None else None
    return make_width(pair.costs, auto=auto)


def gamma_policy(pair: Pair, req: RunRequest):
    """The auto-γ policy for `req` on `pair` (None: the proposer's own γ)."""
    if not req.gamma_auto:
        return None
    spec = method_spec(req.method)
    if spec.own_gamma:
        return OwnGamma()
    c = spec.cost(pair, req) if spec.cost is not None else None
    return make_policy(pair.costs, needs_draft=spec.needs_draft, max_gamma=req.gamma, c=c)
