"""Hybrid: each round, the cheaper drafter by its expected tokens per measured cost.

The suffix draft is looked up first (microseconds, no model). It is taken when its
expected tokens per plain-step cost, (1 + E[accepted]) / v(k), beat the draft
model's chain, E[tokens](α̂, γ) / (γ·c + v(γ)); then the draft model does not run.
It catches up on the committed tokens in one multi-row forward the next time it
drafts, and that forward is timed in that round's draft time (so in c). In its own
rounds the draft model's chain is sized token by token (gamma.ChainLength): one more
token while its expected gain, by the last token's confidence, pays for a draft step
and a verify row. With measured costs the draft model does not read the prompt at
reset: a later model round reads it (and all since) once that read, spread over the
model rounds it would serve, still pays (catch_up_pays); where copied text serves
(edits), the draft model never reads it.

Both prices use costs measured at load (pair.costs: c, v(k)); α̂ is the draft model's
running acceptance over the positions the target tested in its own rounds, and the
suffix calibration is read from committed tokens (suffix.py). The choice depends on
committed history only, and each drafter's proposal keeps the target's law, so the
output law is the target's (chi-square tests in tests/test_suffix.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..gamma import AutoGamma, ChainLength
from ..proposer import Proposer, register, target_vocab
from ..theory import ALPHA_MAX, MAX_GAMMA, expected_tokens
from .draft import DraftModelProposer, _need_draft
from .suffix import SuffixProposer, SuffixTreeProposer, build_suffix, round_note, summarize

# rounds before a lagging draft model may read the prompt: round 1 shows whether copied text serves.
# Measured 2026-11-28 (default pair w4a8, 2-core Xeon AVX512-VNNI, 3 interleaved repeats, end to end):
# edit (161-258 token prompts, 128 tokens) 2.53x plain against 2.26x reading the prompt at reset (the
# draft model then ran in 0 rounds of 14-28; it had run in 1-6 of 14-16); chat 1.24x both; code (64
# tokens) 1.58x against 1.61x, the draft reading at round 2-3. Waiting 3 rounds: chat 1.18x against 1.27x
# Reading at round 1 when there is nothing to copy (09:49 UTC, same machine, 3 interleaved repeats):
# code 1.51x against 1.50x, chat 1.25x against 1.27x, and the first token 0.2 s later: not kept
EVIDENCE = 1


@dataclass
class HybridProposer(Proposer):
    suffix: SuffixProposer
    draft: DraftModelProposer
    c: float | None = None  # draft step ÷ plain step, measured at load (None: suffix whenever it drafts)
    lazy: bool = True  # with measured costs, the draft model reads the prompt only once a round needs it
    name: str = "hybrid"
    chain_formula = False  # rounds of two kinds: no one chain prediction (decoding.speculative)

    def reset(self, prompt_ids):
        self.suffix.reset(prompt_ids)
        # the draft model's α̂ and best γ, as auto γ keeps them (fed from its own rounds only)
        v = self.suffix.verify_cost
        self.policy = AutoGamma(self.c, v) if v is not None and self.c is not None else None
        self.draft.length = ChainLength(self.c, v) if self.policy is not None else None
        self._model_round, self._waits, self._rounds, self._wanted, self._lag = False, False, 0, 0, 0
        if self.policy is not None and self.lazy:
            return self.draft.open()  # the prompt is read by the first model round priced in
        return self.draft.reset(prompt_ids)

    def model_price(self, cap: int) -> tuple[int, float, float]:
        """(γ, expected tokens, plain-step cost) of the draft model's best chain."""
        if self.policy is None:
            return cap, 0.0, 1.0
        g = self.policy.next_gamma(cap)
        alpha = min(self.policy.alpha_hat, ALPHA_MAX)
        return g, expected_tokens(alpha, g), g * self.c + self.suffix.verify_cost(g)

    def read_cost(self, n: int) -> float:
        """The draft reading n lagging tokens in one forward, in plain target steps: c times the
        target's measured n-token forward, a line past the 17 measured (an estimate for this
        choice only; the read itself is timed in its round's draft time)."""
        v, half = self.suffix.verify_cost, MAX_GAMMA // 2
        if n <= MAX_GAMMA + 1:
            return self.c * v(n - 1)
        return self.c * (v(MAX_GAMMA) + (n - MAX_GAMMA - 1) * (v(MAX_GAMMA) - v(half)) / half)

    def catch_up_pays(self, tokens: float, cost: float, fallback: float) -> bool:
        """Whether a lagging draft model should read what it skipped now. Its read is spread over
        the model rounds it would serve: the rest of the run's tokens times the share of rounds
        so far whose model chain outpriced the suffix draft, over the chain's expected tokens. The
        first EVIDENCE rounds never read: they show whether copied text will serve."""
        if self._rounds <= EVIDENCE or not self.remaining:
            return False
        serves = max(1.0, self._wanted / self._rounds * self.remaining / max(tokens, 1.0))
        return tokens / (cost + self.read_cost(self._lag) / serves) >= fallback

    def price(self, k: int, rate_s: float, cap: int, committed) -> int | None:
        """The round's drafter: None for the suffix draft (or a plain step), else the draft model's γ."""
        g, tokens, cost = self.model_price(cap)
        self._rate_m = tokens / cost  # 0 without measured costs (model_price: 0 tokens)
        self._model_round = not (k and rate_s >= self._rate_m)
        self._rounds += 1
        self._wanted += self._model_round
        # the prompt not read yet (lazy): the read is priced in; later lags (the tokens of copied
        # rounds, read with the next chain) are left to the model round as before
        self._lag = self.draft.lag(committed) if self.policy is not None and self.draft.unread() else 0
        self._waits = False
        if self._model_round and self._lag:
            self._model_round = self.catch_up_pays(tokens, cost, rate_s if k else 1.0)
            self._waits = not self._model_round
        if self.draft.length is not None:
            g = cap  # the chain prices each further token itself (gamma.ChainLength), up to the cap
        return g if self._model_round else None

    def annotate(self, prop, d, k: int, rate_s: float, n: int, t0: float):
        """The round's info: a model round's lookup (a suffix round's is emit's), both prices, and
        what the chosen drafter's n tokens were priced at in plain steps."""
        v = self.suffix.verify_cost
        if self._model_round:
            prop.info = {"drafter": "model", "source": None, "match_len": d.match_len if d else 0,
                         "score": round(d.score, 3) if d else 0.0,
                         "lookup_ms": round((t0 - self._t_lookup) * 1e3, 3)}
            cost = n * self.c + v(n) if v is not None and self.c is not None else None
        else:
            cost = v(n) if v is not None else None
        if self._lag and (self._model_round or self._waits):  # it reads what it skipped, or waits
            prop.info["draft_read" if self._model_round else "draft_waits"] = self._lag
        prop.info.update(rate_suffix=_r(rate_s if k else None),
                         rate_model=_r(self._rate_m if self.c else None), cost_steps=_r(cost))
        return prop

    def propose(self, committed, gamma, params, generator, eos_ids):
        self._t_lookup = t0 = time.perf_counter()
        sp = self.suffix
        d, where = sp.lookup(committed, gamma)
        k, rate_s = sp.expected_rate(d)
        g = self.price(k, rate_s, gamma, committed)
        if g is None:
            prop = sp.emit(d, where, k, committed, eos_ids, t0)
        else:  # the suffix draft still learns its calibration from what gets committed
            t0 = time.perf_counter()  # the lookup's end
            prop = self.draft.propose(committed, g, params, generator, eos_ids)
        return self.annotate(prop, d, k, rate_s, len(prop.tokens), t0)

    def rollback(self, committed, n_accepted, n_drafted):
        self.draft.rollback(committed, n_accepted, n_drafted)  # a lagging cache is left as it is
        if not (self._model_round and n_drafted and self.policy is not None):
            return
        self.draft.length.observe(n_accepted)  # set beside policy (reset)
        # a one-hot (greedy) or drawn draft: the positions tested, 1 for kept, 0 for the first refused
        tested = min(n_drafted, n_accepted + 1)
        self.policy.observe([1.0] * n_accepted + [0.0] * (tested - n_accepted), n_accepted)


@dataclass
class HybridTreeProposer(HybridProposer):
    """Tree mode: each round the suffix tree's token tree (copied children, one-hot drafts) or the
    draft model's chain, given to the tree verifier as a one-branch tree with its q rows; priced
    as the chain hybrid prices its two drafters."""

    name: str = "hybrid-tree"
    shape: tuple = ()  # the tree prices its own size: no auto width (runner.tree_width)
    budget: int = MAX_GAMMA

    def propose(self, committed, depth, params, generator, eos_ids, width=None):
        from .tree import TreeProposal
        self._t_lookup = t0 = time.perf_counter()
        sp = self.suffix
        d, k, rate_s = sp.tree_lookup(committed, depth)
        g = self.price(k, rate_s, depth, committed)
        if g is None:
            prop = sp.tree_emit(d, k, committed, t0)
        else:
            t0 = time.perf_counter()  # the lookup's end
            chain = self.draft.propose(committed, g, params, generator, eos_ids)
            n = len(chain.tokens)
            # row i: node i's child law (the zero row on q's device: a GPU's draft)
            q = torch.cat([chain.q, chain.q.new_zeros(1, chain.q.shape[-1])])
            prop = TreeProposal(chain.tokens, list(range(-1, n - 1)), q, chain.forwards)
        self._drafted = len(prop.tokens)
        return self.annotate(prop, d, k, rate_s, len(prop.tokens), t0)

    def rollback_tree(self, committed, path):
        self.rollback(committed, len(path), self._drafted)


def _r(x):
    return None if x is None or x == float("inf") else round(float(x), 3)


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: where nothing repeats for the suffix draft to copy and the draft model "
    "itself loses (slow, or often wrong).")


@register("hybrid", "hybrid: suffix or draft model", needs_draft=True, order=5, own_gamma=True,
          loses_when=LOSES, summarize=summarize, round_note=round_note,
          description="each round, a free suffix-tree draft when its expected tokens per measured verify "
                      "cost beat the draft model's chain; else the draft model")
def _build_hybrid(pair, req=None, cls=HybridProposer, suffix_cls=None):
    costs = pair.costs
    return cls(build_suffix(pair, req, cls=suffix_cls),
                          DraftModelProposer(_need_draft(pair), vocab_size=target_vocab(pair.target)),
                          c=costs.c if costs is not None else None)


@register("hybrid-tree", "hybrid, tree mode", needs_draft=True, order=12, own_gamma=True, kind="tree",
          loses_when=LOSES, summarize=summarize, round_note=round_note,
          description="each round the suffix tree's token tree or the draft model's chain, whichever the "
                      "measured costs price higher, verified by the tree verifier")
def _build_hybrid_tree(pair, req=None):
    return _build_hybrid(pair, req, cls=HybridTreeProposer, suffix_cls=SuffixTreeProposer)
