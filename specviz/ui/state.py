"""RunView: what the page knows about the current run, built only from events.

The race yields (side, event); RunView.add() keeps them and snapshot() turns
them into the numbers shown (through specviz.engine.metrics, so the page, the CLI and
the bench compute α, τ, c and the speedup the same way).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace

import torch

from ..engine.events import RoundEvent, RunSummary, TokenEvent, book_round
from ..engine.metrics import (
    after_prompt_speedup,
    cost_drift_note,
    cpu_speedup,
    cpu_wall_note,
    disturbed_note,
    run_stats,
    target_step_time,
)
from .draft_source import FREE_DRAFTS, READS_MEMORY, drafter_counts, memory_tokens
from .why_lost import staged_share

# the predictions start at this round, in the box and on the chart: the α̂ of the first rounds rests
# on a handful of drafted tokens (a round that kept all its drafts gives α̂ 1 and predicts (γ+1)/(γc+v),
# the chart's ~6.5× spikes of issue 59)
PREDICT_FROM = 4
# round 1 also reads the prompt: its speedup swung to 5.82x on a busy machine (issue 21), and 1-token runs
# headlined 2.77×, 1.10× and 0.64× (issue 71): no headline before this many speculative rounds, even at the
# end (ui/speedup_box.py), and the speedup chart leaves round 1 out (ui/charts.py)
HOLD_ROUNDS = 2


@dataclass
class SideView:
    name: str
    tokens: list[TokenEvent] = field(default_factory=list)  # baseline tokens
    rounds: list[RoundEvent] = field(default_factory=list)  # speculative rounds
    summary: RunSummary | None = None
    t: float = 0.0  # latest event time on this side's clock
    # running totals over rounds (speculative), booked by the engine's own ledger (events.commit_round)
    books: RunSummary = field(default_factory=lambda: RunSummary(
        side="speculative", method="", token_ids=[], text="", n_tokens=0, elapsed=0.0, prefill=0.0,
        target_forwards=0, stop_reason="running"))

    @property
    def n_tokens(self) -> int:
        if self.summary is not None:
            return self.summary.n_tokens
        if self.rounds:
            return self.rounds[-1].total_tokens
        return len(self.tokens)

    @property
    def target_forwards(self) -> int:
        if self.summary is not None:
            return self.summary.target_forwards
        if self.rounds:
            return self.rounds[-1].target_forwards
        return len(self.tokens)

    @property
    def elapsed(self) -> float:
        return self.summary.elapsed if self.summary is not None else self.t

    @property
    def tokens_per_s(self) -> float | None:
        return self.n_tokens / self.elapsed if self.elapsed > 0 and self.n_tokens else None

    @property
    def state(self) -> str:
        if self.summary is None:
            return "running" if (self.tokens or self.rounds) else "waiting"
        return {"eos": "done (end of text)", "max_new_tokens": "done (max tokens)",
                "stopped": "stopped"}.get(self.summary.stop_reason, self.summary.stop_reason)

    def partial_summary(self) -> RunSummary:
        """The RunSummary so far (the real one once the side finished)."""
        if self.summary is not None:
            return self.summary
        if self.name == "baseline":
            return RunSummary(side="baseline", method="plain", token_ids=[t.token_id for t in self.tokens],
                              text="", n_tokens=len(self.tokens), elapsed=self.t,
                              prefill=self.tokens[0].t if self.tokens else 0.0,
                              target_forwards=len(self.tokens), stop_reason="running")
        last = self.rounds[-1] if self.rounds else None
        return RunSummary(
            side="speculative", method="draft", token_ids=[], text="", n_tokens=self.n_tokens,
            elapsed=self.t, prefill=self._prefill(),
            target_forwards=self.target_forwards, stop_reason="running", rounds=len(self.rounds),
            drafted=last.total_drafted if last else 0, accepted=last.total_accepted if last else 0,
            draft_time=self.books.draft_time, verify_time=self.books.verify_time,
            draft_forwards=self.books.draft_forwards, overlap_sum=self.books.overlap_sum,
            gamma=max((r.gamma for r in self.rounds), default=0),
            prompt_rounds=self.books.prompt_rounds)

    def _prefill(self) -> float:
        if not self.rounds:
            return 0.0
        first = self.rounds[0]
        return first.t_end if first.prompt_tokens else first.t_start


class RunView:
    """Accumulates one race. `gamma` is the requested γ (rounds near the end of
    the budget may draft fewer)."""

    def __init__(self, gamma: int, temperature: float, mode: str, prompt: str = "", chat: bool = False):
        self.gamma = gamma
        self.greedy = temperature == 0
        self.mode = mode
        self.prompt = prompt
        self.chat = chat
        self.base = SideView("baseline")
        self.spec = SideView("speculative")
        self.clock = 0.0  # shared display clock (virtual in fair mode)
        self.note = ""
        self.method = "draft"  # where the guesses came from (RunRequest.method)
        self.options: dict = {}  # its settings (RunRequest.options: tree shape, exit layer, ...)
        self.gamma_auto = False  # γ chosen each round (engine/gamma.py): predict at the mean drafted γ
        self.fresh_memory = False  # RunRequest.fresh_memory: the suffix drafters read no earlier run's output
        self.reads_memory = False  # a session's run (RunRequest.scope), not fresh: may copy earlier runs
        self.shares_memory = False  # and RunRequest.share_memory: other visitors' runs of the presets too
        self.dtype = torch.float32  # the target's float type: sets the greedy near-tie threshold
        self.error = ""  # a failed run's message for the visitor
        self.unmeasured: tuple = ()  # Stats fields the engine cannot measure (vLLM: α̂, c, prediction)
        self.costs = None  # the pair's CostModel (engine/costs.py) when it was calibrated at load
        # per spec round: (t_end, measured, Leviathan's predicted, verify-cost-aware predicted) speedup
        self.speedup_series: list[tuple[float, float | None, float | None, float | None]] = []
        self._base_times: list[float] = []
        self._unmatched: list[tuple[int, int]] = []  # (series index, tokens): the baseline has fewer yet
        self._rows: list[float] = [0.0, 0.0]  # lookahead: tokens in its timed verify forwards, rounds

    def side(self, name: str) -> SideView:
        return self.base if name == "baseline" else self.spec

    @property
    def finished(self) -> bool:
        return self.base.summary is not None and self.spec.summary is not None

    def add(self, side: str, ev) -> None:
        view = self.side(side)
        if isinstance(ev, TokenEvent):
            view.tokens.append(ev)
            self._base_times.append(ev.t)
            view.t = max(view.t, ev.t)
            self._match()
        elif isinstance(ev, RoundEvent):
            view.rounds.append(ev)
            book_round(view.books, ev)  # round 1 also read the prompt: the ledger books it as prefill
            if side == "speculative" and not ev.prompt_tokens and "input_tokens" in ev.info:
                self._rows = [self._rows[0] + ev.info["input_tokens"], self._rows[1] + 1]
            view.t = max(view.t, ev.t_end)
        elif isinstance(ev, RunSummary):
            view.summary = ev
            view.t = max(view.t, ev.elapsed)
        self.clock = max(self.clock, view.t)
        if isinstance(ev, RoundEvent):
            self.speedup_series.append((ev.t_end, *self._speedup_at(ev)))
            self._unmatched.append((len(self.speedup_series) - 1, ev.total_tokens))
            self._match()
        elif isinstance(ev, RunSummary) and self.spec.summary is not None:
            # the run's last point is the headline's speedup: computed again when the baseline
            # ends after the speculative side (it had used the baseline's rate so far)
            if side == "baseline" and self.speedup_series:
                self.speedup_series.pop()
            spec = self._spec_summary()  # the engine's summary, as the box reads it (no chain formula…)
            st = run_stats(spec, self.base.partial_summary() if self.base.tokens else None, self.costs,
                           self.verify_rows)
            held = len(self.spec.rounds) < PREDICT_FROM
            self.speedup_series.append((spec.elapsed, st.speedup, None if held else st.predicted,
                                        None if held else st.predicted_v))

    # ------------------------------------------------------------ numbers

    def _base_at(self, t: float) -> RunSummary | None:
        """The baseline as it stood at time t (for its plain step)."""
        b = self.base
        if b.summary is not None and b.summary.elapsed <= t:
            return b.summary
        n = bisect.bisect_right(self._base_times, t)
        if n == 0:
            return None
        # still running at t: the step from the gaps between its tokens so far
        return RunSummary(side="baseline", method="plain", token_ids=[], text="", n_tokens=n,
                          elapsed=self._base_times[n - 1], prefill=self._base_times[0], target_forwards=n,
                          stop_reason="running")

    def _speedup_at(self, r: RoundEvent) -> tuple[None, float | None, float | None]:
        """(measured: filled in by _match, Leviathan's prediction, verify-cost-aware prediction)
        after round r."""
        if len(self.spec.rounds) < PREDICT_FROM:
            return None, None, None
        st = run_stats(self._spec_summary(), self._base_at(r.t_end), self.costs, self.verify_rows)
        return None, st.predicted, st.predicted_v

    def _match(self) -> None:
        """Each round's measured speedup once the baseline has written as many tokens: its time
        for them over this side's (the same work, so the curve ends at the headline). The rates
        at one moment had run 2.1× against a 1.84× headline: the baseline's prompt read weighs
        on its early rate."""
        while self._unmatched and self._unmatched[0][1] <= len(self._base_times):
            i, n = self._unmatched.pop(0)
            t, _, pred, pred_v = self.speedup_series[i]
            if n > 0 and t > 0:
                self.speedup_series[i] = (t, self._base_times[n - 1] / t, pred, pred_v)

    def _spec_summary(self) -> RunSummary:
        spec = replace(self.spec.partial_summary())  # a copy: the engine's summary is recorded as it came
        spec.method = self.method
        spec.unmeasured = list(self.unmeasured) or spec.unmeasured  # n/a, never 0 (run_stats blanks them)
        # the chain formula fits neither a tree nor rounds of copied text (a hybrid's mixed with draft-model
        # chains): no prediction from the first round on, as the engine's summary says at the end
        if (self.is_tree or self.method in FREE_DRAFTS) and "predicted" not in spec.unmeasured:
            spec.unmeasured = [*spec.unmeasured, "predicted"]
        return spec

    @property
    def verify_rows(self) -> float | None:
        """Mean tokens per timed verify forward where a method reports them (lookahead: its n-gram
        guesses and Jacobi window, not its drafted tokens); None: the drafted γ + 1."""
        return self._rows[0] / self._rows[1] if self._rows[1] else None

    @property
    def is_tree(self) -> bool:
        """A token-tree run (engine/tree_decoding.py): no chain prediction, ever."""
        return self.method == "tree" or any(getattr(r, "tree", None) for r in self.spec.rounds[:1])

    def stats(self) -> dict:
        spec = self._spec_summary()
        base = self.base.partial_summary() if (self.base.tokens or self.base.summary) else None
        if not self.spec.rounds:
            return {"rounds": 0}
        spec.gamma = self.gamma
        spec.gamma_policy = "auto" if self.gamma_auto else spec.gamma_policy
        if len(self.spec.rounds) < PREDICT_FROM and "predicted" not in spec.unmeasured:
            spec.unmeasured = [*spec.unmeasured, "predicted"]
        st = run_stats(spec, base, self.costs, self.verify_rows).to_dict()
        st["rounds"] = len(self.spec.rounds)
        first = self.spec.rounds[0]  # round 1 read the prompt: its tokens are the prompt read's
        st["after_prompt"] = after_prompt_speedup(base, spec, first.prompt_tokens and first.total_tokens)
        # draft forwards per timed round: what a round spent drafting is this × c (why_lost.py)
        st["draft_steps"] = spec.draft_forwards / spec.timed_rounds if spec.timed_rounds else None
        return st

    def identical(self) -> dict | None:
        """Greedy runs that both finished normally: are the outputs identical?"""
        if not (self.greedy and self.finished):
            return None
        a, b = self.base.summary, self.spec.summary
        if {a.stop_reason, b.stop_reason} & {"stopped", "error"}:
            return None
        if a.token_ids == b.token_ids:
            return {"identical": True, "first_diff": None}
        # they differ: a numerical near-tie or a bug? the top-2 logit gaps of both runs say
        from ..run.equality import compare_greedy, output_tokens
        eq = compare_greedy(output_tokens(self.base.tokens), output_tokens(self.spec.rounds), self.dtype)
        verdict = "mismatch" if eq.verdict == "identical" else eq.verdict
        first = eq.position if eq.position is not None else next(
            (i for i, (u, v) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if u != v),
            min(len(a.token_ids), len(b.token_ids)))
        return {"identical": False, "first_diff": first, "verdict": verdict, "gap": eq.gap,
                "threshold": eq.threshold}

    def disturbed(self, stats: dict) -> str:
        """A finished run whose plain step or verify pass cost clearly more than the calibration's,
        any method (engine/metrics.cost_drift_note); on a CPU, one whose × plain by wall time and by
        CPU time part by more than 15 % (cpu_wall_note); or a greedy one whose measured speedup is far
        from its prediction (disturbed_note: greedy only, the docs' error evidence is greedy, and a
        sampled run's acceptance varies by chance)."""
        if not self.finished or self.error:
            return ""
        step = target_step_time(self.base.summary) if self.mode != "parallel" else None  # parallel: shared
        drift = cost_drift_note(step, stats.get("verify_cost"), stats.get("verify_cost_calibrated"),
                                self.costs, stats.get("verify_rows"))
        base, spec = self.base.summary, self.spec.summary
        if not drift and spec is not None:
            # × plain by wall time against by CPU time, as the race of all methods flags it (a CPU's
            # races only: cpu_speedup is None on a GPU)
            drift = cpu_wall_note(stats.get("speedup"), cpu_speedup(spec, base))
        if drift or not self.greedy:
            return drift
        return disturbed_note(stats.get("speedup"), stats.get("predicted_v"), stats.get("rounds") or 0,
                              stats.get("c"))

    def snapshot(self) -> dict:
        def side(v: SideView) -> dict:
            # a failed run's message is in the run info line alone (issue 71): a side that never ended, "–"
            state = "–" if self.error and v.summary is None else v.state
            path = (v.summary.extra or {}).get("path", "") if v.summary is not None else ""
            return dict(n_tokens=v.n_tokens, elapsed=v.elapsed, tokens_per_s=v.tokens_per_s,
                        target_forwards=v.target_forwards, state=state, path=path,
                        prompt_read=v.partial_summary().prefill if (v.tokens or v.rounds) else None)
        stats = self.stats()
        return dict(baseline=side(self.base), speculative=side(self.spec), stats=stats,
                    identical=self.identical(), finished=self.finished, greedy=self.greedy,
                    mode=self.mode, clock=self.clock, note=self.note, method=self.method,
                    options=self.options, error=self.error, tree=self.is_tree,
                    disturbed=self.disturbed(stats), gamma=self.gamma, gamma_auto=self.gamma_auto,
                    drafters=drafter_counts(self.spec.rounds), memory=self.memory(),
                    staged=staged_share(self.spec.rounds) if self.method == "staged" else None)

    def memory(self) -> dict | None:
        """For a method that may copy from earlier runs' outputs (suffix, hybrid): how many of this
        run's tokens were accepted drafts copied from them, of how many, whether it ran with fresh
        memory (read none) and whether it shared memory (read other visitors' runs of the presets);
        None for the other methods."""
        if self.method not in READS_MEMORY:
            return None
        return dict(copied=memory_tokens(self.spec.rounds), tokens=self.spec.n_tokens,
                    fresh=self.fresh_memory, reads=self.reads_memory,
                    shared=self.reads_memory and self.shares_memory)
