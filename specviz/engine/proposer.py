"""Where draft tokens come from: the proposer contract, a method's declared settings, and the
method registry.

A round is propose → verify → commit. A proposer only proposes: it is told the
committed sequence (prompt + output so far), returns up to γ tokens (a chain) or
a token tree, with the distributions q they were drawn from, and is then told
what survived verification so it can roll back. Which verifier reads its
proposal is the method's declared kind (MethodSpec.kind), never guessed from
the proposer's attributes:

  "chain"   ChainProposer, verified by engine/decoding.py (modified rejection sampling);
  "tree"    TreeProposer, verified by engine/tree_decoding.py (one forward, tree mask);
  "jacobi"  lookahead: its proposer holds the Jacobi window and the n-gram pool,
            and its verifier loop lives in the same file (proposers/lookahead.py).

Optional capabilities a chain proposer declares (class attributes, default off):
  reads_target_cache     attach_target_cache(cache) is called once per run: the
                         proposer drafts in (or reads) the target's KV cache;
  supplies_verify_logits verify_logits(fed, tokens, keep) replaces the engine's
                         target forward (it already ran part of the target);
  reads_graph_cache      with reads_target_cache: the target's graph cache (gpu/cache.
                         GraphCache) serves it as it is (EAGLE reads the states the cache
                         keeps); without it the run goes eager over a dynamic cache.
A tree proposer may declare supplies_verify_logits too: the tree verifier then calls its
verify_tree(target, cache, fed=, tokens=, parents=, depths=, keep=) (tree_forward_logits' signature)
in place of tree_forward_logits (eagle-tree: it keeps the target's states as the forward runs).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol

import torch

from ..errors import RequestError
from .sampling import SamplingParams

# ------------------------------------------------------------------ a method's settings
# Each declared once as an `Option` in the method's own file (`register(..., options=(...))`). From
# these come the CLI flags (cli/main.py), the page's "Method settings" controls
# (ui/method_options.py), request validation (MethodSpec.check_options), what traces record and
# the run header's "shape 4-2-2-1 · budget 8".
INT, TEXT, FLAG = "int", "text", "flag"


@dataclass(frozen=True)
class Option:
    name: str  # the RunRequest.options key; the CLI flag is --name-with-dashes
    label: str  # the page control's label, and the subject of its error messages
    help: str  # the CLI's --help and the page's tooltip: what it does, and its default
    type: str = INT  # INT: a whole number in [lo, hi]; TEXT: `parse` reads it; FLAG: on/off
    lo: int = 1
    hi: int | None = None
    default: object = None  # a blank means this; None: the method decides (dynamic tree, calibrated layer)
    keep: bool = False  # a blank is recorded as `default` in the request (and its trace), else left out
    parse: Callable | None = None  # TEXT: value -> checked value, RequestError in the visitor's words
    short: str = ""  # in the run header: "shape 4-2-2-1"
    show: Callable | None = None  # a checked list of ints as the run header writes it (default "4-2-2-1")
    slider: bool = False  # the page shows a slider (at `default`), else a text box (blank = default)
    placeholder: str = ""
    page: bool = True  # False: never on the page (rest's datastore: a visitor must not pick server files)
    cli: bool = True  # False: API and bench only (early-exit's kv_reuse)

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"

    def check(self, value):
        """`value` as the method reads it; RequestError naming this option if it is not one."""
        if self.type == INT:
            return self._whole(value)
        if self.type == FLAG:
            if value not in (True, False, "on", "off", 0, 1):
                raise RequestError(f"{self.label} must be on or off, not {value!r}.")
            return value in (True, "on", 1)
        return self.parse(value) if self.parse is not None else value

    def _whole(self, value) -> int:
        try:
            if isinstance(value, bool):
                raise TypeError
            x = int(float(value))
            if x != float(value):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise RequestError(f"{self.label} must be a whole number, got {value!r}.") from None
        if x < self.lo or (self.hi is not None and x > self.hi):
            span = f"between {self.lo} and {self.hi}" if self.hi is not None else f"of at least {self.lo}"
            raise RequestError(f"{self.label} must be a whole number {span}, got {value!r}.")
        return x


def blank(value) -> bool:
    """None, "", "  " or [] (an API caller's empty tree shape): the default."""
    return value is None or (isinstance(value, str) and value.strip() == "") or value in ([], ())


def check_options(declared: tuple[Option, ...], options: dict) -> dict:
    """Each declared option checked (blank: its default, or left out); keys a
    method does not declare pass through unchanged, as before."""
    out = dict(options)
    for opt in declared:
        value = out.get(opt.name)
        if not blank(value):
            out[opt.name] = opt.check(value)
        elif opt.keep:
            out[opt.name] = opt.default
        else:
            out.pop(opt.name, None)
    return out



@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor  # (len(tokens), V) distributions the tokens were drawn from
    forwards: int = 0  # draft-model forward passes spent
    info: dict = field(default_factory=dict)  # method-specific, JSON-able; copied to RoundEvent.info
    # greedy runs: the draft's raw logits per token (its warped q is one-hot); the p/q inspector
    # shows their softmax, taken off the clock (engine/decoding._inspect)
    raw: list | None = None


class ChainProposer(Protocol):
    """What the chain verifier (engine/decoding.py) calls, in this order per run:
    reset once, then per round next_gamma, propose, (verify_logits), rollback."""

    name: str
    reads_target_cache: bool
    supplies_verify_logits: bool

    def reset(self, prompt_ids: list[int]) -> int: ...
    def next_gamma(self, requested: int) -> int: ...
    def propose(self, committed: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None, eos_ids: frozenset[int]) -> Proposal: ...
    def rollback(self, committed: list[int], n_accepted: int, n_drafted: int) -> None: ...
    def attach_target_cache(self, cache) -> None: ...
    def verify_logits(self, fed: list[int], tokens: list[int], keep: int) -> torch.Tensor: ...


class TreeProposer(Protocol):
    """What the tree verifier (engine/tree_decoding.py) calls: propose a tree of at
    most `depth` levels (proposers/tree.py TreeProposal), then keep the accepted path."""

    name: str

    def reset(self, prompt_ids: list[int]) -> int: ...
    def propose(self, committed: list[int], depth: int, params: SamplingParams,
                generator: torch.Generator | None, eos_ids: frozenset[int], width=None): ...
    def rollback_tree(self, committed: list[int], path: list[int]) -> None: ...


class JacobiProposer(Protocol):
    """What the Jacobi verifier (lookahead() in proposers/lookahead.py) calls: the
    round's layout (Jacobi levels + pool guesses), then the newest level's outputs."""

    name: str

    def reset(self, prompt_ids: list[int]) -> int: ...
    def propose(self, fed: int, last: int): ...
    def advance(self, new_level: list[int]) -> int: ...


class Proposer:
    """Defaults for a ChainProposer: fixed γ, no rollback state, no capabilities."""

    name = "base"
    reads_target_cache = False
    supplies_verify_logits = False
    reads_graph_cache = False
    # tokens the run may still write, set by the engine loop before each propose(): a proposer that
    # prices a one-off cost over the rest of the run reads it (the hybrid's lazy draft)
    remaining: int | None = None

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

    def attach_target_cache(self, cache) -> None:
        """Only called when reads_target_cache is declared."""

    def verify_logits(self, fed: list[int], tokens: list[int], keep: int) -> torch.Tensor:
        """Only called when supplies_verify_logits is declared."""
        raise NotImplementedError


Kind = Literal["chain", "tree", "jacobi"]
KINDS = ("chain", "tree", "jacobi")


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
    # its settings, each declared once (Option, above): CLI flags, page controls, validation
    options: tuple[Option, ...] = ()
    note: str = ""  # the page's line for it in "Method settings" (when it shows no controls)
    loses_when: str = ""  # when it tends to lose, in plain words: the page's note says it before a run
    # RoundEvent.info of its rounds -> run totals (CLI, bench), and one round's story (tooltips)
    summarize: Callable[[list[dict]], dict] | None = None
    round_note: Callable[[dict], str] | None = None

    def check_options(self, options: dict) -> dict:
        """`options` validated and normalised; RequestError in the visitor's words."""
        return check_options(self.options, options)
    kind: Kind = "chain"  # which verifier reads its proposals (see the module doc)
    # its proposer prices each round's length itself from the measured costs (suffix, hybrid):
    # under γ = auto the request's γ is only its cap, and no α̂-based policy second-guesses it
    own_gamma: bool = False
    # (pair, request) -> c, its draft step over the target's plain step, measured, for a method whose
    # draft is neither a draft model nor free (a trained head, the one the request's options name):
    # γ = auto prices its chain with it
    cost: Callable | None = None


REGISTRY: dict[str, MethodSpec] = {}


def register(name: str, label: str, **spec):
    """Decorator for a builder `(pair, req) -> Proposer`: makes `name` a method everywhere
    (`spec`: the other MethodSpec fields)."""
    if spec.get("kind", "chain") not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {spec['kind']!r}")

    def deco(build):
        REGISTRY[name] = MethodSpec(name, label, build, **spec)
        return build
    return deco


# ------------------------------------------------------------------ a method's own totals and notes
# Run-level totals and one round's story from the method-specific RoundEvent.info fields, for the CLI,
# bench and page: each method's MethodSpec.summarize and round_note (in its proposer file). Empty for
# methods without them (the chains).
def summarize(rounds, method: str | None) -> dict:
    spec = REGISTRY.get(method)
    infos = [r.info for r in rounds if getattr(r, "info", None)]
    return spec.summarize(infos) if infos and spec is not None and spec.summarize else {}


def describe(d: dict) -> str:
    """One line from summarize()'s dict."""
    return "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in d.items())


def round_note(info: dict, method: str | None) -> str:
    """One round's method-specific story, for a tooltip (empty for chain methods)."""
    spec = REGISTRY.get(method)
    return spec.round_note(info) if info and spec is not None and spec.round_note else ""
