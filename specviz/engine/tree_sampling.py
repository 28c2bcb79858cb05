"""Token-tree math for tree speculation: pure functions on tensors.

A tree of N drafted nodes is given by `parents` (node i's parent index, -1 for
the root = the last committed token) with parents[i] < i, so nodes come in a
topological order. Row 0 of every per-position tensor (p, q rows) belongs to
the root, row i + 1 to node i.

Sampling acceptance: recursive rejection sampling (RRS) with siblings drawn
WITHOUT replacement (Yang et al. 2024 "multi-candidate speculative decoding";
Jeon et al. 2024 "recursive speculative decoding"). At a node u with target
law p and draft law q, its children x_1, x_2, ... were drawn one after another
from q_1 = q, q_{i+1} = q_i with x_i removed and renormalised. Verification:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), then move to x_i;
    else p_{i+1} = norm(max(0, p_i - q_i)), try x_{i+1};
    no child left: draw the appended token from p_{m+1}.

Why the output follows p exactly (induction over the children, last first):
each step is one ordinary speculative-sampling step with draft q_i, target
p_i, so P(out = y) = min(p_i(y), q_i(y)) + (1 - Σ min(p_i, q_i)) · law(out | reject).
A rejected x_i had p_i(x_i) < q_i(x_i), hence p_{i+1}(x_i) = 0: removing x_i
from the next draft law loses nothing, and the rest of the procedure (draft
q_{i+1} = the true law of x_{i+1} given x_i, target p_{i+1}) outputs exactly
p_{i+1} whatever x_i was (induction hypothesis). So the step outputs p_i, and
u's output follows p. The accepted child's own children were drawn from the
draft given that child, independently of this test, so the argument repeats
down the path. The number of children may depend on anything drawn before
(the dynamic tree's choices do), never on the child itself: a draw that is
made is always kept, which is why the dynamic tree never prunes by q.

Greedy (temperature 0): children are the draft's top-k tokens and the
accepted path is the longest one that follows the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import draw_uniform, residual, sample


def depths_of(parents: list[int]) -> list[int]:
    """Depth of each node (children of the root have depth 1)."""
    depth: list[int] = []
    for par in parents:
        depth.append(1 if par < 0 else depth[par] + 1)
    return depth


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """Children of each node (-1 = root), in draw order."""
    kids: dict[int, list[int]] = {-1: []}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
        kids.setdefault(i, [])
    return kids


def draw_children(q: torch.Tensor, k: int, generator=None, *, greedy: bool = False) -> list[int]:
    """k distinct tokens from q: drawn without replacement (sampling) or its
    top-k (greedy). Fewer when q has fewer than k tokens of positive mass."""
    k = min(k, int((q > 0).sum()))
    if greedy:
        return torch.topk(q, k).indices.tolist()
    left, out = q.clone(), []
    for _ in range(k):
        x = int(sample(left / left.sum(), generator))
        out.append(x)
        left[x] = 0
    return out


@dataclass
class TreeVerdict:
    """Outcome of verifying one tree."""

    path: list[int]  # accepted node indices, root to leaf
    token: int  # the token appended after the path
    resampled: bool  # True: the last path node had children and all were rejected
    tested: list[int] = field(default_factory=list)  # nodes put to the accept test, in order
    u: list[float] = field(default_factory=list)  # uniform drawn for each tested node


def accept_greedy(tokens: list[int], parents: list[int], p: torch.Tensor,
                  best: list[int] | None = None) -> TreeVerdict:
    """Longest path that follows the target's argmax. p: (N + 1, V), row 0 = root; best: each
    row's argmax where the caller has them (one pass over the rows, not one a row)."""
    kids = children_of(parents)
    path, node = [], -1
    tested: list[int] = []
    while True:
        best_x = best[node + 1] if best is not None else int(p[node + 1].argmax())
        tested += kids[node]
        nxt = next((c for c in kids[node] if tokens[c] == best_x), None)
        if nxt is None:
            return TreeVerdict(path, best_x, bool(kids[node]), tested, [])
        path.append(nxt)
        node = nxt


def accept_sampled(tokens: list[int], parents: list[int], p: torch.Tensor, q: torch.Tensor | None,
                   generator=None) -> TreeVerdict:
    """Recursive rejection sampling down the tree (see the module docstring).

    p: (N + 1, V) target laws, q: (N + 1, V) draft laws the children of each
    node were drawn from (rows of childless nodes are never read).

    q None: the children were not drawn but copied from text (a suffix tree's), chosen from the
    committed text alone: each child x_i is a draft with one-hot q_i at x_i. Accept it with
    probability p_i(x_i); else p_{i+1} = norm(max(0, p_i - q_i)), p_i with x_i removed. The
    induction above holds with q_i one-hot: a rejected x_i has p_{i+1}(x_i) = 0, and what the
    next sibling is depends on nothing drawn at this node."""
    kids = children_of(parents)
    path, node = [], -1
    tested, us = [], []
    while True:
        p_i = p[node + 1]
        q_i = q[node + 1].clone() if q is not None else None
        nxt = None
        for c in kids[node]:
            x = tokens[c]
            u = float(draw_uniform(1, generator, device=p.device)[0])
            tested.append(c)
            us.append(u)
            if q_i is None:  # one-hot q_i at x
                if u < p_i[x]:
                    nxt = c
                    break
                p_i = p_i.clone()
                p_i[x] = 0
                p_i = p_i / p_i.sum()
                continue
            if q_i[x] > 0 and u * q_i[x] < p_i[x]:
                nxt = c
                break
            p_i = residual(p_i, q_i)
            q_i[x] = 0
            mass = q_i.sum()
            q_i = q_i / mass if mass > 0 else q_i
        if nxt is None:
            return TreeVerdict(path, int(sample(p_i, generator)), bool(kids[node]), tested, us)
        path.append(nxt)
        node = nxt


def describe_tree(tokens: list[int], parents: list[int], q_x: list[float], p_x: list[float],
                  verdict: TreeVerdict, appended: int, texts: list[str] | None = None,
                  appended_text: str = "") -> dict:
    """The small JSON-serialisable tree record a RoundEvent carries (for the
    page's tree view and traces). `appended` is -1 when the run ended first."""
    return {
        "tokens": list(tokens), "parents": list(parents), "depth": depths_of(parents),
        "q": [round(float(v), 6) for v in q_x], "p": [round(float(v), 6) for v in p_x],
        "path": list(verdict.path), "tested": list(verdict.tested), "appended": int(appended),
        "texts": list(texts or []), "appended_text": appended_text,
    }
