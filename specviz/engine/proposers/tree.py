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
from ..gamma import MAX_ORDER, MAX_TREE
from ..proposer import TEXT, Option, Proposer, check_options, register, target_vocab
from ..sampling import warp
from ..tree_forward import frontier_bias

MAX_NODES = 64
# a blank budget without measured costs (tiny test pairs): bf16 verify cost on a CPU is flat up to
# ~8 new tokens; fp32 is not. With them the tree is sized each round (gamma.TreeWidth)
DEFAULT_BUDGET = 8


@dataclass
class TreeProposal:
    tokens: list[int]
    parents: list[int]  # -1: child of the root (the last committed token)
    q: torch.Tensor  # (N + 1, V): row 0 root, row i + 1 node i; the law its children came from
    forwards: int = 0
    doubt: dict = field(default_factory=dict)  # node (-1 root) -> 1 - max q, where the grower read it
    # children copied from text (a suffix tree), not drawn from q: q is None, the verifier tests each
    # child as a one-hot draft (tree_sampling.accept_sampled with q None)
    fixed: bool = False
    info: dict = field(default_factory=dict)  # method-specific, JSON-able; copied to RoundEvent.info


class _Left(dict):
    """node -> q mass not yet drawn as a child, copied from its row at its first draw (most rows
    are never drawn from: a copy of a 152k-token row each costs time)."""

    def __init__(self, rows: dict):
        super().__init__()
        self.rows = rows

    def __missing__(self, u: int) -> torch.Tensor:
        out = self[u] = self.rows[u].clone()
        return out


@dataclass
class Tree:
    """The tree being grown: nodes, their draft rows, cache slots and cum. probs."""

    rows: dict = field(default_factory=dict)  # node (-1 root) -> q it draws children from
    left: _Left = None  # node -> q mass not yet drawn as a child
    tokens: list = field(default_factory=list)
    parents: list = field(default_factory=list)
    depth: list = field(default_factory=list)
    cum: list = field(default_factory=list)
    slot: dict = field(default_factory=dict)  # node -> draft cache position
    doubt: dict = field(default_factory=dict)  # node -> 1 - max q (the auto tree's rows)
    kids: dict = field(default_factory=dict)  # node -> children drawn
    top: dict = field(default_factory=dict)  # node -> its row's first choices, best first (greedy)

    def __post_init__(self):
        self.left = _Left(self.rows)

    def add(self, parent: int, x: int) -> int:
        self.tokens.append(x)
        self.parents.append(parent)
        self.depth.append(1 if parent < 0 else self.depth[parent] + 1)
        base = 1.0 if parent < 0 else self.cum[parent]
        self.cum.append(base * float(self.rows[parent][x]))
        if parent in self.left:  # drawn from (a greedy auto tree reads `top` instead)
            self.left[parent][x] = 0
        self.kids[parent] = self.kids.get(parent, 0) + 1
        return len(self.tokens) - 1

    def ancestors(self, i: int) -> list[int]:
        out = []
        while self.parents[i] >= 0:
            i = self.parents[i]
            out.append(i)
        return out


def draft_row(logits: torch.Tensor, params) -> torch.Tensor:
    """A draft row's law: greedy ranks children by the plain softmax (the warped greedy q is one-hot)."""
    return logits.float().softmax(-1) if params.greedy else warp(logits, params)


class TreeGrower:
    """How a tree grows, whatever drafts its rows (the draft model here, the EAGLE head in
    eagle_tree.py): static shapes, EAGLE-2's best-first dynamic tree, the auto-sized one. A subclass
    has `shape` and `budget` and an `_expand(t, nodes, params)` that sets t.rows[i] and t.slot[i] of
    each node in one forward (their ancestors' rows are already there)."""

    shape: tuple[int, ...] | None = None
    budget: int | None = None

    def grow(self, t: Tree, depth: int, params, generator, eos_ids, width=None) -> int:
        """t.rows[-1] set: grows t; returns the draft forwards spent after the root's."""
        eos = frozenset(eos_ids)
        if self.shape:
            return self._grow_static(t, depth, params, generator, eos)
        if self.budget is None and width is not None:
            return self._grow_auto(t, depth, params, generator, eos, width)
        return self._grow_dynamic(t, depth, params, generator, eos)

    @staticmethod
    def q_rows(t: Tree) -> torch.Tensor:
        """(N + 1, V): row 0 the root's law, row i + 1 node i's (0 for a node never expanded)."""
        q = torch.zeros(len(t.tokens) + 1, t.rows[-1].shape[-1])
        for node, row in t.rows.items():
            q[node + 1] = row
        return q

    def _expand(self, t: Tree, nodes: list[int], params) -> None:
        raise NotImplementedError

    def _draw(self, t: Tree, u: int, params, generator) -> int:
        left = t.left[u]
        if params.greedy:
            return int(left.argmax())
        return int(torch.multinomial(left / left.sum(), 1, generator=generator))

    def _next_choice(self, t: Tree, u: int) -> int:
        """A greedy auto tree's next child at u: its row's next choice (its first read when the row
        opened, the others by one top-k when a second is asked for; not a copy and an argmax a
        child). At most MAX_ORDER of them; one of no mass is still a guess."""
        n, top = t.kids.get(u, 0), t.top[u]
        if n >= len(top):  # after the first choice, the rest of the row's top k, in order
            k = min(MAX_ORDER + 1, t.rows[u].shape[-1])
            top += [j for j in t.rows[u].topk(k).indices.tolist() if j != top[0]][:MAX_ORDER - 1]
        return top[n]

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

        while len(t.tokens) < (self.budget or DEFAULT_BUDGET):
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

    def _grow_auto(self, t, depth, params, generator, eos, width) -> int:
        """Grow while the best next move pays (gamma.TreeWidth): a child of a node with a q row, or
        one draft forward for the pending layer (worth its best node's first child). What is drawn
        depends only on rows and draws made before it, never on the child itself (tree_sampling.py),
        and nothing drawn is dropped."""
        doubt, reach, pending = {}, {-1: 1.0}, []  # doubt: the nodes open for a child
        won = [1.0, 1]  # E (tokens the round yields, bonus included), F (draft forwards)

        def opened(u):
            if params.greedy:  # the row's first choice; the next ones only if asked (a top-k costs 2x)
                best, at = t.rows[u].max(-1)
                t.top[u] = [int(at)]
                doubt[u] = t.doubt[u] = 1 - float(best)
            else:
                doubt[u] = t.doubt[u] = 1 - float(t.rows[u].max())

        def add(u):
            x = self._next_choice(t, u) if params.greedy else self._draw(t, u, params, generator)
            i = t.add(u, x)
            reach[i] = reach[u] * width.child_share(doubt[u], t.kids[u])
            won[0] += reach[i]
            # greedy takes a row's first choices; a sampled row may run out (top-k, top-p)
            if t.kids[u] >= min(MAX_ORDER, t.rows[u].shape[-1]) \
                    or not (params.greedy or float(t.left[u].max()) > 0):
                del doubt[u]  # no more children here
            if t.depth[i] < depth and t.tokens[i] not in eos:
                pending.append(i)

        def gain(u):
            return reach[u] * width.child_share(doubt[u], t.kids.get(u, 0) + 1)

        opened(-1)
        add(-1)  # every round drafts at least the root's first choice
        while len(t.tokens) < MAX_TREE:
            n, steps = len(t.tokens), width.c * won[1] + width.verify_cost(len(t.tokens))
            best = max(doubt, key=gain, default=None)
            g, cost = (gain(best) if best is not None else 0.0), width.row_cost(n)
            hope = max((reach[i] for i in pending), default=0.0) * width.rate(1)
            # the forward buys more per step (or no row can take a child: a flat stretch of v makes
            # a sibling free, and a forward must still be weighed once none is left)
            if pending and (best is None or hope * cost > g * (width.c + cost)):
                if not width.pays(hope, width.c + cost, won[0], steps):
                    break
                # the forward goes for its best node; another rides along only where it would have
                # paid for a forward of its own (each row costs the draft too): the rest stay leaves
                top = max(pending, key=reach.__getitem__)
                rows = [i for i in pending if i == top or width.pays(
                    reach[i] * width.rate(1), width.c + cost, won[0], steps)]
                self._expand(t, rows, params)
                won[1] += 1
                for i in rows:
                    opened(i)
                pending.clear()
                continue
            if best is None or not width.pays(g, cost, won[0], steps):
                break
            add(best)
        return won[1] - 1


@dataclass
class TreeDraftProposer(TreeGrower, Proposer):
    model: torch.nn.Module
    vocab_size: int | None = None
    shape: tuple[int, ...] | None = None  # static children per depth; None: dynamic
    budget: int | None = None  # None: auto (gamma.TreeWidth), DEFAULT_BUDGET without one
    name: str = "tree"
    cache: DynamicCache | None = field(default=None, repr=False)

    def reset(self, prompt_ids: list[int]) -> int:
        self.cache = DynamicCache()
        if len(prompt_ids) > 1:
            forward_logits(self.model, prompt_ids[:-1], self.cache, 1)
            return 1
        return 0

    def _row(self, logits, params):
        return draft_row(logits[..., : self.vocab_size] if self.vocab_size else logits, params)

    def propose(self, committed, depth, params, generator, eos_ids, width=None) -> TreeProposal:
        """A tree of at most `depth` levels; width (gamma.TreeWidth): sized by measured costs where
        the budget is auto."""
        feed = committed[self.cache.get_seq_length():]
        t = Tree()
        # exact=False: only the draft's own q depends on these bits, and a two-token feed (after a
        # bonus round) is then one forward, not two (docs/why.md#draft-inexact)
        t.rows[-1] = self._row(forward_logits(self.model, feed, self.cache, 1, exact=False)[-1], params)
        self.n_prefix = len(committed)
        forwards = 1 + self.grow(t, depth, params, generator, eos_ids, width)
        q = self.q_rows(t)
        self.slots = t.slot
        return TreeProposal(t.tokens, t.parents, q, forwards, t.doubt)

    def _expand(self, t: Tree, nodes: list[int], params) -> None:
        """One draft forward of `nodes` (their ancestors are cached): their q rows."""
        n_cache = self.cache.get_seq_length()
        anc = [[t.slot[a] for a in t.ancestors(i)] for i in nodes]
        if len(nodes) == 1 and sorted(anc[0]) == list(range(self.n_prefix, n_cache)):
            # the cache holds the prefix and this node's ancestors only: a causal step at the next
            # position, the chain draft's own forward (the masked one cost more: docs/why.md#tree-step)
            logits = forward_logits(self.model, [t.tokens[nodes[0]]], self.cache, 1, exact=False)
        else:
            bias = frontier_bias(anc, n_prefix=self.n_prefix, n_cache=n_cache)
            logits = masked_forward(self.model, self.cache, ids=[t.tokens[i] for i in nodes],
                                    positions=[self.n_prefix - 1 + t.depth[i] for i in nodes], bias=bias,
                                    keep=len(nodes))
        rows = self._row(logits, params)  # one call for the layer: per row, each costs a dispatch
        for j, i in enumerate(nodes):
            t.slot[i] = n_cache + j
            t.rows[i] = rows[j]

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


OPTIONS = (
    Option("tree_shape", "Tree shape", "Children per depth, e.g. 4-2-2-1: 4 guesses for the next token, 2 "
           "after each, … Blank (default): a dynamic tree that grows its most likely nodes.",
           type=TEXT, keep=True, parse=parse_shape, short="shape", placeholder="e.g. 4-2-2-1"),
    Option("tree_budget", "Tree budget (nodes)", f"Most draft nodes per tree (1-{MAX_NODES}); the target "
           f"checks them all in one pass. Blank: a dynamic tree grows while each node pays for its row, "
           f"by this machine's measured costs ({DEFAULT_BUDGET} nodes where none were measured); a static "
           f"one its whole shape.", hi=MAX_NODES, keep=True, short="budget", placeholder="blank: auto"),
)


def check_tree_options(options: dict) -> dict:
    """tree_shape: children per depth ("4-2-2-1-1"; empty = dynamic tree);
    tree_budget: most nodes per tree (blank: auto, see TreeWidth)."""
    return check_options(OPTIONS, options)


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: when a draft step costs much (c high) or the verify pass of all the "
    "tree's nodes costs several plain steps (on a CPU every row costs).")


@register("tree", "token tree", loses_when=LOSES, needs_draft=True, order=10, options=OPTIONS, kind="tree",
          description="the draft grows several branches (γ = depth), the target checks them all in one pass")
def _build_tree(pair, req=None):
    if pair.draft is None:
        raise RequestError("This pair has no draft model: pick prompt lookup instead.")
    opts = check_tree_options(dict(getattr(req, "options", None) or {}))
    shape = tuple(opts["tree_shape"]) if opts["tree_shape"] else None
    return TreeDraftProposer(pair.draft, vocab_size=target_vocab(pair.target), shape=shape,
                             budget=opts["tree_budget"] or (MAX_NODES if shape else None))
