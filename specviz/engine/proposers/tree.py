"""Tree drafting: the draft model expands a token tree, the target verifies
all of it in one forward (engine/tree_decoding.py).

Two shapes. Static: children per node at each depth ("4-2-2-1-1"). Dynamic
(EAGLE-2 style): grow the tree one node at a time, always at the node whose
next child has the highest cumulative draft probability, up to a node budget.
γ is the tree depth. The draft sees its tree through a tree attention mask,
one forward per new layer of nodes, so it pays ~depth forwards, like a chain.

Children are drawn without replacement from q when sampling (so recursive
rejection sampling stays exact, see tree_sampling.py) and are the draft's
top-k when greedy. The dynamic tree only decides WHERE to draw next from what
is already drawn; it never drops a drawn node (that would bias q).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ...errors import RequestError
from ..forward import crop_cache, forward_logits, keep_cache_slots, masked_forward
from ..proposer import TEXT, Option, Proposer, check_options, register, target_vocab
from ..sampling import warp
from ..tree_forward import frontier_bias

MAX_NODES = 64
# bf16 verify cost on this CPU is flat up to ~8 new tokens; fp32 is not
DEFAULT_BUDGET = 8


@dataclass
class TreeProposal:
    tokens: list[int]
    parents: list[int]  # -1: child of the root (the last committed token)
    q: torch.Tensor  # (N + 1, V): row 0 root, row i + 1 node i; the law its children came from
    forwards: int = 0


@dataclass
class _Tree:
    """The tree being grown: nodes, their draft rows, cache slots and cum. probs."""

    rows: dict = field(default_factory=dict)  # node (-1 root) -> q it draws children from
    left: dict = field(default_factory=dict)  # node -> q mass not yet drawn as a child
    tokens: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    depth: list = field(default_factory=list)
    cum: list = field(default_factory=list)
    slot: dict = field(default_factory=dict)  # node -> draft cache position

    def add(self, parent: int, x: int) -> int:
        self.tokens.append(x)
        self.parents.append(parent)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        base = 1.0 if parent < 0 else self.cum[parent]
        self.cum.append(base * float(self.rows[parent][x]))
        self.left[parent][x] = 0
        return len(self.tokens) - 1

    def ancestors(self, i: int) -> list[int]:
        out = []
        while self.parents[i] >= 0:
            i = self.parents[i]
            out.append(i)
        return out


@dataclass
class TreeDraftProposer(Proposer):
    model: torch.nn.Module
    vocab_size: int | None = None
    shape: tuple[int, ...] | None = None  # static children per depth; None: dynamic
    budget: int = DEFAULT_BUDGET
    name: str = "tree"
    cache: DynamicCache | None = field(default=None, repr=False)

    def reset(self, prompt_ids: list[int]) -> int:
        self.cache = DynamicCache()
        if len(prompt_ids) > 1:
            forward_logits(self.model, prompt_ids[:-1], self.cache, 1)
            return 1
        return 0

    def _row(self, logits, params):
        logits = logits[..., : self.vocab_size] if self.vocab_size else logits
        # greedy ranks children by the plain softmax (the warped greedy q is one-hot)
        return logits.float().softmax(-1) if params.greedy else warp(logits, params)

    def propose(self, committed, depth, params, generator, eos_ids) -> TreeProposal:
        feed = committed[self.cache.get_seq_length():]
        t = _Tree()
        # exact=False: only the draft's own q depends on these bits, and a two-token feed (after a
        # bonus round) is then one forward, not two (docs/why.md#draft-inexact)
        t.rows[-1] = self._row(forward_logits(self.model, feed, self.cache, 1, exact=False)[-1], params)
        t.left[-1] = t.rows[-1].clone()
        self.n_prefix = len(committed)
        grow = self._grow_static if self.shape else self._grow_dynamic
        forwards = 1 + grow(t, depth, params, generator, frozenset(eos_ids))
        q = torch.zeros(len(t.tokens) + 1, t.rows[-1].shape[-1])
        for node, row in t.rows.items():
            q[node + 1] = row
        self.slots = t.slot
        return TreeProposal(t.tokens, t.parents, q, forwards)

    def _expand(self, t: _Tree, nodes: list[int], params) -> None:
        """One draft forward of `nodes` (their ancestors are cached): their q rows."""
        n_cache = self.cache.get_seq_length()
        bias = frontier_bias([[t.slot[a] for a in t.ancestors(i)] for i in nodes],
                             n_prefix=self.n_prefix, n_cache=n_cache)
        root = self.n_prefix - 1
        logits = masked_forward(self.model, self.cache, ids=[t.tokens[i] for i in nodes],
                                positions=[root + t.depth[i] for i in nodes], bias=bias, keep=len(nodes))
        for j, i in enumerate(nodes):
            t.slot[i] = n_cache + j
            t.rows[i] = self._row(logits[j], params)
            t.left[i] = t.rows[i].clone()

    def _draw(self, t: _Tree, u: int, params, generator) -> int:
        left = t.left[u]
        if params.greedy:
            return int(left.argmax())
        return int(torch.multinomial(left / left.sum(), 1, generator=generator))

    def _grow_static(self, t, depth, params, generator, eos) -> int:
        frontier, forwards = [-1], 0
        for d in range(depth):
            k = self.shape[d] if d < len(self.shape) else 1
            new = []
            for u in frontier:
                for _ in range(min(k, int((t.left[u] > 0).sum()))):
                    if len(t.tokens) >= self.budget:
                        break
                    new.append(t.add(u, self._draw(t, u, params, generator)))
            frontier = [i for i in new if t.tokens[i] not in eos]
            if d == depth - 1 or not frontier:
                break
            self._expand(t, frontier, params)
            forwards += 1
        return forwards

    def _grow_dynamic(self, t, depth, params, generator, eos) -> int:
        """Best-first: draw the child with the highest expected cumulative q next.

        Drawing at u is worth cum(u) · max q_u left; a pending (not yet forwarded)
        node c promises about cum(c) · max q_parent(c). The draft forwards the
        pending layer when that promise wins, at most depth - 1 times (a chain
        of γ drafts costs γ forwards as well), then spends the rest on siblings."""
        pending, forwards = [], 0

        def value(u):
            return (1.0 if u < 0 else t.cum[u]) * float(t.left[u].max())

        def hope(c):
            return t.cum[c] * float(t.rows[t.parents[c]].max())

        while len(t.tokens) < self.budget:
            open_ = [u for u in t.rows if float(t.left[u].max()) > 0]
            best = max(open_, key=value, default=None)
            if pending and forwards < depth - 1 and (best is None or max(map(hope, pending)) > value(best)):
                self._expand(t, pending, params)
                forwards += 1
                pending = []
                continue
            if best is None:
                break
            i = t.add(best, self._draw(t, best, params, generator))
            if t.depth[i] < depth and t.tokens[i] not in eos:
                pending.append(i)
        return forwards

    def rollback_tree(self, committed: list[int], path: list[int]) -> None:
        """Keep the committed prefix and the accepted path's cached entries."""
        kept = [self.slots[i] for i in path if i in self.slots]
        keep_cache_slots(self.cache, prefix=self.n_prefix, slots=kept)
        crop_cache(self.cache, len(committed) - 1)


def parse_shape(shape) -> list[int]:
    """Children per depth: "4-2-2-1" (or a list) -> [4, 2, 2, 1]."""
    try:
        parts = shape.replace(",", "-").split("-") if isinstance(shape, str) else list(shape)
        shape = [int(x) for x in parts]  # an empty depth ("4--2") is no number: refused
    except (TypeError, ValueError):
        raise RequestError(f"Tree shape must look like 4-2-2-1 (children per depth), got {shape!r}.") \
            from None
    if not shape or any(k < 1 or k > 16 for k in shape) or len(shape) > 16:
        raise RequestError("Tree shape: 1 to 16 depths, each with 1 to 16 children, e.g. 4-2-2-1.")
    return shape


def _budget_default(options: dict) -> dict:
    """A dynamic tree (no shape) grows DEFAULT_BUDGET nodes unless told; a static one its whole shape."""
    if options.get("tree_budget") is None and options.get("tree_shape") is None:
        options["tree_budget"] = DEFAULT_BUDGET
    return options


OPTIONS = (
    Option("tree_shape", "Tree shape", "Children per depth, e.g. 4-2-2-1: 4 guesses for the next token, 2 "
           "after each, … Blank (default): a dynamic tree that grows its most likely nodes.",
           type=TEXT, keep=True, parse=parse_shape, short="shape", placeholder="e.g. 4-2-2-1"),
    Option("tree_budget", "Tree budget (nodes)", f"Most draft nodes per tree (1-{MAX_NODES}); the target "
           f"checks them all in one pass. Blank: {DEFAULT_BUDGET} for a dynamic tree, the whole shape for a "
           f"static one.", hi=MAX_NODES, keep=True, short="budget"),
)


def check_tree_options(options: dict) -> dict:
    """tree_shape: children per depth ("4-2-2-1-1"; empty = dynamic tree);
    tree_budget: most nodes per tree (dynamic default 8)."""
    return _budget_default(check_options(OPTIONS, options))


@register("tree", "token tree", needs_draft=True, order=10, options=OPTIONS, finish=_budget_default,
          kind="tree",
          description="the draft grows several branches (γ = depth), the target checks them all in one pass")
def _build_tree(pair, req=None):
    if pair.draft is None:
        raise RequestError("This pair has no draft model: pick prompt lookup instead.")
    opts = check_tree_options(dict(getattr(req, "options", None) or {}))
    shape = tuple(opts["tree_shape"]) if opts["tree_shape"] else None
    return TreeDraftProposer(pair.draft, vocab_size=target_vocab(pair.target), shape=shape,
                             budget=opts["tree_budget"] or MAX_NODES)
