"""EAGLE-2's dynamic tree (Li et al. 2024, "EAGLE-2"): the trained EAGLE head (eagle.py) grows a token
tree instead of a chain, and the target verifies all of it in one forward (engine/tree_decoding.py).

The growth is tree.py's (TreeGrower): best-first, always at the node whose next child has the highest
cumulative probability under the head (the product of the head's q along its path), up to a node
budget and γ levels; or sized each round by the measured costs where the budget is auto, the head's
own c pricing a draft forward. Children are drawn without replacement from q when sampling and are
the head's first choices when greedy, as the draft model's tree.

Per level the head runs once over the nodes it expands, each row (e(x_node), f̂_parent) at the
position of its parent, over its own KV: the rows the target confirmed, then the tree's rows under a
tree mask (a node sees the confirmed rows, its ancestors and itself; tree_forward.frontier_bias). A
node's f̂_parent is the state its parent's row predicted (the root's: the last confirmed row's
output), as the chain feeds its own predicted state back.

The target's states: the tree verify forward runs through verify_tree, which hooks the final norm (as
the chain's verify_logits). Its rows are the fed tokens' then the nodes' in node order, not in
sequence order: rollback_tree keeps the fed rows and the accepted path's rows, picked by node index,
as the head's next confirmed rows (every one of them has its next token committed).

EAGLE-1/2 heads only (ours, or a published one through eagle_head): an EAGLE-3 head reads three
layers' states, which this verify does not keep.

Lossless: q is the head's softmax over its kept tokens after the request's warp (0 elsewhere); the
tree verifier's recursive rejection sampling keeps the target's law, and greedy output is plain's."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from ...errors import RequestError
from ..proposer import Option, register, target_vocab
from ..tree_forward import frontier_bias, tree_forward_logits
from .eagle import OPTIONS as CHAIN_OPTIONS
from .eagle import EagleProposer, head_cost, request_drafter
from .tree import OPTIONS as TREE_OPTIONS
from .tree import Tree, TreeGrower, TreeProposal, draft_row


@dataclass
class EagleTreeProposer(TreeGrower, EagleProposer):
    """The chain's head, cache and confirmed rows (EagleProposer); the tree's growth (TreeGrower)."""

    reads_target_cache = False  # the tree verifier keeps the target's cache; verify_tree is handed it
    name: str = "eagle-tree"
    budget: int | None = None  # None: auto (gamma.TreeWidth with the head's c), DEFAULT_BUDGET without
    shape: tuple[int, ...] | None = None  # only the dynamic tree is offered (the builder)
    feats: dict = field(default_factory=dict, repr=False)  # node (-1 root) -> its row's predicted state
    root_at: int = 0  # the position of the last committed token (the root)

    def propose(self, committed, depth, params, generator, eos_ids, width=None) -> TreeProposal:
        if self.pend is None:  # round 1: no states yet, the prompt's forward makes them
            return TreeProposal([], [], torch.zeros(1, target_vocab(self.model)), info={"head_ms": 0.0})
        t0 = time.perf_counter()
        self.kv.crop(self.true_rows)  # the last tree's rows (from predicted states) go
        m = len(self.pend)
        f = self._step(committed[self.pend_at + 1: self.pend_at + m + 1], self.pend, self.pend_at)
        self.true_rows += m
        self.root_at, self.pend = self.pend_at + m, None
        t = Tree()
        self.feats = {-1: f}
        t.rows[-1] = draft_row(self.drafter.lm(f[None])[0], params)
        forwards = 1 + self.grow(t, depth, params, generator, eos_ids, width)
        info = {"head_ms": round((time.perf_counter() - t0) * 1e3, 3)}
        return TreeProposal(t.tokens, t.parents, self.q_rows(t), forwards, t.doubt, info=info)

    def _expand(self, t: Tree, nodes: list[int], params) -> None:
        """One head forward over `nodes` (their ancestors' rows are in its KV): their q rows."""
        n_cache = len(self.kv)
        anc = [[t.slot[a] for a in t.ancestors(i)] for i in nodes]
        feats = torch.stack([self.feats[t.parents[i]] for i in nodes])
        mask = frontier_bias(anc, n_prefix=self.true_rows, n_cache=n_cache)[0, 0].to(feats.device) == 0
        # a node at depth d holds the token at root + d; its row sits at its parent's position
        out = self._rows([t.tokens[i] for i in nodes], feats, [self.root_at + t.depth[i] - 1 for i in nodes],
                         mask)
        rows = draft_row(self.drafter.lm(out), params)  # one LM-head call for the level
        for j, i in enumerate(nodes):
            t.slot[i], t.rows[i], self.feats[i] = n_cache + j, rows[j], out[j]

    def verify_tree(self, model, cache, *, fed, tokens, parents, depths, keep):
        """The tree verify forward (tree_forward_logits), keeping the final norm's output: the
        post-norm states of the rows it read, the nodes' last, in node order."""
        start = cache.get_seq_length()
        with self.states() as boxes:  # EAGLE-1/2 heads only (the builder): the final norm's output,
            logits = tree_forward_logits(model, cache, fed=fed, tokens=tokens, parents=parents,  # taps
                                         depths=depths, keep=keep)
        if boxes[0]:
            # a prompt read in two parts (context_apart: row-exact targets): both parts' rows where
            # both were normed, in order; else the last call's, which end with the N nodes, the rows
            # before them ending at the last fed token
            whole = sum(b.shape[1] for b in boxes[0]) == len(fed) + len(tokens)
            hs = [torch.cat([b[0] for b in box]) if whole else box[-1][0] for box in boxes if box]
            h = torch.cat(hs, -1) if len(hs) == len(boxes) and len({x.shape[0] for x in hs}) == 1 else hs[0]
            n_fed = h.shape[0] - len(tokens)
            self.rows = (h, start + len(fed) - n_fed, n_fed)
        return logits

    def rollback_tree(self, committed, path) -> None:
        """The next confirmed rows: the fed ones', then the accepted path's nodes' (picked by index:
        a node's row is n_fed + its index), each at the position after the one before."""
        if self.rows is None:
            return
        h, first, n_fed = self.rows
        at = torch.tensor([n_fed + i for i in path], dtype=torch.long, device=h.device)
        self.pend, self.pend_at, self.rows = torch.cat([h[:n_fed], h[at]]), first, None


def _summary(infos: list[dict]) -> dict:
    """The run's head time (the chain's confidence stop has no counterpart here)."""
    return {"head_ms": round(sum(i.get("head_ms", 0.0) for i in infos), 1)} if infos else {}


# the tree's node budget (--tree-budget, shared with tree) and the published head option; the chain's
# confidence stop has no tree counterpart (the budget and the best-first order decide where it stops).
# The budget is CLI and API only: the page keys its controls by option name (ui/method_options.KEYS),
# and tree's control has that name already
OPTIONS: tuple[Option, ...] = (*(replace(o, page=False) for o in TREE_OPTIONS if o.name == "tree_budget"),
                               *(o for o in CHAIN_OPTIONS if o.name == "eagle_head"))

# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: where the verify pass pays for every tree node, as on a CPU, whose "
    "matrix products grow with each node (a GPU's verify, bound by launches and weights, barely "
    "notices a few more); and where its head's drafts rarely pass (text unlike the little it was "
    "trained on).")


@register("eagle-tree", "EAGLE head, dynamic tree", loses_when=LOSES, order=22, kind="tree",
          summarize=_summary, cost=head_cost, options=OPTIONS,
          note="EAGLE-2's dynamic tree: the trained EAGLE head grows its most likely branches (γ = depth), "
               "the target checks every node in one pass.",
          description="EAGLE-2: the trained EAGLE head grows a token tree of its most likely branches, "
                      "the target checks them all in one pass (γ = depth)")
def _build_eagle_tree(pair, req=None):
    drafter, options = request_drafter(pair, req, OPTIONS)
    if drafter.taps is not None:
        raise RequestError("The EAGLE tree runs EAGLE-1/2 heads only (they read the target's last state, "
                           "which the tree's verify keeps); this is an EAGLE-3 head: use the method eagle.")
    return EagleTreeProposer(pair.target, drafter, budget=options["tree_budget"])

