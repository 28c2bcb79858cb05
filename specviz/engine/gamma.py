"""γ policies: how many tokens to draft next round (the draft length), at most
the policy's cap (the request's γ under "auto").

`auto` picks, each round, the γ that maximises theory.speedup, expected tokens
per unit of target time, with the *measured* costs of this pair on this machine:
c = draft step / plain target step and v(γ) = verify forward of γ+1 tokens /
plain target step, both from calibration (pair.costs, engine/costs.py); α̂ is
the running Σ min(p, q) over the positions the target actually tested.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .theory import ALPHA_MAX, MAX_GAMMA, best_gamma

AUTO = "auto"
DEFAULT_GAMMA = 4  # without measured costs (tiny/test pairs) auto is a plain fixed γ=4
# before any round: acceptance of a same-family draft model is typically
# 0.6-0.8 (α̂ 0.71 on the default pair, code prompts); the prior weighs as much
# as 4 tested positions, so the first rounds move it quickly
PRIOR_ALPHA = 0.6
PRIOR_WEIGHT = 4.0
# forgetting per tested position: acceptance changes along a text (code body
# vs prose); a memory of ~33 positions (~10 rounds) still averages out 0/1 noise
DECAY = 0.97
@dataclass
class AutoGamma:
    """The measured-cost γ policy. next_gamma(cap) before a round, observe() after it."""

    c: float  # draft step / plain step (0 for a proposer without a model)
    verify_cost: Callable[[int], float]  # v(γ), e.g. CostModel.verify_cost
    max_gamma: int = MAX_GAMMA
    s: float = PRIOR_ALPHA * PRIOR_WEIGHT  # discounted Σ min(p, q)
    n: float = PRIOR_WEIGHT  # discounted count of tested positions
    name: str = "auto"

    @property
    def alpha_hat(self) -> float:
        return self.s / self.n

    def next_gamma(self, cap: int) -> int:
        alpha = min(self.alpha_hat, ALPHA_MAX)
        return best_gamma(alpha, self.c, self.verify_cost, max(1, min(cap, self.max_gamma)))

    def observe(self, overlap: list[float], n_accepted: int) -> None:
        # positions after the first rejection were never tested and were read
        # after a wrong token: they say little about the real text
        tested = overlap[: n_accepted + 1]
        keep = DECAY ** len(tested)
        self.s = keep * self.s + sum(tested)
        self.n = keep * self.n + len(tested)


@dataclass
class OwnGamma:
    """γ = auto for a proposer that prices each round's length itself: the cap, as given."""

    name: str = "auto"

    def next_gamma(self, cap: int) -> int:
        return cap

    def observe(self, overlap: list[float], n_accepted: int) -> None:
        pass


@dataclass
class FixedGamma:
    """What auto falls back to without measured costs: a fixed γ, said plainly."""

    gamma: int = DEFAULT_GAMMA
    name: str = f"fixed γ={DEFAULT_GAMMA} (no measured costs)"

    def next_gamma(self, cap: int) -> int:
        return max(1, min(cap, self.gamma))

    def observe(self, overlap: list[float], n_accepted: int) -> None:
        pass


def make_policy(costs, *, needs_draft: bool, max_gamma: int = MAX_GAMMA,
                c: float | None = None) -> AutoGamma | FixedGamma:
    """The auto-γ policy for a pair's CostModel (None: no calibration, fixed default).
    A proposer without a draft model (prompt lookup) drafts for ~free: c = 0; `c`: a method's own
    measured draft cost (a trained head's, MethodSpec.cost)."""
    if costs is None or (needs_draft and costs.c is None):
        return FixedGamma()
    if c is None:
        c = costs.c if needs_draft else 0.0
    return AutoGamma(c, monotone(costs.verify_cost, max_gamma), max_gamma)


def monotone(verify_cost: Callable[[int], float], max_gamma: int = MAX_GAMMA) -> Callable[[int], float]:
    """v(γ) made non-decreasing (running max): verifying more tokens never costs
    less, and a dip in a noisy measured curve (v(6) < v(4) under load) would
    otherwise pull γ to it."""
    env, top = {}, 0.0
    for g in range(1, max_gamma + 1):
        top = env[g] = max(top, verify_cost(g))
    return lambda g: env[min(max(g, 1), max_gamma)]


# A tree's width: its r-th child of a node (r = 1 the draft's first choice) is accepted, once its
# elder siblings were not, at a rate learned per r; priors weigh as PRIOR_WEIGHT positions
MAX_ORDER = 4
PRIOR_ORDER = (PRIOR_ALPHA, 0.5, 0.3, 0.2)
MAX_TREE = MAX_GAMMA  # nodes of an auto-sized tree, at most (v is measured up to 16 drafts)


@dataclass
class TreeWidth:
    """Sizes a dynamic tree each round from measured costs (a "budget" of auto): the next node is
    drawn only while its expected tokens pay for what it adds to the round's cost.

    A round of n nodes and F draft forwards costs C = c·F + v(n) plain steps and yields
    E = 1 + Σ P(node accepted) tokens; a node (or a forward that opens a new layer) is added while
    its gain ÷ its cost ≥ E ÷ C. P(node accepted) multiplies, down its path, the chance that each
    node's parent's first child fails, m(w) = (1 - a₁) · δ(w) / δ̄ (δ(w) = 1 - max q at w, δ̄ its
    running mean: the draft's own doubt, scaled to the learned miss rate), and the learned a_r.
    Why the doubt: on the default pair, code prompts, the target's choice was the draft's first
    where max q ≥ 0.9 in 99 % of rows and in 50 % where max q < 0.5 (docs/why.md#tree-width)."""

    c: float
    verify_cost: Callable[[int], float]  # v(n), non-decreasing (monotone())
    s: list = field(default_factory=lambda: [a * PRIOR_WEIGHT for a in PRIOR_ORDER])
    n: list = field(default_factory=lambda: [PRIOR_WEIGHT] * MAX_ORDER)
    doubt_s: float = (1 - PRIOR_ALPHA) * PRIOR_WEIGHT
    doubt_n: float = PRIOR_WEIGHT

    def rate(self, r: int) -> float:
        """a_r: the r-th child's acceptance once the first r - 1 failed (1-based)."""
        return min(self.s[r - 1] / self.n[r - 1], ALPHA_MAX)

    def miss(self, doubt: float) -> float:
        """m(w): P(the first child at a row of this doubt fails)."""
        mean = self.doubt_s / self.doubt_n
        return min(1.0, (1 - self.rate(1)) * doubt / mean) if mean > 0 else 1 - self.rate(1)

    def child_share(self, doubt: float, r: int) -> float:
        """P(the r-th child is the accepted one | its parent is reached)."""
        m = self.miss(doubt)
        if r == 1:
            return 1 - m
        out = m * self.rate(r)
        for j in range(2, r):
            out *= 1 - self.rate(j)
        return out

    def pays(self, gain: float, cost: float, tokens: float, steps: float) -> bool:
        """Whether gain tokens for cost more steps raise tokens ÷ steps."""
        return gain * steps >= tokens * cost

    def row_cost(self, n: int) -> float:
        """What one more node adds to a verify of n drafts."""
        return self.verify_cost(n + 1) - self.verify_cost(n)

    def observe(self, rows: list[tuple[float, list[bool]]]) -> None:
        """rows: (δ, outcomes by order) for each row whose children were put to the test; a greedy
        row gives the outcomes up to the rank of the target's choice, the tree or not."""
        for doubt, outcomes in rows:
            self.doubt_s = DECAY * self.doubt_s + doubt
            self.doubt_n = DECAY * self.doubt_n + 1
            for r, ok in enumerate(outcomes[:MAX_ORDER]):
                self.s[r] = DECAY * self.s[r] + float(ok)
                self.n[r] = DECAY * self.n[r] + 1


def make_width(costs, *, auto: bool, c: float | None = None) -> TreeWidth | None:
    """The tree's width rule where its budget is auto and this pair's costs were measured; c: a
    draft forward's cost where it is not the draft model's (costs.c), e.g. a trained head's."""
    c = costs.c if c is None and costs is not None else c
    if not auto or costs is None or c is None:
        return None
    return TreeWidth(c, monotone(costs.verify_cost, MAX_GAMMA))


# A draft token's acceptance by the draft's own confidence (max softmax probability of its row):
# buckets from these edges, priors from the default pair at w4a8 on the Zen 4 EPYC (2026-11-27,
# 13 bench prompts of code, chat, grounded and edit, greedy, 869 positions): 0.55 below 0.3,
# 0.53 to 0.5, 0.61 to 0.7, 0.88 to 0.9, 0.95 to 0.97, 0.997 above
CONF_EDGES = (0.3, 0.5, 0.7, 0.9, 0.97)
CONF_PRIOR = (0.5, 0.5, 0.6, 0.85, 0.95, 0.99)
CONF_MAX = 0.99  # a learned rate of 1 would make every further draft look free


def conf_bucket(conf: float) -> int:
    return sum(1 for e in CONF_EDGES if conf >= e)


@dataclass
class ChainLength:
    """Sizes a draft model's chain token by token from measured costs: after each drafted token,
    draft another only while it raises the round's expected tokens per plain-step cost,
    E ÷ (n·c + v(n)). E = 1 + Σ P(the first i drafts all accepted); a draft's acceptance is learned
    per confidence bucket from the positions the target tested, and the last token's rate stands
    in for the next one's (its confidence is known only once it is drafted). The stop depends
    only on what was drafted and on earlier rounds, so verification stays exact.
    Why: a fixed γ drafts past an unsure token and stops short of a sure run. Simulated on the
    bench's 13 prompts with calibrated costs (2026-11-27, Zen 4), the priced chain gave code
    2.10× against fixed γ's best 1.98× (γ 4), and 1.49× against 1.46× with AVX2 forced."""

    c: float
    verify_cost: Callable[[int], float]  # v(n), non-decreasing (monotone())
    hits: list = field(default_factory=lambda: [p * PRIOR_WEIGHT for p in CONF_PRIOR])
    seen: list = field(default_factory=lambda: [PRIOR_WEIGHT] * len(CONF_PRIOR))

    def rate(self, conf: float) -> float:
        b = conf_bucket(conf)
        return min(self.hits[b] / self.seen[b], CONF_MAX)

    def start(self) -> None:
        self.confs, self.reach, self.tokens = [], 1.0, 1.0

    def more(self, conf: float, cap: int) -> bool:
        """After a drafted token of this confidence: is one more worth its draft step and row?"""
        self.confs.append(conf)
        n, a = len(self.confs), self.rate(conf)
        self.reach *= a
        self.tokens += self.reach
        if n >= cap:
            return False
        cost = self.c + self.verify_cost(n + 1) - self.verify_cost(n)
        return self.reach * a * (n * self.c + self.verify_cost(n)) >= cost * self.tokens

    def observe(self, n_accepted: int) -> None:
        """The drafted positions the target tested: the accepted ones and the first refused."""
        for i, conf in enumerate(self.confs[: n_accepted + 1]):
            b = conf_bucket(conf)
            self.hits[b] = DECAY * self.hits[b] + float(i < n_accepted)
            self.seen[b] = DECAY * self.seen[b] + 1
        self.confs = []
