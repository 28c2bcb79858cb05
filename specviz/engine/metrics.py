"""Measured statistics of a run and the theory that predicts them.

Everything measured is computed from events (RunSummary / RoundEvent); what
the analysis predicts from α, γ, c and v(γ) comes from theory.py.

Names (the page, the CLI and the docs use the same two):
  α̂  expected acceptance = mean over drafted positions of Σ_x min(p(x), q(x)):
      the probability that the accept test passes at a position given its
      prefix. This is Leviathan et al.'s α, measured from the distributions.
  accepted ÷ drafted: the share of drafted tokens kept. In a chain it also
      counts the drafts after the first rejection, which were never tested, so
      it sits below α̂ whenever rounds end early; a token tree counts its nodes
      otherwise, and there it can exceed α̂ (0.868 against 0.840, issue 51).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .events import RunSummary
from .proposer import REGISTRY
from .theory import best_gamma, v_at, verify_curve
from .theory import speedup as predicted


def uses_draft_model(method: str) -> bool | None:
    """From the method registry; None for a method it does not know."""
    spec = REGISTRY.get(method)
    return spec.needs_draft if spec is not None else None


@dataclass
class Stats:
    """The numbers shown for a speculative run (None where not measured yet)."""

    alpha: float | None  # accepted ÷ drafted (untested drafts after a rejection count as not kept)
    alpha_hat: float | None  # expected acceptance: mean Σ min(p, q) (Leviathan's α)
    tau: float | None  # tokens per verification round (one target forward each)
    c: float | None  # draft forward time ÷ plain target step (None until a draft forward was timed)
    t_draft_step: float | None  # seconds per draft forward
    t_target_step: float | None  # seconds per plain target step (c's denominator)
    speedup: float | None  # measured tokens/s ratio vs the baseline
    predicted: float | None  # Leviathan (v = 1) at the measured α̂, mean drafted γ, c
    best_gamma: int | None  # from the verify-cost-aware model when v is known, else Leviathan's
    # a verification forward (mean γ + 1 tokens) in plain target steps, measured in this run
    verify_cost: float | None = None
    gamma_mean: float | None = None  # tokens drafted per round, the γ the prediction uses
    predicted_v: float | None = None  # (1-α̂^{γ+1}) / ((1-α̂)(γc + v(γ))) with the measured v
    best_gamma_leviathan: int | None = None  # best γ under v = 1
    # where predicted_v's v came from: "this run" (verify_cost, the chip beside it) | "calibration"
    # (verify_cost_calibrated, before a verify pass was timed) | ""
    predicted_v_basis: str = ""
    verify_rows: float | None = None  # tokens per verify forward (lookahead: its guess rows + window)
    verify_cost_calibrated: float | None = None  # v at verify_rows from the load's calibration (≤ 17 rows)
    c_basis: str = ""  # what c was divided by: "baseline" | "calibration" | "verify pass" | "no draft model"
    v_basis: str = ""  # where v(γ) comes from: "calibration" | "this run (linear through v(0)=1)"
    v_curve: list | None = field(default=None)  # v(k), k = 0..16, in plain steps

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def target_step_time(base: RunSummary) -> float | None:
    """Seconds per plain decoding step, prefill excluded."""
    if base.n_tokens < 2:
        return None
    return (base.elapsed - base.prefill) / (base.n_tokens - 1)


def after_prompt_speedup(base: RunSummary | None, spec: RunSummary | None, spec_tokens_at_prefill: int
                         ) -> float | None:
    """The speedup with each side's prompt read left out: plain's time after its first token per token
    after it, over the speculative side's time after its prefill (round 1, which read the prompt) per
    token after it. None until both have a token after their prompt read.
    Why shown beside the headline (issue 71): the same output gave 1.77x, 1.66x, 1.79x, 1.84x on a
    page whose baseline prompt read took 1.73 s in one run and 0.17-0.30 s in the others."""
    if base is None or spec is None:
        return None
    step = target_step_time(base)  # plain's seconds per token after its first
    ns, ts = spec.n_tokens - spec_tokens_at_prefill, spec.elapsed - spec.prefill
    if not step or step <= 0 or ns < 1 or ts <= 0:
        return None
    return step / (ts / ns)


def _plain_step(base: RunSummary | None, costs) -> tuple[float | None, str]:
    step = target_step_time(base) if base is not None else None
    if step:
        return step, "baseline"
    if costs is not None and costs.plain_step_s:
        return costs.plain_step_s, "calibration"
    return None, ""


def _draft_cost(spec: RunSummary, step, basis, verify) -> tuple[float | None, str]:
    """c, and what it was divided by. Unknown (None) until a draft forward was timed;
    0 only for a method without a draft model."""
    if spec.draft_forwards:
        t_d = spec.draft_time / spec.draft_forwards
        if step:
            return t_d / step, basis
        # no plain step measured: the verify pass (γ+1 tokens) is the closest thing
        return (t_d / verify, "verify pass") if verify else (None, "")
    needs = uses_draft_model(spec.method)
    if needs is False or (needs is None and spec.timed_rounds > 0):
        return 0.0, "no draft model"
    return None, ""


def run_stats(spec: RunSummary, base: RunSummary | None = None, costs=None,
              rows: float | None = None) -> Stats:
    """`costs`: the pair's CostModel (engine/costs.py), if it was calibrated at load. `rows`: mean
    tokens per verification forward where they are not the drafted γ + 1 (lookahead's forward
    carries its n-gram guesses and its Jacobi window: 24 rows for 1.4 drafted in a quiet race)."""
    alpha = spec.accepted / spec.drafted if spec.drafted else None
    alpha_hat = spec.overlap_sum / spec.drafted if spec.drafted else None
    tau = spec.n_tokens / spec.rounds if spec.rounds else None
    t_d = spec.draft_time / spec.draft_forwards if spec.draft_forwards else None
    step, basis = _plain_step(base, costs)
    verify = spec.verify_time / spec.timed_rounds if spec.timed_rounds else None
    c, c_basis = _draft_cost(spec, step, basis, verify)
    speedup = None
    if base is not None and base.tokens_per_s > 0 and spec.elapsed > 0:
        speedup = spec.tokens_per_s / base.tokens_per_s
    # the γ actually drafted (adaptive γ, prompt lookup and the budget's last round differ from the request)
    g = spec.drafted / spec.rounds if spec.rounds else None
    v = verify / step if (verify and step) else None  # a zero verify time is no measurement
    curve = verify_curve(costs, v, g)
    v_basis = "calibration" if costs is not None else ("this run (linear through v(0)=1)" if curve else "")
    rows = rows if rows is not None else (g + 1 if g is not None else None)
    v_cal = calibrated_v(costs, rows)
    pred = pred_v = best = best_lev = None
    pv_basis = ""
    if alpha_hat is not None and c is not None and g:
        pred = predicted(alpha_hat, g, c)
        best_lev = best_gamma(alpha_hat, c)
        best = best_lev
        # the prediction prices a round with the costs the page shows beside it: this run's verify
        # pass (all the rows it verified), or the calibration's at those rows before one was timed
        v_pred, pv_basis = ((v, "this run") if v is not None else
                            (v_cal, "calibration") if v_cal else (None, ""))
        if v_pred is not None:
            pred_v = predicted(alpha_hat, g, c, v_pred)
        if curve:
            best = best_gamma(alpha_hat, c, curve)
    st = Stats(alpha, alpha_hat, tau, c, t_d, step if step else verify, speedup, pred, best, v,
               gamma_mean=g, predicted_v=pred_v, best_gamma_leviathan=best_lev, c_basis=c_basis,
               v_basis=v_basis, v_curve=curve, predicted_v_basis=pv_basis, verify_rows=rows,
               verify_cost_calibrated=v_cal)
    _blank(st, getattr(spec, "unmeasured", ()))
    return st


# How far a run's measured speedup may sit from the verify-cost-aware prediction before its timings
# are called disturbed. Quiet runs of a drafting model: decode ÷ predicted medians 0.99-1.03, 95 %
# intervals within 0.94-1.08 (docs/benchmarks.md); the page's shipped runs (assets/traces, races) 1.03-1.17
# end to end. Issue 41: the quiet CLI 1.55× vs 1.44× (1.08), a disturbed first start 1.94× vs 1.45× (1.34).
DISTURBED_ABOVE = 1.25  # above every quiet ratio recorded, below the disturbed ones (1.32-1.43)
DISTURBED_BELOW = 0.5  # no quiet run recorded under 0.78; the prompt read pulls a run toward 1×
DISTURBED_MIN_ROUNDS = 8  # quiet runs of 1-4 rounds spread 0.47-1.28 (docs/benchmarks.md)


def disturbed_note(measured: float | None, predicted: float | None, rounds: int, c: float | None) -> str:
    """'timings look disturbed: measured 1.94× vs 1.45× predicted' when a run's measured speedup is
    further from its own prediction than the prediction's usual error; else ''. Only where a model
    drafts (c > 0): the formula at the mean drafted γ misses lookup's and REST's drafts of varying
    length (quiet races: 1.24, 1.25) and lookahead's guess rows (0.46)."""
    if not measured or not predicted or not c or rounds < DISTURBED_MIN_ROUNDS:
        return ""
    if DISTURBED_BELOW <= measured / predicted <= DISTURBED_ABOVE:
        return ""
    return f"timings look disturbed: measured {measured:.2f}× vs {predicted:.2f}× predicted"


# CPU-time and wall-time × plain further apart than this: the machine was disturbed during the race
# (issue 59: a loop on one core of two moved a clock-paced race's wall-time × plain by -24 % to +34 %)
CPU_WALL_GAP = 0.15


def cpu_speedup(s, plain) -> float | None:
    """× plain by CPU time (the fair race's VirtualClock.cpu, summary extra "cpu_s"): tokens per
    CPU-second of the method ÷ plain's; None where not measured, and on a GPU (the host's CPU time
    there is its launches and waits, not the device's work)."""
    a, b = s.extra.get("cpu_s"), plain.extra.get("cpu_s") if plain is not None else None
    if not a or not b or not s.n_tokens or not plain.n_tokens:
        return None
    if not all(str(x.device).startswith("cpu") for x in (s, plain)):
        return None
    return (s.n_tokens / a) / (plain.n_tokens / b)


def cpu_wall_note(spd: float | None, cpu: float | None) -> str:
    """The machine was disturbed: × plain by wall time and by CPU time part by more than 15 %."""
    if spd is None or cpu is None or max(spd / cpu, cpu / spd) <= 1 + CPU_WALL_GAP:
        return ""
    return (f"disturbed machine: {spd:.2f}× by wall time but {cpu:.2f}× by CPU time, more than "
            f"{CPU_WALL_GAP:.0%} apart; race it again on a quieter machine")


def calibrated_v(costs, rows: float | None) -> float | None:
    """v for a verify forward of `rows` tokens from the load's calibration, linear between its
    measured sizes; None beyond them (1..MAX_VERIFY_TOKENS) or without a calibration."""
    if costs is None or not rows or rows < 1 or rows > len(costs.verify_s):
        return None
    return v_at(verify_curve(costs), rows - 1)


# How far a run's own costs may sit from the calibration's before its timings are called disturbed.
# The shipped quiet recordings (assets/traces, the quicksort race; 2026-11-27): plain step 0.84-1.18×
# the calibration's, verify cost 0.64-0.92× the calibrated v at the same rows. Quiet minutes of one
# host drift further in milliseconds: plain steps 18.3-27.8 ms (docs/every_cpu.md), 1.52×.
STEP_SLOWER = 1.6  # above the quiet minutes' 1.52; issue 51's busy race ran its baseline at ~4×
VERIFY_DEARER = 1.5  # quiet runs sit below 1 (0.92 at most); issue 51's busy draft run measured v 3.46


def cost_drift_note(step: float | None, verify_cost: float | None, v_cal: float | None, costs,
                    rows: float | None = None) -> str:
    """'timings look disturbed: a plain step took 72 ms vs 29 ms at calibration' when this run's
    plain step or verify pass cost clearly more than the calibration measured; else ''. Any method:
    the costs do not depend on how the drafts were made."""
    if costs is None:
        return ""
    said = []
    if step and costs.plain_step_s and step > STEP_SLOWER * costs.plain_step_s:
        said.append(f"a plain step took {step * 1e3:.0f} ms vs {costs.plain_step_s * 1e3:.0f} ms "
                    "at calibration")
    if verify_cost and v_cal and verify_cost > VERIFY_DEARER * v_cal:
        said.append(f"a verify pass ({rows:.1f} tokens) cost {verify_cost:.2f} plain steps vs {v_cal:.2f} "
                    "at calibration")
    return "timings look disturbed: " + "; ".join(said) if said else ""


def _blank(st: Stats, names) -> None:
    """Fields an engine cannot measure (vLLM exposes no p/q): None (n/a), never 0; so is what they feed."""
    names = set(names)
    if names & {"alpha_hat", "c", "predicted"}:
        names |= {"predicted", "predicted_v", "best_gamma", "best_gamma_leviathan"}
    if "predicted_v" in names:
        st.predicted_v_basis = ""
    for name in names:
        setattr(st, name, None)
    if "c" in names:
        st.c_basis = ""
