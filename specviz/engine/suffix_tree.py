"""Suffix trees of token sequences for free drafts (SuffixDecoding, Oliaro et al.,
arXiv 2411.04975; the reference is Arctic Inference's `suffix_decoding`).

A tree holds every substring of its documents up to DEPTH tokens: the node of a
string s counts its occurrences and remembers where it last ended (document,
position), so a draft can say where it was copied from. Appending a token to a
document moves at most DEPTH nodes one level down (O(DEPTH) a token).

Speculation, for each match length m of the context's tail: from the node of
the last m tokens, follow the most frequent child while the path's empirical
probability Π count(child) / count(node) stays ≥ min_prob, for at most
⌊spec_factor · m⌋ tokens. The score is Σ of those probabilities (the expected
number of drafted tokens the text would confirm); the best score over m wins.

Pure Python: one draft over a 24-deep tree takes tens of µs, a verify forward
tens of ms (measured in tests/test_suffix.py and the bench's lookup_ms).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..machine import Lock

DEPTH = 24  # vLLM's default suffix_decoding_max_tree_depth
MIN_PROB = 0.1  # vLLM's suffix_decoding_min_token_prob
SPEC_FACTOR = 1.0  # vLLM's suffix_decoding_max_spec_factor: draft ≤ factor × match length


class Node:
    __slots__ = ("count", "kids", "doc", "pos")

    def __init__(self):
        self.count = 0
        self.kids: dict | None = None  # token -> Node, None while a leaf (most nodes: saves a dict)
        self.doc = -1  # the document of the latest occurrence ending here
        self.pos = -1  # the index, in that document, of this node's last token


@dataclass
class Draft:
    """The best chain for a context: tokens, their path probabilities, and where it came from."""

    tokens: list[int]
    probs: list[float]  # empirical Π count ratio up to each token
    match_len: int
    doc: int = -1  # where the draft's whole path (match + tokens) last occurred
    end: int = -1  # index after the last drafted token in that document

    @property
    def score(self) -> float:
        return sum(self.probs)

    @property
    def start(self) -> int:
        return self.end - len(self.tokens)


@dataclass
class SuffixTree:
    depth: int = DEPTH
    root: Node = field(default_factory=Node)
    docs: dict = field(default_factory=dict)  # doc id -> its tokens (list)
    nodes: int = 0
    _tails: dict = field(default_factory=dict)  # doc id -> nodes of its current suffixes, depth 1..

    # ---------------------------------------------------------------- building
    def add(self, doc: int, tokens) -> None:
        """Append tokens to document `doc` (a new one if unseen)."""
        seq = self.docs.setdefault(doc, [])
        tails = self._tails.get(doc, [])
        root, cap = self.root, self.depth - 1
        for t in tokens:
            pos = len(seq)
            seq.append(t)
            new = []
            for node in (root, *tails[:cap]):
                kids = node.kids
                if kids is None:
                    kids = node.kids = {}
                child = kids.get(t)
                if child is None:
                    child = kids[t] = Node()
                    self.nodes += 1
                child.count += 1
                child.doc, child.pos = doc, pos
                new.append(child)
            tails = new
        self._tails[doc] = tails

    def tails(self, doc: int) -> list[Node]:
        """The nodes of `doc`'s current suffixes, depth 1, 2, ... (its own latest occurrence)."""
        return self._tails.get(doc, [])

    def remove(self, doc: int) -> None:
        """Forget a document: undo each of its suffixes' counts, dropping nodes that reach 0
        (a child never counts more than its parent, so its subtree is all at 0 too)."""
        seq = self.docs.pop(doc, None)
        self._tails.pop(doc, None)
        if not seq:
            return
        for s in range(len(seq)):
            node = self.root
            for t in seq[s:s + self.depth]:
                child = node.kids.get(t) if node.kids else None
                if child is None:
                    break
                child.count -= 1
                if child.count <= 0:
                    del node.kids[t]
                    self.nodes -= _size(child)
                    break
                node = child

    # ---------------------------------------------------------------- speculation
    def match(self, context: list[int]) -> list[Node]:
        """Nodes of the context's tail, length 1, 2, ... as long as the tree has them."""
        out = []
        for m in range(1, min(self.depth, len(context)) + 1):
            node = self.root
            for t in context[len(context) - m:]:
                node = node.kids.get(t) if node.kids else None
                if node is None:
                    return out
            out.append(node)
        return out

    def speculate(self, matched: list[Node], max_tokens: int, min_prob: float = MIN_PROB,
                  spec_factor: float = SPEC_FACTOR) -> Draft | None:
        """The best-scoring chain from any matched node (matched[i] has depth i + 1)."""
        best = None
        for m, node in enumerate(matched, 1):
            if not node.kids:
                continue
            room = min(max_tokens, int(spec_factor * m), self.depth - m)
            toks, probs, p, end = [], [], 1.0, node
            while len(toks) < room and end.kids:
                t, child = max(end.kids.items(), key=_by_count)
                p *= child.count / end.count
                if p < min_prob:
                    break
                toks.append(t)
                probs.append(p)
                end = child
            if toks and (best is None or sum(probs) >= best.score):
                best = Draft(toks, probs, m, end.doc, end.pos + 1)
        return best

    def speculate_tree(self, matched: list[Node], budget: int, max_depth: int, min_prob: float = MIN_PROB,
                       spec_factor: float = SPEC_FACTOR) -> TreeDraft | None:
        """The best-scoring token tree from any matched node: best-first on the path probability
        (a child's never exceeds its parent's, so every prefix of the order is a tree)."""
        best = None
        for m, node in enumerate(matched, 1):
            if not node.kids:
                continue
            room = min(max_depth, int(spec_factor * m), self.depth - m)
            d = _grow(node, m, budget, room, min_prob)
            if d.tokens and (best is None or d.score >= best.score):
                best = d
        return best

    def nbytes(self) -> int:
        """Estimated memory of the tree: NODE_BYTES a node (measured) + 8 bytes a stored token."""
        return self.nodes * NODE_BYTES + 8 * sum(len(s) for s in self.docs.values())


@dataclass
class TreeDraft:
    """A token tree (parents[i] < i, -1: the context's last token) with each node's path
    probability, in best-first order; `chain` is the most probable child path (its source)."""

    tokens: list[int]
    parents: list[int]
    probs: list[float]
    match_len: int
    chain: list[int] = field(default_factory=list)  # node indices of the most-probable path
    doc: int = -1
    end: int = -1

    @property
    def score(self) -> float:
        return sum(self.probs)

    @property
    def start(self) -> int:
        return self.end - len(self.chain)


def _grow(root: Node, m: int, budget: int, depth: int, min_prob: float) -> TreeDraft:
    d = TreeDraft([], [], [], m)
    heap, n = [], 0  # (-p, tiebreak, trie node, parent index, depth, on the most-probable path)
    top = max(root.kids.items(), key=_by_count)[0]
    for t, child in root.kids.items():
        if child.count >= min_prob * root.count:  # a child below min_prob is never taken
            heapq.heappush(heap, (-child.count / root.count, n, t, child, -1, 1, t == top))
            n += 1
    while heap and len(d.tokens) < budget:
        negp, _, t, node, parent, level, main = heapq.heappop(heap)
        i = len(d.tokens)
        d.tokens.append(t)
        d.parents.append(parent)
        d.probs.append(-negp)
        if main:
            d.chain.append(i)
            d.doc, d.end = node.doc, node.pos + 1
        if node.kids and level < depth:
            top = max(node.kids.items(), key=_by_count)[0]
            for tk, child in node.kids.items():
                if -negp * child.count >= min_prob * node.count:
                    heapq.heappush(heap, (negp * child.count / node.count, n, tk, child, i, level + 1,
                                          main and tk == top))
                    n += 1
    return d


def _by_count(item):
    return item[1].count


def _size(node: Node) -> int:
    n, stack = 0, [node]
    while stack:
        x = stack.pop()
        n += 1
        if x.kids:
            stack.extend(x.kids.values())
    return n


# a node and its share of the kids dicts, as tracemalloc counts it on CPython 3.11: 281-283 bytes over
# 2,000 tokens of random text (2026-11-27); tests/test_suffix.py checks the estimate stays above it
NODE_BYTES = 300


# -------------------------------------------------------------------- memory of earlier outputs
# the scope of outputs of the shipped presets' prompts, every visitor's (each also in its session's scope):
# read only by a run with share memory on (RunRequest.share_memory, off by default)
PRESETS = "presets"
MAX_BYTES = 64 * 2**20  # all scopes together; the oldest output anywhere goes first
MAX_DOCS = 32  # outputs kept per scope
IDLE_S = 3600.0  # a scope nobody used for an hour is forgotten


@dataclass
class Memory:
    """Earlier outputs, one suffix tree per scope. A scope is one visitor's session (or
    PRESETS): a run reads its own scope, and PRESETS only when its visitor shares memory;
    never another visitor's typed text."""

    max_bytes: int = MAX_BYTES
    max_docs: int = MAX_DOCS
    idle_s: float = IDLE_S
    trees: dict = field(default_factory=dict)  # scope -> SuffixTree
    order: list = field(default_factory=list)  # (scope, doc) oldest first
    used: dict = field(default_factory=dict)  # scope -> last use (time.monotonic)
    labels: dict = field(default_factory=dict)  # (scope, doc) -> "your earlier run 2"
    lock: Lock = field(default_factory=Lock)
    _next: int = 0

    def tree(self, scope: str) -> SuffixTree | None:
        return self.trees.get(scope)

    def new_doc(self, scope: str, label: str, now: float) -> int:
        with self.lock:
            self._forget_idle(now)
            self.used[scope] = now
            tree = self.trees.setdefault(scope, SuffixTree())
            self._next += 1
            doc = self._next
            tree.docs[doc] = []
            self.order.append((scope, doc))
            self.labels[(scope, doc)] = label
            mine = [d for s, d in self.order if s == scope]
            for old in mine[: max(0, len(mine) - self.max_docs)]:
                self._drop(scope, old)
            return doc

    def extend(self, scope: str, doc: int, tokens, now: float) -> None:
        with self.lock:
            tree = self.trees.get(scope)
            if tree is None or doc not in tree.docs:
                return  # evicted meanwhile: this run's output is simply not remembered further
            tree.add(doc, tokens)
            self.used[scope] = now
            while self.nbytes() > self.max_bytes and self.order:
                self._drop(*self.order[0])  # the oldest first, this run's own output last

    def nbytes(self) -> int:
        return sum(t.nbytes() for t in self.trees.values())

    def docs(self) -> set:
        """(scope, doc) of every output held now: what since() compares against."""
        with self.lock:
            return set(self.order)

    def since(self, before: set) -> list[tuple[str, str, list[int]]]:
        """(scope, label, tokens) of each output written since docs() gave `before`: what a ZeroGPU
        call's forked process hands the page's memory (ui/handlers.py), oldest first."""
        with self.lock:
            return [(scope, self.labels.get((scope, doc), ""), list(self.trees[scope].docs[doc]))
                    for scope, doc in self.order if (scope, doc) not in before]

    def add(self, scope: str, label: str, tokens, now: float) -> None:
        """A whole output at once (written elsewhere: a forked process's run)."""
        self.extend(scope, self.new_doc(scope, label, now), tokens, now)

    def clear(self) -> None:
        with self.lock:
            self.trees.clear()
            self.order.clear()
            self.labels.clear()
            self.used.clear()

    def _drop(self, scope: str, doc: int) -> None:
        self.trees[scope].remove(doc)
        self.order.remove((scope, doc))
        self.labels.pop((scope, doc), None)

    def _forget_idle(self, now: float) -> None:
        for scope, last in list(self.used.items()):
            if now - last > self.idle_s and scope != PRESETS:
                for s, d in [x for x in self.order if x[0] == scope]:
                    self._drop(s, d)
                self.trees.pop(scope, None)
                self.used.pop(scope, None)


MEMORY = Memory()  # the process's one memory (the page's visitors, each in their own scope)
