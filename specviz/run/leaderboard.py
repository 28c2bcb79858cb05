"""Race all methods: one prompt, each method raced beside plain decoding, then a
leaderboard built only from the runs' own events.

    board = new_board(pair, req, ["draft", "auto", "tree"])
    for key, side, ev in race_methods(pair, req, prompt_ids, board):
        ...                      # (key, START/END, None) marks a race's start and end
    board.rows()                 # tok/s, × plain, τ, α̂, c, v, identical check; fastest first

Fairness: each method races plain decoding in fair mode (specviz.run.race, both
sides): one engine thread steps whichever side has fewer tokens out (pace
"tokens"), a step at a time under isolation.timed_step(), so both sides run
and end in the same moments of the machine and each × plain is a ratio of the
same moments (issue 59: a CPU loop 3 s on, 3 s off bent the older "plain just
before and just after" ratio of a method that accepted nothing to 1.34× and
0.46×; stepped by the virtual clock, as the page's two-sided race is, plain ran
its last part alone and the draft's ratio read 1.83-2.58× against 2.04× quiet).
Work the consumer does between events (rendering) is not counted. Each run's
CPU time (VirtualClock.cpu) is kept beside its wall time: where the two ratios
part by more than 15 %, the row says the machine was disturbed. A method with
τ 1.00 never ranks above plain.

Every number in a row comes from run_stats() on the run's own RunSummary and
the plain run raced beside it, the same function the page and the CLI use for
a single run (so the speedup box of a picked run shows the row's ratio);
nothing is estimated. No gradio or plotly here: the page (ui/leaderboard.py),
the CLI (cli/leaderboard.py) and the bundle (run/race_bundle.py) consume this.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

from ..engine.events import RoundEvent, RunSummary, TokenEvent
from ..engine.metrics import cpu_speedup, cpu_wall_note, run_stats
from ..engine.pair import dtype_of
from ..engine.proposers import REGISTRY
from ..errors import ModelError, RequestError, first_line, free_memory, is_oom
from .equality import compare_greedy, output_tokens
from .trace import Trace, trace_costs, trace_for

PLAIN = "plain"  # the key of the plain decoding row (its runs are raced beside each method)
# τ below this shows as 1.00: no more tokens per target forward than plain decoding
TAU_PLAIN = 1.005
# a bundle recorded before 2026-11-28 timed plain apart from each method: below this τ its × plain
# is within what a drifting machine bends (issue 59: 1.34× for τ 1.00), so it never ranks above plain
TAU_CLEAR = 1.5
PARTIAL = ("stopped", "error")  # stop reasons of a run that did not reach its end
NOT_RUN = "stopped before it ran"  # a contender's reason after Stop
START, END = "start", "end"  # markers: (key, START, None) before a run, (key, END, None) after it


@dataclass(frozen=True)
class Entry:
    """One contender: a registered method, at the race's γ or with γ chosen each round."""

    key: str
    method: str
    auto: bool = False

    @property
    def label(self) -> str:
        name = REGISTRY[self.method].label if self.method in REGISTRY else self.method
        return f"{name}, auto γ" if self.auto else name


# what the visitor may tick, in menu order; "auto" is the draft model with auto γ
_EXTRA = {"auto": Entry("auto", "draft", True)}
DEFAULT_KEYS = ("draft", "auto", "tree", "hybrid", "suffix", "staged", "lookup", "lookahead", "rest")
# the method flags of the CLI / page (cli.METHOD_FLAGS) and the one method each belongs to
OPTION_METHOD = {"window": "lookahead", "guesses": "lookahead", "datastore": "rest", "tree_shape": "tree",
                 "tree_budget": "tree", "exit_layer": "early-exit", "skip_layers": "layer-skip"}


def all_keys() -> tuple[str, ...]:
    """Every contender this build offers: the defaults first, then the other registered methods."""
    rest = sorted((m for m in REGISTRY if m not in DEFAULT_KEYS), key=lambda m: REGISTRY[m].order)
    return tuple(k for k in DEFAULT_KEYS if k in _EXTRA or k in REGISTRY) + tuple(rest)


def entry(key: str) -> Entry:
    if key in _EXTRA:
        return _EXTRA[key]
    if key in REGISTRY:
        return Entry(key, key)
    raise RequestError(f"Unknown method {key!r} for the race: choose from {', '.join(all_keys())}.")


def parse_keys(keys) -> list[str]:
    """A list or a comma-separated string of keys, checked, duplicates dropped, order kept."""
    if isinstance(keys, str):
        keys = [k.strip() for k in keys.split(",")]
    out = []
    for k in keys or ():
        if k and k not in out:
            entry(k)
            out.append(k)
    if not out:
        raise RequestError("Tick at least one method to race against plain decoding.")
    return out


def method_request(req, e: Entry, options: dict | None = None):
    """The race's request for one contender: same prompt, budget, sampling and seed;
    its own method, γ ("auto" for the auto-γ entry) and only its own settings."""
    from .request import make_request
    own = {k: v for k, v in (options or {}).items() if OPTION_METHOD.get(k) == e.method and v is not None}
    return make_request(req.prompt, method=e.method, gamma="auto" if e.auto else req.gamma,
                        max_new_tokens=req.max_new_tokens, temperature=req.temperature, top_p=req.top_p,
                        top_k=req.top_k, seed=req.seed, chat_template=req.chat_template, options=own)


# ------------------------------------------------------------------ the board


def _summary(events) -> RunSummary | None:
    return next((e for e in reversed(events) if isinstance(e, RunSummary)), None)


def _whole(s: RunSummary | None) -> bool:
    return s is not None and s.stop_reason not in PARTIAL


@dataclass
class MethodRun:
    entry: Entry
    settings: dict = field(default_factory=dict)  # asdict(RunRequest) of this run
    events: list = field(default_factory=list)  # its speculative events, RunSummary last
    error: str = ""  # why it has no result ("greedy only", "stopped before it ran", ...)
    plain: list = field(default_factory=list)  # plain decoding raced beside it, RunSummary last

    @property
    def summary(self) -> RunSummary | None:
        return _summary(self.events)

    @property
    def plain_summary(self) -> RunSummary | None:
        return _summary(self.plain)


@dataclass
class Row:
    """One line of the leaderboard; None where a number does not apply or was not measured."""

    key: str
    label: str
    gamma: str  # "4", "auto" or "–" (plain)
    tokens_per_s: float | None
    speedup: float | None  # × plain: tokens/s ÷ tokens/s of plain decoding raced beside it
    tau: float | None  # output tokens per target forward
    alpha_hat: float | None
    c: float | None
    v: float | None  # a verify pass in plain target steps, measured in this run
    identical: str  # "identical" | "near-tie" | "mismatch" | "n/a (sampled)" | "reference" | "–"
    n_tokens: int = 0
    elapsed: float = 0.0
    stop_reason: str = ""
    error: str = ""
    detail: str = ""  # the greedy check's message
    plain_tokens_per_s: float | None = None  # what × plain divided by (plain raced beside it)
    plain_how: str = ""  # how that figure was taken, in words
    flag: str = ""  # why × plain may mislead here (τ 1.00 above plain, a disturbed machine), or ""
    cpu_speedup: float | None = None  # × plain by CPU time (process time of each side's steps)
    paired: bool = True  # False: a race recorded before 2026-11-28, plain timed apart from it

    @property
    def plain_then(self) -> str:
        """The "plain then" column: the plain tokens/s this row divides by; the plain row: all of
        them, lowest-highest (issue 51's tiny race on a busy machine: 30.57-115.59)."""
        if self.key == PLAIN and self.plain_how.startswith("timed ") and ": " in self.plain_how:
            return self.plain_how.rsplit(": ", 1)[1].removesuffix(" tok/s")
        return "–" if self.plain_tokens_per_s is None else f"{self.plain_tokens_per_s:.2f}"

    @property
    def ranked(self) -> bool:
        """A whole run: one stopped before its end (Stop, the time limit) keeps its measured
        numbers but is not ranked against whole ones."""
        return self.tokens_per_s is not None and self.stop_reason not in PARTIAL

    @property
    def cut_note(self) -> str:
        """What the output column says of a run cut before its end; "" for any other."""
        return "" if self.ranked or self.tokens_per_s is None else \
            f"stopped after {self.n_tokens} tokens: not ranked"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranked"] = self.ranked
        return d


@dataclass
class Board:
    """A whole race: its settings, each contender's run and the plain run raced beside it."""

    meta: dict  # trace meta (settings = the race's request, models, hardware, precision, costs)
    keys: list[str]
    # the reference plain run (the first whole one); a race recorded before 2026-11-28: its one plain run
    baseline: list = field(default_factory=list)
    runs: dict[str, MethodRun] = field(default_factory=dict)
    current: str = ""  # the key running now ("" when none)
    last: str = ""  # the last run's key

    def note_busy(self, key: str, reason: str) -> None:
        """Other programs took the machine during `key`'s race (the page's or the CLI's CPU meter):
        its row says so."""
        if reason:
            self.meta.setdefault("busy", {})[key] = reason

    @property
    def settings(self) -> dict:
        return self.meta.get("settings") or {}

    @property
    def greedy(self) -> bool:
        return float(self.settings.get("temperature") or 0.0) == 0.0

    @property
    def paired(self) -> bool:
        """Each method raced beside its own plain run (False: a bundle recorded before 2026-11-28)."""
        return any(r.plain for r in self.runs.values()) or not self.baseline

    @property
    def base_summary(self) -> RunSummary | None:
        """The plain row's run: the median of the plain runs raced beside the methods (an old
        bundle: its one plain run)."""
        if not self.paired:
            return _summary(self.baseline)
        plain = sorted((s for s in (r.plain_summary for r in self.runs.values()) if _whole(s)),
                       key=lambda s: s.tokens_per_s)
        return plain[(len(plain) - 1) // 2] if plain else None

    def add(self, key: str, side: str, ev) -> None:
        run = self.runs[key]
        (run.plain if side == "baseline" else run.events).append(ev)

    def done(self) -> int:
        """Races that ended whole, or were given up for a reason of their own: not one cut by Stop,
        nor one Stop kept from running."""
        return sum(_whole(r.summary) or bool(r.error and r.error != NOT_RUN) for r in self.runs.values())

    @property
    def total(self) -> int:
        return len(self.keys)

    def rows(self) -> list[Row]:
        """Every run with a result, fastest first; then the ones without, in race order."""
        base = self.base_summary
        rows = [self._plain_row(base)] if base is not None else []
        rows += [self._row(self.runs[k]) for k in self.keys if self.runs[k].summary is not None]
        rows.sort(key=_rank_key)
        rows += [Row(k, self.runs[k].entry.label, self._gamma(self.runs[k]), None, None, None, None, None,
                     None, "–", error=self.runs[k].error)
                 for k in self.keys if self.runs[k].summary is None]
        return rows

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows() if r.key == key), None)

    def _gamma(self, run: MethodRun) -> str:
        return "auto" if run.settings.get("gamma_auto") or run.entry.auto else str(
            run.settings.get("gamma", self.settings.get("gamma", "?")))

    def _plain_row(self, base: RunSummary) -> Row:
        tau = base.n_tokens / base.target_forwards if base.target_forwards else None
        rates = [s.tokens_per_s for s in (r.plain_summary for r in self.runs.values()) if _whole(s)]
        how = (f"timed {len(rates)} times, each beside one method (tok/s: the median): "
               f"{min(rates):.2f}-{max(rates):.2f} tok/s" if len(rates) > 1 and self.paired else
               "timed once, beside its method" if self.paired else
               "timed once, before every method (recorded before 2026-11-28)")
        return Row(PLAIN, "plain decoding (baseline)", "–", base.tokens_per_s,
                   1.0 if base.tokens_per_s > 0 else None, tau, None, None, None, "reference",
                   base.n_tokens, base.elapsed, base.stop_reason, plain_tokens_per_s=base.tokens_per_s,
                   plain_how=how)

    def _row(self, run: MethodRun) -> Row:
        s = run.summary
        plain = run.plain_summary if run.plain else (None if self.paired else _summary(self.baseline))
        # c, v and × plain divide by the plain run raced beside it: the box of the picked run shows the same
        st = run_stats(s, plain, trace_costs(Trace(self.meta)))
        ident, detail = self._check(run, plain)
        spd = st.speedup
        cpu = cpu_speedup(s, plain) if run.plain else None
        flags = [_flag_tau(spd, st.tau), cpu_wall_note(spd, cpu), self._busy(run.entry.key)]
        if plain is None:
            how = "the plain run beside it did not finish"
        elif run.plain:
            how = (f"÷ {plain.tokens_per_s:.2f} tok/s: plain decoding raced beside it, step by step on "
                   f"the same moments (fair mode)" + (f"; by CPU time {cpu:.2f}×" if cpu else ""))
        else:
            how = f"÷ the one plain run ({plain.tokens_per_s:.2f} tok/s), timed before every method"
            flags.append("recorded before 2026-11-28: plain was timed minutes apart from this run, not in "
                         "the same moments, so its × plain may be bent by the machine's load"
                         + (f"; τ {st.tau:.2f}: not ranked above plain" if _unclear(st.tau) else ""))
        return Row(run.entry.key, run.entry.label, self._gamma(run), s.tokens_per_s, spd, st.tau,
                   st.alpha_hat, st.c, st.verify_cost, ident, s.n_tokens, s.elapsed, s.stop_reason,
                   run.error, detail, plain_tokens_per_s=plain.tokens_per_s if plain else None,
                   plain_how=how, flag="; ".join(f for f in flags if f), cpu_speedup=cpu,
                   paired=bool(run.plain))

    def _busy(self, key: str) -> str:
        """The page's or the CLI's note that the machine was busy during that race (meta["busy"])."""
        why = (self.meta.get("busy") or {}).get(key)
        return f"busy machine ({why}) during this race" if why else ""

    def _check(self, run: MethodRun, plain: RunSummary | None) -> tuple[str, str]:
        """The greedy output check of run/equality.py against the plain run beside it."""
        if not self.greedy:
            return "n/a (sampled)", "sampled runs differ by chance; both follow the target's distribution"
        if plain is None or {plain.stop_reason, run.summary.stop_reason} & set(PARTIAL):
            return "–", "a run was stopped before its end: nothing to compare"
        eq = compare_greedy(output_tokens(run.plain or self.baseline), output_tokens(run.events),
                            dtype_of(self.meta.get("precision") or ""))
        return eq.verdict, eq.message()

    def trace(self, key: str, live: bool = False) -> Trace:
        """One contender's race as an ordinary two-sided trace (the plain run beside it, then it), for
        the page's replay/render path and downloads: its speedup is the row's. PLAIN: the plain row's
        run alone. live: the race is running, so its plain side is only what it has run so far (a
        finished row without one, from an old bundle, shows the board's reference plain run)."""
        run = self.runs.get(key)
        settings = dict(run.settings) if run is not None and run.settings else dict(self.settings)
        label = f"{run.entry.label if run is not None else 'plain decoding'} · race of all methods"
        tr = Trace(dict(self.meta, settings=settings, label=label))
        if run is None:
            best = self.base_summary
            plain = next((r.plain for r in self.runs.values() if r.plain and r.plain[-1] is best),
                         self.baseline)
        else:
            plain = run.plain if live or run.plain else self.baseline
        tr.events = [("baseline", e) for e in plain]
        if run is not None:
            tr.events += [("speculative", e) for e in run.events]
        return tr


def _flag_tau(spd: float | None, tau: float | None) -> str:
    if spd is not None and spd > 1.0 and tau is not None and tau < TAU_PLAIN:
        return (f"τ {tau:.2f}: no more tokens per target forward than plain decoding, so its {spd:.2f}× "
                "is timing noise or a disturbed minute, not a speedup; ranked below plain")
    return ""


def _unclear(tau: float | None) -> bool:
    return tau is None or tau < TAU_CLEAR


def _rank_key(r: Row):
    """Whole runs first, by × plain (a ratio of the same moments); a τ 1.00 run never above plain,
    nor one of an old bundle (plain timed apart from it) with τ under TAU_CLEAR."""
    if not r.ranked:
        return (True, 0.0, False, 0.0)
    spd = r.speedup if r.speedup is not None else 0.0
    capped = r.key != PLAIN and spd > 1.0 and (
        (r.tau is not None and r.tau < TAU_PLAIN) or (not r.paired and _unclear(r.tau)))
    return (False, -(min(spd, 1.0) if capped else spd), capped, -spd)


def new_board(pair, req, keys, options: dict | None = None) -> Board:
    """An empty board for a race of `keys` on `pair` with `req`'s prompt and settings.
    A contender whose settings are refused (lookahead at T > 0) gets its reason now."""
    keys = parse_keys(keys)
    tr = trace_for(req, pair, "fair", f"race of all methods · {req.prompt[:40]}")
    meta = dict(tr.meta, kind="race-methods", methods=list(keys))
    board = Board(meta, keys)
    for k in keys:
        e = entry(k)
        run = board.runs[k] = MethodRun(e)
        try:
            run.settings = asdict(method_request(req, e, options))
        except RequestError as err:
            run.error = str(err)
    return board


# ------------------------------------------------------------------ the race


def _beside_plain(pair, req, ids, stop, limit: float | None, warmup: int) -> Iterator:
    """A warm-up (not recorded), then the method raced beside plain decoding, fair mode, step by
    step: (side, event) as they come. `limit`: seconds for the timed race (as for any race)."""
    from .race import race
    if warmup > 0:  # first forwards of a shape pay one-time costs the timed run should not
        for _ in race(pair, replace(req, max_new_tokens=min(warmup, req.max_new_tokens)), ids, "fair",
                      stop=stop, time_limit=limit, pace="tokens"):
            pass
    yield from race(pair, req, ids, "fair", stop=stop, time_limit=limit, pace="tokens")


def _request(board: Board, key: str):
    from .request import RunRequest
    s = board.runs[key].settings
    return RunRequest(**{**s, "options": dict(s.get("options") or {})})


def race_methods(pair, req, prompt_ids: list[int], board: Board, *, stop: threading.Event | None = None,
                 time_limit: float | None = None, warmup: int = 0) -> Iterator[tuple[str, str, object]]:
    """Race each contender of `board` beside plain decoding, one race at a time; yield (key, side,
    event) as they come (side "baseline" or "speculative"), with START/END markers around each race.
    A contender that cannot run here (no draft model, untrained heads, out of
    memory) gets its reason in its row and the race goes on; Stop or the time
    limit (`time_limit` seconds per race, as for any race of the server) end a race
    where it is ("stopped"); after Stop the rest stay unrun, with the reason."""
    for key in board.keys:
        run = board.runs[key]
        if run.error:
            continue
        if stop is not None and stop.is_set():
            run.error = NOT_RUN
            continue
        board.current = board.last = key
        yield key, START, None
        try:
            for side, ev in _beside_plain(pair, _request(board, key), prompt_ids, stop, time_limit, warmup):
                board.add(key, side, ev)
                yield key, side, ev
        except (RequestError, ModelError) as err:
            _give_up(board, key, str(err))
        except Exception as err:  # noqa: BLE001 - out of memory: this row says so; bugs still raise
            if not is_oom(err):
                raise
            free_memory()
            _give_up(board, key, f"out of memory: {first_line(err)}")
        board.current = ""
        if not board.baseline and _whole(run.plain_summary):
            board.baseline = run.plain  # the reference: the first whole plain run
        yield key, END, None


def _give_up(board: Board, key: str, why: str) -> None:
    board.runs[key].events.clear()
    board.runs[key].plain.clear()
    board.runs[key].error = why


def stream_events(events) -> list:
    """Only the engine events of a recorded run (TokenEvent / RoundEvent / RunSummary)."""
    return [e for e in events if isinstance(e, (TokenEvent, RoundEvent, RunSummary))]
