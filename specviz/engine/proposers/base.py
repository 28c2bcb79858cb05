"""Where draft tokens come from. One small interface, several proposers.

A proposer is told the committed sequence (prompt + output so far), returns up
to γ tokens together with the distributions q they were drawn from, and is then
told how much of the sequence survived verification so it can roll back.
The speculative engine does not care which proposer it talks to.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..sampling import SamplingParams
from .options import Option, check_options


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor  # (len(tokens), V) distributions the tokens were drawn from
    forwards: int = 0  # draft-model forward passes spent
    info: dict = field(default_factory=dict)  # method-specific, JSON-able; copied to RoundEvent.info
    # greedy runs: the draft's raw logits per token (its warped q is one-hot); the p/q inspector
    # shows their softmax, taken off the clock (engine/decoding._inspect)
    raw: list | None = None


class Proposer:
    name = "base"

    def reset(self, prompt_ids: list[int]) -> int:
        """Start a new sequence. Returns forward passes spent (prefill)."""
        return 0

    def next_gamma(self, requested: int) -> int:
        """How many tokens to draft next round (adaptive proposers change it)."""
        return requested

    def propose(self, committed: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None, eos_ids: frozenset[int]) -> Proposal:
        raise NotImplementedError

    def rollback(self, committed: list[int], n_accepted: int, n_drafted: int) -> None:
        """Verification kept `committed` (now including the appended token)."""


def target_vocab(model) -> int:
    return model.get_output_embeddings().out_features


@dataclass(frozen=True)
class MethodSpec:
    """A speculation method as the CLI, page, bench and traces see it."""

    name: str  # the --method value
    label: str  # shown in the page and tables
    build: Callable  # (pair, req | None) -> Proposer
    needs_draft: bool = False  # uses pair.draft (--draft is ignored by methods that do not)
    description: str = ""
    order: int = 100  # position in menus
    greedy_only: bool = False  # make_request refuses temperature > 0 (no lossless sampling variant)
    # its settings, each declared once (proposers/options.py): CLI flags, page controls, validation
    options: tuple[Option, ...] = ()
    finish: Callable[[dict], dict] | None = None  # a rule across options, after each is checked
    note: str = ""  # the page's line for it in "Method settings" (when it shows no controls)
    # RoundEvent.info of its rounds -> run totals (CLI, bench), and one round's story (tooltips)
    summarize: Callable[[list[dict]], dict] | None = None
    round_note: Callable[[dict], str] | None = None

    def check_options(self, options: dict) -> dict:
        """`options` validated and normalised; RequestError in the visitor's words."""
        out = check_options(self.options, options)
        return self.finish(out) if self.finish is not None else out


REGISTRY: dict[str, MethodSpec] = {}


def register(name: str, label: str, **spec):
    """Decorator for a builder `(pair, req) -> Proposer`: makes `name` a method everywhere
    (`spec`: the other MethodSpec fields)."""
    def deco(build):
        REGISTRY[name] = MethodSpec(name, label, build, **spec)
        return build
    return deco
