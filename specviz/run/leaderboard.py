"""Race all methods: one prompt, plain decoding, then each method timed alone with plain
timed again after it, then a leaderboard built only from the runs' own events.

    board = new_board(pair, req, ["draft", "auto", "tree"])
    for key, side, ev in race_methods(pair, req, prompt_ids, board):
        ...                      # (key, START/END, None) marks a run's start and end
    board.rows()                 # tok/s, × plain, τ, α̂, c, v, identical check; fastest first

Fairness: every run goes through specviz.run.race in fair mode with one side, so
it is stepped on the race's engine thread under isolation.timed_step() and
timed on its own VirtualClock: no two runs ever overlap, and work the consumer
does between events (rendering) is not counted. The first plain run is the
reference of the greedy check; plain is timed again after each method (RETIME:
not recorded as events, its numbers kept in meta["plain_timings"]), so each
× plain divides by the mean of the plain runs just before and just after that
method: a same-minute ratio. Issue 51: a race whose one baseline ran on a busy
minute at 4.27 tok/s (19 in a quiet one) ranked a method that accepted nothing
at 1.38× plain.

Every number in a row comes from run_stats() on the run's own RunSummary, the
same function the page and the CLI use for a single run; nothing is estimated.
No gradio or plotly here: the page (ui/leaderboard.py), the CLI
(cli/leaderboard.py) and the bundle (run/race_bundle.py) consume this.
"""
from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Iterator

from ..engine.events import RoundEvent, RunSummary, TokenEvent
from ..engine.metrics import run_stats
from ..engine.pair import dtype_of
from ..engine.proposers import REGISTRY
from ..errors import ModelError, RequestError, first_line, free_memory, is_oom
from .equality import compare_greedy, output_tokens
from .trace import Trace, trace_costs, trace_for

PLAIN = "plain"  # the key of the shared baseline run
RETIME = "plain-again"  # the key of plain timed again after a method (START/END markers only)
# τ below this shows as 1.00: no more tokens per target forward than plain decoding
TAU_PLAIN = 1.005
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


@dataclass
class MethodRun:
    entry: Entry
    settings: dict = field(default_factory=dict)  # asdict(RunRequest) of this run
    events: list = field(default_factory=list)  # its speculative events, RunSummary last
    error: str = ""  # why it has no result ("greedy only", "stopped before it ran", ...)

    @property
    def summary(self) -> RunSummary | None:
        return next((e for e in reversed(self.events) if isinstance(e, RunSummary)), None)


@dataclass
class Row:
    """One line of the leaderboard; None where a number does not apply or was not measured."""

    key: str
    label: str
    gamma: str  # "4", "auto" or "–" (plain)
    tokens_per_s: float | None
    speedup: float | None  # × plain: tokens/s ÷ the baseline's tokens/s
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
    plain_tokens_per_s: float | None = None  # what × plain divided by (the same minute's plain)
    plain_how: str = ""  # how that figure was taken, in words
    flag: str = ""  # why × plain may mislead here (τ 1.00 above plain, a busy machine), or ""

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
    """A whole race: its settings, the baseline's events, each contender's run."""

    meta: dict  # trace meta (settings = the race's request, models, hardware, precision, costs)
    keys: list[str]
    baseline: list = field(default_factory=list)  # the plain run's events, RunSummary last
    runs: dict[str, MethodRun] = field(default_factory=dict)
    current: str = ""  # the key running now ("" when none)
    last: str = ""  # the last run's key: the method RETIME's plain run brackets

    def note_busy(self, key: str, reason: str) -> None:
        """Other programs took the machine during `key`'s run (the page's or the CLI's CPU meter):
        its row says so, and so does the row of the method a busy RETIME brackets."""
        if reason:
            self.meta.setdefault("busy", {})[self.last if key == RETIME else key] = reason

    @property
    def settings(self) -> dict:
        return self.meta.get("settings") or {}

    @property
    def greedy(self) -> bool:
        return float(self.settings.get("temperature") or 0.0) == 0.0

    @property
    def base_summary(self) -> RunSummary | None:
        return next((e for e in reversed(self.baseline) if isinstance(e, RunSummary)), None)

    def add(self, key: str, ev) -> None:
        (self.baseline if key == PLAIN else self.runs[key].events).append(ev)

    def done(self) -> int:
        """Runs that ended whole, or were given up for a reason of their own, the baseline included:
        not one cut by Stop, nor one Stop kept from running."""
        def whole(s):
            return s is not None and s.stop_reason not in PARTIAL
        ran = [r for r in self.runs.values() if whole(r.summary) or (r.error and r.error != NOT_RUN)]
        return whole(self.base_summary) + len(ran)

    @property
    def total(self) -> int:
        return 1 + len(self.keys)

    def rows(self) -> list[Row]:
        """Every run with a result, fastest first; then the ones without, in race order."""
        base = self.base_summary
        rows = [self._plain_row(base)] if base is not None else []
        rows += [self._row(self.runs[k], base) for k in self.keys if self.runs[k].summary is not None]
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
        rates = [t["tokens_per_s"] for t in self.meta.get("plain_timings") or ()]
        how = (f"timed {len(rates)} times, between the methods: {min(rates):.2f}-{max(rates):.2f} tok/s"
               if len(rates) > 1 else "timed once, before every method")
        return Row(PLAIN, "plain decoding (baseline)", "–", base.tokens_per_s,
                   1.0 if base.tokens_per_s > 0 else None, tau, None, None, None, "reference",
                   base.n_tokens, base.elapsed, base.stop_reason, plain_tokens_per_s=base.tokens_per_s,
                   plain_how=how, flag=self._busy(PLAIN))

    def _row(self, run: MethodRun, base: RunSummary | None) -> Row:
        s = run.summary
        before, after = self._bracket(run.entry.key)
        # c and v divide by a plain step: the one timed just before this method
        st = run_stats(s, before or base, trace_costs(Trace(self.meta)))
        ident, detail = self._check(run, base)
        ref, how = _same_minute(before, after, base)
        spd = s.tokens_per_s / ref if ref and s.elapsed > 0 else None
        flags = [self._busy(run.entry.key)]
        if spd is not None and spd > 1.0 and st.tau is not None and st.tau < TAU_PLAIN:
            flags.insert(0, f"τ {st.tau:.2f}: no more tokens per target forward than plain decoding, so "
                            f"its {spd:.2f}× is timing noise or a disturbed minute, not a speedup; "
                            "ranked below plain")
        return Row(run.entry.key, run.entry.label, self._gamma(run), s.tokens_per_s, spd, st.tau,
                   st.alpha_hat, st.c, st.verify_cost, ident, s.n_tokens, s.elapsed, s.stop_reason,
                   run.error, detail, plain_tokens_per_s=ref, plain_how=how,
                   flag="; ".join(f for f in flags if f))

    def _bracket(self, key: str) -> tuple[RunSummary | None, RunSummary | None]:
        """The plain runs timed just before and just after `key`'s run (None: not timed)."""
        timings = self.meta.get("plain_timings") or []
        at = (self.meta.get("plain_brackets") or {}).get(key) or (None, None)
        return tuple(_timing_summary(timings[i]) if i is not None and i < len(timings) else None
                     for i in at)

    def _busy(self, key: str) -> str:
        """The page's or the CLI's note that the machine was busy during that run (meta["busy"])."""
        why = (self.meta.get("busy") or {}).get(key)
        return f"busy machine ({why}), in this run or the plain one after it" if why else ""

    def _check(self, run: MethodRun, base: RunSummary | None) -> tuple[str, str]:
        """The greedy output check of run/equality.py against the shared baseline."""
        if not self.greedy:
            return "n/a (sampled)", "sampled runs differ by chance; both follow the target's distribution"
        if base is None or {base.stop_reason, run.summary.stop_reason} & set(PARTIAL):
            return "–", "a run was stopped before its end: nothing to compare"
        eq = compare_greedy(output_tokens(self.baseline), output_tokens(run.events),
                            dtype_of(self.meta.get("precision") or ""))
        return eq.verdict, eq.message()

    def trace(self, key: str) -> Trace:
        """One contender's run as an ordinary two-sided trace (the baseline, then it), for the
        page's replay/render path and downloads; PLAIN gives the baseline alone."""
        run = self.runs.get(key)
        settings = dict(run.settings) if run is not None and run.settings else dict(self.settings)
        label = f"{run.entry.label if run is not None else 'plain decoding'} · race of all methods"
        if run is not None and len(self.meta.get("plain_timings") or ()) > 1:
            label += " (its speedup here is against the first plain run; the table's, the same minute's)"
        tr = Trace(dict(self.meta, settings=settings, label=label))
        tr.events = [("baseline", e) for e in self.baseline]
        if run is not None:
            tr.events += [("speculative", e) for e in run.events]
        return tr


def _rank_key(r: Row):
    """Whole runs first, by × plain (a same-minute ratio); a τ 1.00 run never above plain."""
    if not r.ranked:
        return (True, 0.0, False)
    spd = r.speedup if r.speedup is not None else 0.0
    capped = r.key != PLAIN and r.tau is not None and r.tau < TAU_PLAIN and spd > 1.0
    return (False, -(min(spd, 1.0) if capped else spd), capped)


def _timing(s: RunSummary, after: str) -> dict:
    """What the board keeps of a plain run timed again (its measured totals, not its tokens)."""
    return dict(after=after, tokens_per_s=s.tokens_per_s, n_tokens=s.n_tokens, elapsed=s.elapsed,
                prefill=s.prefill, target_forwards=s.target_forwards, stop_reason=s.stop_reason)


def _timing_summary(t: dict) -> RunSummary:
    return RunSummary("baseline", "plain", [], "", int(t["n_tokens"]), float(t["elapsed"]),
                      float(t["prefill"]), int(t["target_forwards"]), str(t["stop_reason"]))


def _same_minute(before: RunSummary | None, after: RunSummary | None, base: RunSummary | None):
    """(plain tokens/s to divide by, how it was taken): the mean of the plain runs just before and
    just after the method; one of them where the other is missing; the one baseline of a bundle
    recorded before plain was timed again."""
    if before is not None and after is not None:
        ref = (before.tokens_per_s + after.tokens_per_s) / 2
        return ref, (f"÷ {ref:.2f} tok/s: the mean of plain timed just before ({before.tokens_per_s:.2f}) "
                     f"and just after ({after.tokens_per_s:.2f})")
    if before is not None:
        return before.tokens_per_s, (f"÷ plain timed just before it ({before.tokens_per_s:.2f} tok/s); "
                                     "none after")
    if base is not None:
        return base.tokens_per_s, (f"÷ the one plain run ({base.tokens_per_s:.2f} tok/s), timed before "
                                   "every method: not the same minute")
    return None, ""


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


def _one(pair, req, ids, side: str, stop, limit: float | None, warmup: int) -> Iterator:
    """A warm-up (not recorded), then one run of `side` alone, fair mode, events as they come.
    `limit`: seconds for the timed run (as the server's limit for any run)."""
    from .race import race
    if warmup > 0:  # first forwards of a shape pay one-time costs the timed run should not
        for _ in race(pair, replace(req, max_new_tokens=min(warmup, req.max_new_tokens)), ids, "fair",
                      stop=stop, sides=(side,), time_limit=limit):
            pass
    for _, ev in race(pair, req, ids, "fair", stop=stop, sides=(side,), time_limit=limit):
        yield ev


def _request(board: Board, key: str, req):
    from .request import RunRequest
    s = board.runs[key].settings
    return RunRequest(**{**s, "options": dict(s.get("options") or {})})


def race_methods(pair, req, prompt_ids: list[int], board: Board, *, stop: threading.Event | None = None,
                 time_limit: float | None = None, warmup: int = 0) -> Iterator[tuple[str, str, object]]:
    """Run the baseline, then each contender of `board`, one at a time, each followed by plain
    timed again (RETIME: START/END markers only); yield (key, side, event) as they come, with
    START/END markers around each run.
    A contender that cannot run here (no draft model, untrained heads, out of
    memory) gets its reason in its row and the race goes on; Stop or the time
    limit (`time_limit` seconds per run, as for any run of the server) end a run
    where it is ("stopped"); after Stop the rest stay unrun, with the reason."""
    todo = [(PLAIN, req, "baseline")] + [(k, None, "speculative") for k in board.keys]
    for key, kreq, side in todo:
        run = board.runs.get(key)
        if run is not None and run.error:
            continue
        if stop is not None and stop.is_set():
            if run is not None:
                run.error = NOT_RUN
            continue
        board.current = board.last = key
        if key != PLAIN:  # the plain run just before this one: the last timed
            board.meta.setdefault("plain_brackets", {})[key] = [len(board.meta["plain_timings"]) - 1, None]
        yield key, START, None
        try:
            kreq = kreq or _request(board, key, req)
            for ev in _one(pair, kreq, prompt_ids, side, stop, time_limit, warmup):
                board.add(key, ev)
                yield key, side, ev
        except (RequestError, ModelError) as err:
            _give_up(board, key, str(err))
        except Exception as err:  # noqa: BLE001 - out of memory: this row says so; bugs still raise
            if not is_oom(err):
                raise
            free_memory()
            _give_up(board, key, f"out of memory: {first_line(err)}")
        board.current = ""
        if key == PLAIN and board.base_summary is not None:
            board.meta["plain_timings"] = [_timing(board.base_summary, "")]
        yield key, END, None
        if key == PLAIN and board.base_summary is None:
            for k in board.keys:  # no reference: nothing else can be compared
                board.runs[k].error = board.runs[k].error or "the baseline did not finish"
            return
        s = run.summary if run is not None else None
        if s is not None and s.stop_reason not in PARTIAL and not (stop is not None and stop.is_set()):
            yield from _retime(pair, req, prompt_ids, board, key, stop, time_limit, warmup)


def _retime(pair, req, ids, board: Board, key: str, stop, limit, warmup) -> Iterator:
    """Plain decoding timed again right after `key`'s run, alone as every run is; its totals join
    meta["plain_timings"] and close `key`'s bracket. A failed or cut one leaves the bracket open."""
    board.current = RETIME
    yield RETIME, START, None
    got = None
    try:
        for ev in _one(pair, req, ids, "baseline", stop, limit, warmup):
            got = ev if isinstance(ev, RunSummary) else got
    except (RequestError, ModelError):
        pass
    except Exception as err:  # noqa: BLE001 - out of memory: the bracket stays open; bugs still raise
        if not is_oom(err):
            raise
        free_memory()
    board.current = ""
    if got is not None and got.stop_reason not in PARTIAL:
        board.meta["plain_timings"].append(_timing(got, key))
        board.meta["plain_brackets"][key][1] = len(board.meta["plain_timings"]) - 1
    yield RETIME, END, None


def _give_up(board: Board, key: str, why: str) -> None:
    if key == PLAIN:
        board.baseline.clear()
        board.meta["baseline_error"] = why
    else:
        board.runs[key].events.clear()
        board.runs[key].error = why


def stream_events(events) -> list:
    """Only the engine events of a recorded run (TokenEvent / RoundEvent / RunSummary)."""
    return [e for e in events if isinstance(e, (TokenEvent, RoundEvent, RunSummary))]
