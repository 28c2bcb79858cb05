"""The speedup box: both sides' numbers, the measured speedup, its prediction and the metric chips.

Every prediction here is the theory's formula (engine/theory.py) applied to the costs the chips
beside it show, and its line names them and where they come from (issue 51).
"""
from __future__ import annotations

from ..engine.costs import MAX_VERIFY_TOKENS
from ..format import number
from .draft_source import FREE_DRAFTS
from .escape import esc
from .state import HOLD_ROUNDS, PREDICT_FROM
from .why_lost import cause_of, staged_text


def _cell(v) -> str:
    return f"<td>{v}</td>"


def stats_html(snap: dict) -> str:
    """The live numbers: one column per side, then the speculative statistics.

    `snap` is RunView.snapshot(): every value there is computed from events."""
    base, spec = snap["baseline"], snap["speculative"]

    def side_rows(d):
        return [
            ("tokens", f"{d['n_tokens']}"),
            ("elapsed", f"{d['elapsed']:.2f} s"),
            ("of it: prompt read", number(d.get("prompt_read"), "{:.2f} s", missing="–")),
            ("tokens/s", number(d["tokens_per_s"], "{:.2f}")),
            ("target forward passes", f"{d['target_forwards']}"),
            ("state", esc(d["state"])),
        ]

    rows = "".join(
        f"<tr><th scope='row'>{name}</th>{_cell(bv)}{_cell(sv)}</tr>"
        for (name, bv), (_, sv) in zip(side_rows(base), side_rows(spec), strict=True))
    if base.get("path") or spec.get("path"):  # on a GPU: graphs, or a run that went eager
        rows += (f"<tr><th scope='row'>forward path</th>{_cell(esc(base.get('path') or ''))}"
                 f"{_cell(esc(spec.get('path') or ''))}</tr>")
    st = snap["stats"]
    spd, sub = _speedup_text(snap)
    spd_cls = "" if spd is None else (" sv-good" if spd >= 1 else " sv-bad")
    num = number(spd, "{:.2f}×", missing="–") + copied_text(snap, spd)  # the share copied: part of it
    big = (f"<div class='sv-speedup{spd_cls}' title='speculative tokens/s ÷ baseline tokens/s'>"
           f"<span class='sv-speedup-num'>{num}</span>"
           f"<span class='sv-speedup-label'>{_label(snap, spd)}</span>"
           + after_prompt_html(snap, spd)
           + f"<span class='sv-speedup-sub'>{sub}</span>" + why_html(snap, spd) + memory_html(snap)
           + (f"<span class='sv-badge sv-badge-diff'>{esc(snap['disturbed'])}</span>" if snap.get("disturbed")
              else "") + "</div>")
    chips = "".join(
        f"<span class='sv-chip' title='{esc(tip)}'><b>{esc(name)}</b> {_unknown(v, fmt)}</span>"
        for name, v, fmt, tip in _metric_chips(st, snap.get("method") or ""))
    curve = v_curve_svg(st.get("v_curve"), st.get("v_basis") or "")
    return (
        "<div class='sv-stats'>" + big
        + "<table class='sv-table'><thead><tr><th><span class='sv-sr'>figure</span></th><th>baseline</th>"
        + "<th>speculative</th></tr></thead>"
        + f"<tbody>{rows}</tbody></table>"
        + f"<div class='sv-chips'>{chips}{curve}</div></div>"
    )


def why_html(snap: dict, spd: float | None) -> str:
    """A finished run's measured cause of a loss or a small gain, in one sentence (ui/why_lost.py), and a
    staged run's lookup part; '' while it runs, and for a run with no headline."""
    if not snap.get("finished") or snap.get("error") or spd is None:
        return ""
    st = snap.get("stats") or {}
    lines = [cause_of(st, bool(snap.get("tree")), snap.get("gamma")),
             staged_text(snap.get("staged"), bool(snap.get("greedy")))]
    return "".join(f"<span class='sv-speedup-why'>{esc(x)}</span>" for x in lines if x)


def _speedup_text(snap: dict) -> tuple[float | None, str]:
    """(the headline, measured speedup, or None while held back or too short; the line under it)."""
    st = snap["stats"]
    if snap.get("error"):  # said in the run info line alone (issue 71)
        return None, ""
    rounds = st.get("rounds") or 0
    if rounds < HOLD_ROUNDS and not snap.get("finished"):
        return None, f"shown after {HOLD_ROUNDS} rounds (round 1 also reads the prompt)"
    why = _no_chain_text(snap) if snap.get("method") in FREE_DRAFTS else \
        _prediction_text(st, bool(snap.get("tree")), snap)
    if rounds < HOLD_ROUNDS:
        return None, _caveat(snap) + _too_short(snap, rounds) + " · " + why
    return st.get("speedup"), _caveat(snap) + why


def _label(snap: dict, spd: float | None) -> str:
    """The line under the big number: what it is, or why a finished run has none."""
    if spd is None and snap.get("finished") and not snap.get("error"):
        return f"no headline: fewer than {HOLD_ROUNDS} rounds"
    return "measured speedup, prompt read included" if spd is not None else "measured speedup"


def after_prompt_html(snap: dict, spd: float | None) -> str:
    """The other figure beside the headline: the speedup with both sides' prompt read left out
    (engine/metrics.after_prompt_speedup), once there is a headline."""
    other = (snap.get("stats") or {}).get("after_prompt")
    if spd is None or other is None:
        return ""
    return (f"<span class='sv-speedup-alt' title='each side timed from the end of its prompt read: plain "
            f"after its first token, the speculative side after round 1'>{other:.2f}× without the prompt "
            f"read</span>")


def _too_short(snap: dict, rounds: int) -> str:
    """A finished run of fewer than HOLD_ROUNDS rounds: its numbers, with the reason they are no
    headline (issue 71: a 1-token run's ratio is one target pass each, mostly the prompt's read)."""
    base, spec, st = snap.get("baseline") or {}, snap.get("speculative") or {}, snap.get("stats") or {}
    spd, b, s = st.get("speedup"), base.get("tokens_per_s"), spec.get("tokens_per_s")
    ratio = (f" · measured {number(spd, '{:.2f}×')} (speculative {number(s, '{:.2f}')} ÷ baseline "
             f"{number(b, '{:.2f}')} tokens/s), not a speedup" if spd is not None else "")
    return (f"{rounds} round{'s' * (rounds != 1)} only, which also read the prompt: too short for a "
            f"headline (shown from {HOLD_ROUNDS} rounds){ratio}")


def _caveat(snap: dict) -> str:
    """What a finished number rests on when it is not a whole run's rate: a run the visitor stopped
    (each side's rate over the tokens it had made)."""
    if not snap.get("finished"):
        return ""
    base, spec = snap.get("baseline") or {}, snap.get("speculative") or {}
    if "stopped" in (base.get("state"), spec.get("state")):
        return (f"stopped by you: each side's tokens/s over the tokens it had made (baseline "
                f"{base.get('n_tokens', 0)}, speculative {spec.get('n_tokens', 0)}) · ")
    return ""


def _no_chain_text(snap: dict) -> str:
    """Why a suffix or hybrid run has no prediction, in the terms of the rounds it ran (issue 59: a
    hybrid's box said drafts copied from text cost no draft steps, while its draft model ran at c 0.90)."""
    n = snap.get("drafters") or {}
    copied, model = n.get("suffix", 0), n.get("model", 0)
    if not model:
        return ("no prediction: drafts copied from text cost no draft steps, and the chain formula prices "
                "a draft model's γ·c each round")
    c, plain = (snap["stats"] or {}).get("c"), n.get("none", 0)
    # every round named: a visitor read "8 copied and 1 ran the draft model" beside a rounds chip of 10
    parts = [f"{copied} round{'s' * (copied != 1)} copied text (no draft step)",
             f"{model} ran the draft model" + (f" (c {c:.3f})" if c else "")]
    if plain:
        parts.append(f"{plain} drafted nothing (a plain step)")
    listed = ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"no prediction: {listed}; the chain formula prices one drafter every round"


def _prediction_text(st: dict, tree: bool, snap: dict | None = None) -> str:
    """The prediction with the α̂, γ, c and v it used, as values, each the chip beside it (issue 51: a
    lookahead run's box had priced v at the calibration's γ drafted 1.36 while its forwards verified ~24
    rows; issue 59: a draft run's box named where v came from, not its value, nor which γ)."""
    pv, pl = st.get("predicted_v"), st.get("predicted")
    lev = f"{number(pl, '{:.2f}×')} by Leviathan (v = 1)"
    basis = st.get("predicted_v_basis")
    if pv is not None or pl is not None:
        a, g, c = st.get("alpha_hat"), st.get("gamma_mean"), st.get("c")
        used = f"α̂ {a:.3f}, γ {g:.2f}, c {c:.3f}"
        why = _gamma_why(g, snap or {})
        if pv is None:
            return f"predicted {lev} at {used}{why}"
        v = st.get("verify_cost") if basis == "this run" else st.get("verify_cost_calibrated")
        where = "measured in this run" if basis == "this run" else "at calibration (no verify pass timed yet)"
        return f"predicted {pv:.2f}× at {used}, v {v:.2f} {where} · {lev}{why}"
    if tree:
        return "no prediction: the chain formula (1 − α̂^(γ+1)) / (1 − α̂) does not describe a token tree"
    if st.get("alpha_hat") is None:
        return "predicted –"
    if st.get("c") is None:
        return "predicted –: no draft step timed yet (c unknown)"
    if (st.get("rounds") or 0) < PREDICT_FROM:
        return f"predicted –: from round {PREDICT_FROM} on (the first rounds' α̂ rests on a few tokens)"
    return "predicted –"


# what else shortens the rounds of the methods that draft from the target's states
STATES_SHORT = {"heads": ", and the heads draft at most K, their number",
                "eagle": ", and the head's chain stops once the product of its drafts' confidences falls "
                         "below its stop"}


def _gamma_why(g: float | None, snap: dict) -> str:
    """Which γ the formula took when it is not the γ the visitor set: the mean drafted per round, so
    that it prices the rounds this run had; and why they drafted fewer."""
    want = snap.get("gamma")
    if g is None or not want or abs(g - want) < 0.005:
        return ""
    if snap.get("gamma_auto"):
        why = f"auto γ picked each round's, up to {want}"
    elif snap.get("method") == "adaptive":
        why = f"adaptive γ moved it each round, from {want}"
    elif snap.get("method") in ("draft", "early-exit", "layer-skip"):
        why = f"you set {want}; rounds near the token limit or an end of text draft fewer"
    elif snap.get("method") in STATES_SHORT:  # they read the states of the target's last forward
        why = (f"you set {want}; round 1 drafts nothing (no target states yet), rounds near the token "
               "limit or an end of text draft fewer" + STATES_SHORT[snap["method"]])
    else:
        why = f"you set {want}; this method's drafts vary in length"
    return f" · γ {g:.2f} = the mean drafted per round ({why})"


def _unknown(x, fmt: str) -> str:
    """A number, or "–" while it is not measured yet (never a made-up 0)."""
    return "–" if x is None else number(x, fmt)


C_BASIS = {
    "baseline": "time of one draft step ÷ one plain target step of the baseline",
    "calibration": "time of one draft step ÷ one plain target step measured when the models loaded",
    "verify pass": "time of one draft step ÷ one verify pass (γ+1 tokens): no plain target step "
                   "measured yet",
    "no draft model": "this method drafts without a model: no draft forward passes, c = 0",
}


# The two acceptance measures, one name each, used alike in the chips, the charts and the CLI.
ALPHA_HAT_NAME = "α̂ expected acceptance"
ALPHA_HAT_TIP = ("mean over drafted positions of Σ min(p, q): the chance the accept test passes given the "
                 "prefix (Leviathan et al.'s α); the predictions use it")
ACCEPT_RATE_NAME = "accepted ÷ drafted"
ACCEPT_RATE_TIP = ("the share of drafted tokens kept. In a chain, drafts after the first "
                   "rejection were never tested and count as not kept, so it tends to sit below α̂; a "
                   "token tree counts its nodes otherwise, and there it can exceed α̂")


def _metric_chips(st: dict, method: str = "") -> list:
    c_tip = C_BASIS.get(st.get("c_basis") or "", "not measured yet: no draft forward has been timed "
                        "(round 1 reads the prompt and counts as prefill)")
    v_src = st.get("v_basis") or "not measured"
    r = st.get("verify_rows")
    rows = "γ+1 tokens" if r is None else f"{r:.1f} tokens" + (
        ": its n-gram guesses and Jacobi window, not its drafted tokens" if method == "lookahead"
        else "")
    return [
        (ALPHA_HAT_NAME, st.get("alpha_hat"), "{:.3f}", ALPHA_HAT_TIP),
        (ACCEPT_RATE_NAME, st.get("alpha"), "{:.3f}", ACCEPT_RATE_TIP),
        ("τ", st.get("tau"), "{:.2f}", "output tokens per target forward pass (per round)"),
        ("c" + (" (÷ verify pass)" if st.get("c_basis") == "verify pass" else ""), st.get("c"), "{:.3f}",
         c_tip),
        ("γ drafted", st.get("gamma_mean"), "{:.2f}",
         "mean tokens drafted per round: the γ the predictions use (adaptive γ, lookup and the last round "
         "differ from the requested γ)"),
        ("rounds", st.get("rounds"), "{}", "verification rounds so far"),
        _v_chip(st, rows),
        ("best γ", st.get("best_gamma"), "{}",
         f"γ that maximises (1−α̂^(γ+1)) / ((1−α̂)(γc + v(γ))), v(γ) from {v_src}"),
        ("best γ (v = 1)", st.get("best_gamma_leviathan"), "{}",
         "γ that maximises Leviathan's prediction, which assumes a verify pass costs one plain step"),
    ]


def _v_chip(st: dict, rows: str) -> tuple:
    """One v: this run's measured verify cost, or the calibration's at the same rows before a verify pass
    was timed: the one the prediction uses (issue 59: "v 1.00" beside "v at calibration 1.18" left
    "which v?" open). The other is in its hover."""
    v, cal = st.get("verify_cost"), st.get("verify_cost_calibrated")
    if v is not None:
        tip = (f"time of one verification pass ({rows} at once) in plain target steps, measured in this "
               "run; the prediction uses it (Leviathan's formula assumes 1). "
               + (f"At calibration the same pass cost {cal:.2f}: a measured v far above it means other work "
                  "on the machine slowed this run" if cal is not None else
                  f"Not timed at calibration (passes of up to {MAX_VERIFY_TOKENS} tokens), or none ran"))
        return "verify cost v", v, "{:.2f} steps · this run", tip
    if cal is not None:
        return ("verify cost v", cal, "{:.2f} steps · calibration",
                f"the same pass ({rows} at once) timed when the models loaded, in plain target steps: no "
                "verify pass of this run timed yet (round 1 reads the prompt); the prediction uses it")
    return ("verify cost v", None, "{:.2f}", f"not measured yet: no verify pass ({rows}) of this run timed, "
            f"and the calibration times passes of up to {MAX_VERIFY_TOKENS} tokens, or none ran")


def copied_text(snap: dict, spd: float | None) -> str:
    """Part of the big number itself when the run copied from earlier runs (issue 71: a new session's
    first suffix run of a preset read 3.40×, 78 of 96 tokens copied from other visitors' runs, and the
    note below the number was what no one read): "3.40× · 78 of 96 tokens copied from earlier runs"."""
    mem = snap.get("memory") or {}
    n, total = mem.get("copied") or 0, mem.get("tokens") or 0
    if spd is None or not n:
        return ""
    return (f"<span class='sv-speedup-copied' title='accepted drafts copied from earlier runs&#39; "
            f"outputs, not from this run&#39;s prompt or output'> · {n} of {total} tokens copied from "
            f"earlier runs</span>")


def memory_html(snap: dict) -> str:
    """The box's word on copying from earlier runs (issue 59: the hybrid on a preset went from
    1.54× to 2.31× on its second run, only a hover card said why): how many of the run's tokens were
    accepted drafts copied from earlier runs' outputs, whose runs those are (this session's, and other
    visitors' runs of the presets only with share memory on), and the fair comparison one click away."""
    mem = snap.get("memory")
    if not mem:
        return ""
    if mem.get("fresh"):
        return ("<span class='sv-speedup-mem sv-mem-fresh'>fresh memory: copied from this run's prompt and "
                "output only</span>")
    n, total = mem.get("copied") or 0, mem.get("tokens") or 0
    if not (n or mem.get("reads")):
        return ""  # a run with no memory to read (a race of all methods, the CLI): its own text only
    cls = " sv-mem-copied" if n else ""
    whose = (" (yours, and other visitors' runs of the presets: “share memory” is on)" if mem.get("shared")
             else " (this session's own)")
    tail = (": tick “fresh memory” under Run for a fair comparison" if n else
            ", which it may copy from: “fresh memory” under Run turns that off")
    return (f"<span class='sv-speedup-mem{cls}' title='accepted drafts whose source was an earlier run&#39;s "
            f"output, not this run&#39;s prompt or output'><b>{n} of {total} tokens</b> copied "
            f"from earlier runs{whose}{tail}</span>")


def v_curve_svg(curve, basis: str = "", w: int = 110, h: int = 30) -> str:
    """A small inline chart of v(k), k = 0..16: verify cost in plain target steps."""
    if not curve:
        return ""
    top = max(max(curve), 1.0) * 1.1
    pts = " ".join(f"{4 + (w - 8) * k / (len(curve) - 1):.1f},{h - 4 - (h - 12) * v / top:.1f}"
                   for k, v in enumerate(curve))
    one = h - 4 - (h - 12) / top
    tip = (f"v(k): a verify pass of k drafts (k+1 tokens) in plain target steps, k = 0..{len(curve) - 1}; "
           f"from {basis}. v(1) = {curve[1]:.2f}, v({len(curve) - 1}) = {curve[-1]:.2f}. Dotted: v = 1.")
    return (f"<span class='sv-chip sv-vcurve' title='{esc(tip)}'><b>v(k)</b> "
            f"<svg width='{w}' height='{h}' viewBox='0 0 {w} {h}' role='img' aria-label='{esc(tip)}'>"
            f"<line x1='4' x2='{w - 4}' y1='{one:.1f}' y2='{one:.1f}' stroke='currentColor' "
            f"stroke-opacity='.4' stroke-dasharray='2 2'/>"
            f"<polyline fill='none' stroke='#CC79A7' stroke-width='2' points='{pts}'/>"
            f"</svg><span>v(1) {curve[1]:.2f} · v({len(curve) - 1}) {curve[-1]:.1f}</span></span>")
