"""Is this machine busy, and where is the calibration: the lines under the status.

A Space on shared CPU, or a laptop running other work, makes every timing on
the page unreliable (issue 21: a busy 2-core machine swung round 1's speedup to
5.82×). The page says so plainly and offers the replay picked below, named by
the machine, precision and date it was recorded on (its own metadata: issue 71,
"the true timings" were a 2026-11-23 int8 run on another machine). "Busy" is
the CPU time other processes took over the last few seconds (/proc/stat minus
this process), so our own runs never count; without /proc it
falls back to the 1-minute load per core. The calibration's own noise (a
cached measurement taken under load) counts too.
"""
from __future__ import annotations

from ..machine import CpuMeter
from ..run.leaderboard import END, START
from .glossary import recorded_on
from .render import esc

METER = CpuMeter()


def busy_reason(status: dict, meter: CpuMeter = METER) -> str:
    """Why timings are unreliable now, or ""."""
    if meter.busy():
        return (f"other programs use {meter.others:.1f} of this machine's {meter.cores} cores")
    if status.get("calibration") == "noisy" and (status.get("calib") or {}).get("state") != "done":
        return "the timing calibration was measured while the machine was busy"
    return ""


def note_race(board, key: str, side: str) -> None:
    """For the race of all methods (the page and the CLI): a race's START resets the meter's window;
    its END reads what other programs took meanwhile, and a busy reading goes into the board (its
    row says so, the bundle keeps it). Other events: nothing."""
    if side not in (START, END):
        return
    METER.sample()
    if side == END and METER.busy():
        board.note_busy(key, busy_reason({}))


def replay_offer(meta: dict | None) -> str:
    """The banner's offer of a replay: the recording's machine, precision and date in plain words, and
    that its timings are that machine's; '' when there is no recording to offer (None)."""
    if meta is None:
        return ""
    return (f" ▶ Replay below plays a run {recorded_on(meta)}: that machine's timings, not this "
            "one's.")


OFFER_BUTTON = "▶ Replay a recorded run (another machine's timings)"


def busy_html(reason: str, offer: dict | None = None) -> str:
    """The banner; `offer`: the metadata of the recording the replay button plays (None: no offer)."""
    if not reason:
        return ""
    # a phone shows the first sentence only (ui/stage.py CSS: .sv-busy-more), so Run stays on its
    # first screen (issue 59: at 400 px the banner pushed it just below); the replay offer follows
    more = replay_offer(offer)
    return ("<div class='sv-status sv-status-warning sv-busy' role='status' id='sv-busy-banner' "
            f"title='{esc(reason)}'><span class='sv-dot sv-dot-warning'></span><b>This machine is busy</b>"
            f"<span class='sv-busy-more'> ({esc(reason)})</span>: tokens/s, speedups, c and v measured now "
            "are unreliable." + (f"<span class='sv-busy-more'>{esc(more)}</span>" if more else "") + "</div>")


def calib_html(status: dict) -> str:
    """One line: the background calibration's state, or the untimed default in service."""
    c = status.get("calib") or {}
    prec = esc(status.get("precision") or "")
    state = c.get("state")
    if state == "running":
        left = max(0.0, (c.get("budget") or 0) - (c.get("elapsed") or 0))
        # as the pair line above says (ui/glossary.py plain_precision): a noisy earlier timing, or none
        why = ("timed earlier while the machine was busy, so timed again now"
               if status.get("calibration") == "noisy" else "a safe default, not timed yet")
        return ("<small class='sv-calib'>⏱ Calibrating timings in the background: "
                f"{esc(c.get('step') or '')} "
                f"({c.get('elapsed', 0):.0f} s, at most {left:.0f} s more). Runs use {prec} meanwhile "
                f"({why}).</small>")
    if state == "done":
        return ("<small class='sv-calib'>✓ Calibrated in the background; the measured precision now "
                "serves.</small>")
    if state in ("stopped", "failed", "skipped"):
        return (f"<small class='sv-calib'>Background calibration {esc(state)} ({esc(c.get('step') or '')}); "
                f"runs keep {prec}, not timed.</small>")
    if status.get("calibration") == "untimed":
        why = " (--no-calibrate)" if status.get("calibration_mode") == "off" else ""
        return (f"<small class='sv-calib'>Precision {prec} is a safe default, not timed on this "
                f"machine{why}.</small>")
    return ""
