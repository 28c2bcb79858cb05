"""Events: the one seam between the decoding engines and everything that shows
or records a run (UI, CLI, bench, traces, tests).

Times are seconds since the start of the run, read with time.perf_counter()
after synchronising the device, so they are real elapsed time.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """What happened to a token. Names and colours are defined here once."""

    TARGET = "target"  # plain decoding: sampled from the target
    ACCEPTED = "accepted"  # drafted and kept by the target
    REJECTED = "rejected"  # drafted and refused (not part of the output)
    RESAMPLED = "resampled"  # drawn from norm(max(0, p - q)) after a rejection
    BONUS = "bonus"  # drawn from the target after all drafts were accepted


# Okabe-Ito palette: distinguishable with the common colour-vision deficiencies.
# Each outcome also has a non-colour cue (see ui/render.py).
OUTCOME_COLOURS = {
    Outcome.TARGET: "#999999",
    Outcome.ACCEPTED: "#009E73",  # bluish green
    Outcome.REJECTED: "#D55E00",  # vermillion
    Outcome.RESAMPLED: "#0072B2",  # blue
    Outcome.BONUS: "#E69F00",  # orange
}

OUTCOME_LABELS = {
    Outcome.TARGET: "target token (plain decoding)",
    Outcome.ACCEPTED: "accepted draft token",
    Outcome.REJECTED: "rejected draft token (not kept)",
    Outcome.RESAMPLED: "resampled from the residual after a rejection",
    Outcome.BONUS: "bonus token (all drafts accepted)",
}

# ANSI styles for the terminal: colour plus a non-colour cue
OUTCOME_ANSI = {
    Outcome.TARGET: "",
    Outcome.ACCEPTED: "\x1b[32m",
    Outcome.REJECTED: "\x1b[31;9m",  # red, struck through
    Outcome.RESAMPLED: "\x1b[34;4m",  # blue, underlined
    Outcome.BONUS: "\x1b[33;1m",  # yellow, bold
}


@dataclass
class TokenEvent:
    """One token as it appeared in a run (rejected draft tokens included)."""

    token_id: int
    text: str
    outcome: Outcome
    t: float  # seconds since run start when the token became known
    round: int = -1  # speculative round index, -1 for plain decoding
    position: int = 0  # draft position 1..γ in the round; 0 for appended tokens
    p: float | None = None  # target probability of this token
    q: float | None = None  # draft probability of this token
    u: float | None = None  # uniform drawn for the accept test
    # greedy runs: the target's top-2 logit gap at this position, from the run's
    # own logits (tells a numerical near-tie from a bug, see run/equality.py)
    gap: float | None = None

    @property
    def in_output(self) -> bool:
        return self.outcome is not Outcome.REJECTED


@dataclass
class RoundEvent:
    """One speculative round: γ drafts, one verification, one appended token."""

    index: int
    gamma: int  # tokens drafted this round
    draft_ids: list[int]
    q: list[float]  # q(x) of each drafted token
    p: list[float]  # p(x) of each drafted token
    u: list[float]  # uniforms used (tested positions only)
    overlap: list[float]  # Σ min(p, q) at each drafted position
    n_accepted: int
    appended_id: int
    resampled: bool  # False: bonus
    t_start: float
    t_draft: float  # seconds spent drafting this round
    t_verify: float  # seconds spent in the target forward + accept test
    t_end: float
    draft_forwards: int  # draft forward passes this round
    tokens: list[TokenEvent] = field(default_factory=list)  # in display order
    # running totals after this round
    total_tokens: int = 0
    total_drafted: int = 0
    total_accepted: int = 0
    target_forwards: int = 0
    prompt_tokens: int = 0  # >0: this forward also read the prompt (round 1): its time is prefill
    info: dict = field(default_factory=dict)  # method-specific, JSON-able (n-gram won, lookup hits, ...)
    # the p/q inspector (engine/topk_view.py): top-k of p and q per position, never the full vocabulary
    dists: list[dict] = field(default_factory=list)  # rows 0..γ-1: drafted positions; row γ: appended
    residual: dict | None = None  # top-k of norm(max(0, p - q)) at the rejected position, if any
    # tree methods only (JSON-ready, see tree_sampling.describe_tree): node tokens, parents,
    # depth, q, p, accepted path, tested nodes, appended token; None for chain methods
    tree: dict | None = None

    @property
    def n_new(self) -> int:
        return sum(1 for t in self.tokens if t.in_output)


@dataclass
class RunSummary:
    """Totals of a finished (or stopped) run. Every field is measured."""

    side: str  # "baseline" | "speculative"
    method: str  # proposer name for speculative, "plain" for baseline
    token_ids: list[int]
    text: str
    n_tokens: int
    elapsed: float  # first forward to last token, seconds
    prefill: float  # seconds spent on the prompt before the first token
    target_forwards: int
    stop_reason: str  # "eos" | "max_new_tokens" | "stopped" | "error"
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_time: float = 0.0
    verify_time: float = 0.0
    draft_forwards: int = 0
    overlap_sum: float = 0.0  # Σ over drafted positions of Σ_x min(p, q)
    gamma: int = 0
    device: str = "cpu"
    prompt_rounds: int = 0  # rounds whose target forward also read the prompt (timed as prefill)
    engine: str = "specviz"  # or "vllm" (hosting/vllm.py)
    unmeasured: list = field(default_factory=list)  # Stats fields this engine cannot measure (n/a, not 0)
    extra: dict = field(default_factory=dict)  # engine-specific facts (vLLM: per-position acceptance)
    gamma_policy: str = ""  # "auto" when a γ policy chose each round (gamma is then its cap)

    @property
    def timed_rounds(self) -> int:
        """Rounds in draft_time / verify_time."""
        return self.rounds - self.prompt_rounds

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.elapsed if self.elapsed > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_s"] = self.tokens_per_s
        return d


def commit_round(s: RunSummary, new: list[int], *, drafted: int, accepted: int, draft_forwards: int,
                 overlap_sum: float, prompt_tokens: int, t_draft: float, t_verify: float, t_end: float,
                 hit_eos: bool = False) -> None:
    """The one ledger: add a verified round to its run's books. Every engine commits its
    rounds here, and the page (ui/state.py) replays the RoundEvents through it (book_round)
    instead of recounting. A round whose forward also read the prompt (prompt_tokens > 0)
    is timed as prefill, not in the draft/verify split."""
    s.token_ids += new
    s.target_forwards += 1
    s.rounds += 1
    s.drafted += drafted
    s.accepted += accepted
    if prompt_tokens:
        s.prefill = t_end
        s.prompt_rounds += 1  # its draft forwards count with the prefill too
    else:
        s.draft_forwards += draft_forwards
        s.draft_time += t_draft
        s.verify_time += t_verify
    s.overlap_sum += overlap_sum
    if hit_eos:
        s.stop_reason = "eos"


def round_tokens(stream, t: float, r: int, accepted: list[tuple[int, dict]],
                 rejected: tuple[int, int, dict] | None, appended: tuple[int, Outcome, dict] | None,
                 ) -> list[TokenEvent]:
    """A round's TokenEvents in display order, for every engine: the accepted drafts
    (positions 1..), the first rejected draft (x, position, fields; shown struck, not in
    the text), then the target's own token (resampled or bonus, position 0).
    `stream` is the run's TextStream; fields are TokenEvent's p, q, u, gap."""
    tokens = [TokenEvent(x, stream.push(x), Outcome.ACCEPTED, t, r, i + 1, **f)
              for i, (x, f) in enumerate(accepted)]
    if rejected is not None:
        x, pos, f = rejected
        tokens.append(TokenEvent(x, stream.token_text(x), Outcome.REJECTED, t, r, pos, **f))
    if appended is not None:
        x, kind, f = appended
        tokens.append(TokenEvent(x, stream.push(x), kind, t, r, 0, **f))
    return tokens


def book_round(s: RunSummary, ev: RoundEvent) -> None:
    """Commit a RoundEvent to a summary being rebuilt from events (the page's running totals)."""
    commit_round(s, [t.token_id for t in ev.tokens if t.in_output], drafted=ev.gamma,
                 accepted=ev.n_accepted, draft_forwards=ev.draft_forwards, overlap_sum=sum(ev.overlap),
                 prompt_tokens=ev.prompt_tokens, t_draft=ev.t_draft, t_verify=ev.t_verify, t_end=ev.t_end)


def event_time(ev) -> float:
    """When an event became visible, in seconds on its run's clock."""
    if isinstance(ev, TokenEvent):
        return ev.t
    if isinstance(ev, RoundEvent):
        return ev.t_end
    return ev.elapsed
