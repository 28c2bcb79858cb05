"""Record & replay in the page.

* Every live run is recorded (specviz.run.trace.record around the race stream) and
  kept per browser session in `Records`; when it ends the page offers it as a
  JSON trace and a per-round CSV, and places it on the theory explorer.
* A replay plays a shipped trace (assets/traces/*.json) or an uploaded one through specviz.run.trace.replay
  at the recorded times, through the same PaneStream as a live run, under a banner that says it is not live.
"""
from __future__ import annotations

import atexit
import csv
import hashlib
import io
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr  # module level: handlers' `request: gr.Request` annotations must resolve

from ..engine.events import RoundEvent, RunSummary
from ..engine.proposers import REGISTRY
from ..machine import Lock
from ..run import isolation
from ..run.race import SIDES
from ..run.trace import Trace, event_time, headline, load_trace, replay, trace_costs
from . import inspector, render, theory
from .charts import all_charts
from .glossary import plain_weights, recorded_date
from .method_options import options_text
from .panes import PaneStream, message_outputs, page_error
from .state import RunView
from .tree_view import latest_tree_figure

TRACES_DIR = Path(__file__).resolve().parents[2] / "assets" / "traces"
YOUR_RUN = "your last run"
# the picker's choice for the visitor's own last live run (a visitor found Replay played a 2026-11-23
# recording after their run, and their own only by downloading its trace and uploading it again)
YOURS = "__your_last_run__"
YOURS_LABEL = "Your last run on this page"  # a page's session: a reload starts a new one
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
SPEEDS = [("1× (as recorded)", 1.0), ("2×", 2.0), ("5×", 5.0), ("20×", 20.0)]


# ---------------------------------------------------------------- traces


def method_label(method: str | None) -> str:
    """The registered label of a method ("draft model"), or its name for one this build lacks."""
    return REGISTRY[method].label if method in REGISTRY else (method or "?")


def load_for_replay(path) -> Trace:
    """A trace from a file, checked enough to replay; ValueError with a message
    a visitor understands otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError:
        raise ValueError("the trace file could not be read") from None
    if size > MAX_UPLOAD_BYTES:
        raise ValueError(f"the file is {size / 1e6:.0f} MB: a SpecViz trace is much smaller "
                         f"(limit {MAX_UPLOAD_BYTES // 1024 // 1024} MB)")
    try:
        tr = load_trace(path)
    except UnicodeDecodeError:
        raise ValueError("not a SpecViz trace: the file is not text (a trace is UTF-8 JSON)") from None
    except ValueError as e:  # load_trace's own message, or a bad field value
        msg = str(e)
        raise ValueError(msg if "trace" in msg else f"not a SpecViz trace: {msg}") from None
    except (AttributeError, TypeError) as e:  # valid JSON, wrong shape
        raise ValueError(f"not a SpecViz trace: {e}") from None
    if not isinstance(tr.meta, dict):
        raise ValueError("not a SpecViz trace: its meta is not an object")
    if not tr.events:
        raise ValueError("the trace holds no events")
    bad = {s for s, _ in tr.events} - set(SIDES)
    if bad:
        raise ValueError(f"not a SpecViz trace: unknown side {sorted(bad)[0]!r}")
    for _, ev in tr.events:
        t = event_time(ev)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1e6:
            raise ValueError(f"not a SpecViz trace: an event time is {t!r}, not seconds since the start")
    try:  # render it once, off screen: a field of the wrong type fails here, not mid-replay
        view = final_view(tr)
        snap = view.snapshot()
        render.stats_html(snap), render.run_info_html(snap)
        render.baseline_html(view.base.tokens), render.speculative_html(view.spec.rounds, view.method)
        all_charts(view), latest_tree_figure(view)
    except Exception as e:  # noqa: BLE001 - any malformed content: one readable message
        raise ValueError("not a SpecViz trace: a field has the wrong type or value "
                         f"({type(e).__name__}: {e})") from None
    return tr


def shipped() -> dict[str, Trace]:
    """The traces shipped in assets/traces, by file name (unreadable ones skipped)."""
    out = {}
    for p in sorted(TRACES_DIR.glob("*.json")):
        try:
            out[p.name] = load_for_replay(p)
        except ValueError:
            continue
    return out


def _method_text(settings: dict) -> str:
    """The method and its recorded settings: "token tree · shape 4-2-2-1"."""
    extra = options_text(settings.get("method"), settings.get("options"))
    return method_label(settings.get("method")) + (f" · {extra}" if extra else "")


def first_meta(traces: dict[str, Trace]) -> dict | None:
    """The metadata of the run the picker selects first (the busy banner offers it); None: none shipped."""
    return next(iter(traces.values())).meta if traces else None


def choice_label(name: str, tr: Trace) -> str:
    """The trace's label with the machine, precision and date it was recorded on, in plain words, each
    once (the shipped labels name the machine and the day: their precision is added; issue 71)."""
    m = tr.meta
    label, hw = m.get("label") or name, headline(m)["hardware"]
    date = recorded_date(m)
    parts = [] if hw.split(" (")[0] in label else [f"recorded on {m['hardware']}" if m.get("hardware")
                                                   else "recorded on another machine"]
    parts.append(plain_weights(m.get("precision") or "") or "precision not recorded")
    if not date or date not in label:
        parts.append(date or "date not recorded")
    return f"{label}  ·  {', '.join(parts)}"


def where_html(m: dict, settings: dict | None = None) -> str:
    """'<models>, <b>8-bit weights</b> (target int8 weights, …) on <b>AMD EPYC (2 cores)</b>, <date>': what
    a recording ran on, the precision in plain words first (its label behind them)."""
    h = headline(m, settings)
    words = plain_weights(m.get("precision") or "")
    prec = (f"<b>{render.esc(words)}</b> ({render.esc(h['precision'])})" if words
            else render.esc(h["precision"]))
    hw = render.esc(m["hardware"]) if m.get("hardware") else "another machine (not named in the recording)"
    return f"{render.esc(h['models'])}, {prec} on <b>{hw}</b>, {render.esc(h['date'])}"


def describe_html(tr: Trace, source: str) -> str:
    """What a trace holds, for the line under the replay controls."""
    m = tr.meta
    settings = m.get("settings") or {}
    sums = tr.summaries()
    base, spec = sums.get("baseline"), sums.get("speculative")
    res = ""
    if base is not None and spec is not None and base.tokens_per_s > 0:
        res = (f" Result: {spec.n_tokens} tokens, {base.tokens_per_s:.2f} → {spec.tokens_per_s:.2f} tokens/s "
               f"(<b>{spec.tokens_per_s / base.tokens_per_s:.2f}×</b>), that machine's timings, not this "
               "one's.")
    h = headline(m, settings)
    return (f"<div class='sv-runinfo'><span class='sv-mode'>{render.esc(source)}: "
            f"<b>{render.esc(m.get('label') or 'unlabelled')}</b>: {render.esc(_method_text(settings))}, "
            f"γ {render.esc(settings.get('gamma', '?'))}, {render.esc(h['sampling'])}, "
            f"{where_html(m, settings)}, "
            f"{render.esc(m.get('execution_mode') or 'fair')} mode.{res}</span></div>")


def banner_html(meta: dict, speed: float = 1.0) -> str:
    pace = "at the recorded pace" if speed == 1 else f"at {speed:g}× the recorded pace"
    label = meta.get("label")
    return (
        "<div class='sv-replay-banner' role='status'><b>▶ Replay</b> of a run recorded with "
        f"{where_html(meta)} — <b>not live</b>: that machine's timings, not this one's. Played {pace}"
        + (f"; “{render.esc(label)}”" if label else "") + ".</div>")


def view_for(tr: Trace) -> tuple[RunView, str]:
    """The RunView and pane head (prompt) a replay of `tr` starts from: the same
    as the recorded live run's."""
    m = tr.meta
    settings = m.get("settings") or {}
    spec = tr.summaries().get("speculative")
    gamma = settings.get("gamma") or (spec.gamma if spec is not None else 0) or 1
    prompt = str(settings.get("prompt") or "")
    chat = bool(settings.get("chat_template"))
    view = RunView(int(gamma), float(settings.get("temperature") or 0.0),
                   str(m.get("execution_mode") or "fair"),
                   prompt, chat)
    view.method = str(settings.get("method") or (spec.method if spec is not None else "draft"))
    view.gamma_auto = bool(settings.get("gamma_auto"))
    view.fresh_memory = bool(settings.get("fresh_memory"))
    view.reads_memory = bool(settings.get("scope")) and not view.fresh_memory
    view.shares_memory = view.reads_memory and settings.get("share_memory") is True
    opts = settings.get("options")  # older traces have none: the defaults ran
    view.options = dict(opts) if isinstance(opts, dict) else {}
    view.costs = trace_costs(tr)
    head = render.prompt_span(prompt, bool(m.get("chat_applied", chat)))
    return view, head


def ordered(events):
    """The replay order (by recorded time), without waiting."""
    return sorted(events, key=lambda se: (event_time(se[1]), isinstance(se[1], RunSummary)))


def final_view(tr: Trace) -> RunView:
    view, _ = view_for(tr)
    for side, ev in ordered(tr.events):
        view.add(side, ev)
    return view


def measured_from(tr: Trace, source: str = YOUR_RUN) -> theory.Measured | None:
    view = final_view(tr)
    return theory.Measured.from_stats(view.stats(), view.gamma, view.method, source)


def rounds_csv(tr: Trace) -> str:
    """One row per speculative round, with the running numbers the page showed
    after that round (α so far, measured and predicted speedup so far; the measured one is the
    baseline's time for as many tokens over this side's, as the chart draws it)."""
    view, _ = view_for(tr)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["round", "gamma", "accepted", "appended", "new_tokens", "t_start", "t_draft", "t_verify",
                "t_end", "draft_forwards", "total_tokens", "total_drafted", "total_accepted", "alpha_round",
                "alpha_so_far", "alpha_hat_so_far", "target_forwards", "spec_tokens_per_s",
                "baseline_tokens_by_t_end", "speedup_so_far", "predicted_so_far", "predicted_v_so_far",
                "draft_ids"])

    def f(x, d=6):
        return "" if x is None else round(x, d)

    rows = []  # (round, its speedup point, the running numbers after it)
    for side, ev in ordered(tr.events):
        view.add(side, ev)
        if side == "speculative" and isinstance(ev, RoundEvent):
            rows.append((ev, len(view.speedup_series) - 1, view.spec.books.overlap_sum))
    for ev, i, overlap in rows:  # the measured speedup is known once the baseline wrote as many tokens
        _, measured, predicted, predicted_v = view.speedup_series[i]
        appended = "none" if ev.appended_id == -1 else ("resampled" if ev.resampled else "bonus")
        base_n = sum(1 for t in view.base.tokens if t.t <= ev.t_end)
        w.writerow([ev.index + 1, ev.gamma, ev.n_accepted, appended, ev.n_new, f(ev.t_start), f(ev.t_draft),
                    f(ev.t_verify), f(ev.t_end), ev.draft_forwards, ev.total_tokens, ev.total_drafted,
                    ev.total_accepted, f(ev.n_accepted / ev.gamma if ev.gamma else None, 4),
                    f(ev.total_accepted / ev.total_drafted if ev.total_drafted else None, 4),
                    f(overlap / ev.total_drafted if ev.total_drafted else None, 4),
                    ev.target_forwards, f(ev.total_tokens / ev.t_end if ev.t_end > 0 else None, 4), base_n,
                    f(measured, 4), f(predicted, 4), f(predicted_v, 4), " ".join(map(str, ev.draft_ids))])
    return buf.getvalue()


def export(tr: Trace, folder: str | os.PathLike) -> tuple[Path, Path]:
    """Write the trace (JSON) and its per-round CSV into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("specviz-*"):  # one run's files per folder (gradio serves its own copies)
        old.unlink(missing_ok=True)
    stamp = str(tr.meta.get("recorded") or "run").replace(":", "").replace("+0000", "Z")[:17]
    stem = f"specviz-{stamp}"
    js = tr.save(folder / f"{stem}.json")
    cs = folder / f"{stem}-rounds.csv"
    cs.write_text(rounds_csv(tr))
    return js, cs


def play(tr: Trace, speed: float = 1.0, *, stop: threading.Event | None = None, chart_every: float = 0.5,
         ui_interval: float = 0.25, sleep=None) -> Iterator[list]:
    """The page's outputs while `tr` replays: the same PaneStream as a live run."""
    view, head = view_for(tr)
    panes = PaneStream(view, head, chart_every, ui_interval, banner=banner_html(tr.meta, speed),
                       guard=isolation.untimed_work)  # never render during a live fair race's timed step
    yield panes.outputs(charts=True)
    kw = {"sleep": sleep} if sleep is not None else {}
    yield from panes.follow(replay(tr.events, speed, stop=stop, **kw))
    if stop is not None and stop.is_set():
        # what a stopped live run shows: each side's numbers so far, state "stopped"
        for side in (view.base, view.spec):
            if side.summary is None and (side.tokens or side.rounds):
                side.summary = dc_replace(side.partial_summary(), stop_reason="stopped",
                                          method=view.method if side is view.spec else "plain")
        view.note = getattr(stop, "reason", "") or "replay stopped by you"
    yield panes.outputs(charts=True)


class Records:
    """The latest trace (live run or replay) of each browser session."""

    def __init__(self, keep: int = 64):
        self._lock = Lock()
        self._latest: OrderedDict[str, tuple[Trace, str]] = OrderedDict()
        self._live: dict[str, Trace] = {}  # each session's last live run: the picker's "your last run"
        self.keep = keep
        self.dir = tempfile.mkdtemp(prefix="specviz-traces-")
        atexit.register(shutil.rmtree, self.dir, ignore_errors=True)

    def folder(self, key: str) -> Path:
        """Where this session's downloads are written (one run's files at a time)."""
        return Path(self.dir) / hashlib.sha1(key.encode()).hexdigest()[:16]

    def put(self, key: str, tr: Trace, source: str = YOUR_RUN) -> None:
        with self._lock:
            self._latest[key] = (tr, source)
            self._latest.move_to_end(key)
            if source == YOUR_RUN:
                self._live[key] = tr
            while len(self._latest) > self.keep:  # a forgotten session's files go with it
                old, _ = self._latest.popitem(last=False)
                self._live.pop(old, None)
                shutil.rmtree(self.folder(old), ignore_errors=True)

    def live(self, key: str) -> Trace | None:
        """This session's last live run (a replay since does not replace it)."""
        with self._lock:
            return self._live.get(key)

    def get(self, key: str) -> tuple[Trace, str] | None:
        with self._lock:
            return self._latest.get(key)

    def latest(self) -> Trace | None:
        """The most recent trace of any session (the UI benchmark reads it)."""
        with self._lock:
            return next(reversed(self._latest.values()))[0] if self._latest else None


# ---------------------------------------------------------------- page


NOTE = ("Every run you make here is recorded: download it as a JSON trace (replayable below, on any machine) "
        "or as a per-round CSV. Each chart downloads itself as a PNG from its toolbar (hover the chart, "
        "click the camera icon).")


@dataclass
class ReplayBox:
    """The record & replay controls."""

    traces: dict[str, Trace]  # shipped traces by name
    pick: gr.Dropdown
    speed: gr.Radio
    upload: gr.File
    play: gr.Button
    stop: gr.Button
    dl_json: gr.DownloadButton
    dl_csv: gr.DownloadButton
    info: gr.HTML
    accordion: gr.Accordion | None = None  # collapsed once the models are ready (ui/handlers.poll)


def build_section() -> ReplayBox:
    """The record & replay controls (call inside the live tab)."""
    traces = shipped()
    choices = [(choice_label(n, t), n) for n, t in traces.items()]
    first = choices[0][1] if choices else None
    choices.append((YOURS_LABEL, YOURS))
    with gr.Accordion("Replay a recorded run · download yours", open=True, elem_id="sv-replay") as acc:
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                pick = gr.Dropdown(choices, value=first, label="Recorded runs",
                                   info="Runs of the default pair recorded for this page, each named by "
                                        "the machine, precision and date it ran on (their timings, not "
                                        "this machine's), or your own last run",
                                   elem_id="sv-replay-pick")
                speed = gr.Radio(SPEEDS, value=1.0, label="Replay speed", elem_id="sv-replay-speed")
            with gr.Column(scale=2):
                upload = gr.File(label="…or replay a trace file (.json)", file_types=[".json"],
                                 type="filepath", height=120, elem_id="sv-replay-upload")
        with gr.Row():
            play = gr.Button("▶ Replay", variant="primary", elem_id="sv-replay-play", scale=1)
            stop = gr.Button("■ Stop", variant="secondary", elem_id="sv-replay-stop", scale=1)
            dl_json = gr.DownloadButton("Download trace (JSON)", interactive=False, elem_id="sv-dl-trace",
                                        scale=1)
            dl_csv = gr.DownloadButton("Download per-round CSV", interactive=False, elem_id="sv-dl-csv",
                                       scale=1)
        info = gr.HTML(describe_html(traces[first], "Selected") if first else
                       "<div class='sv-runinfo'><span class='sv-mode'>No recorded runs shipped.</span></div>",
                       elem_id="sv-replay-info")
        gr.HTML(f"<div class='sv-runinfo'><span class='sv-mode'>{NOTE}</span></div>")
    return ReplayBox(traces, pick, speed, upload, play, stop, dl_json, dl_csv, info, acc)


@dataclass
class ReplayHandlers:
    """Replay, downloads and the theory overlay: the handlers, and the state they share."""

    traces: dict[str, Trace]
    records: Records
    sessions: object  # handlers.Sessions: one stop flag per browser session
    session_key: Callable
    stop_grace: float = 5.0
    max_seconds: float | None = None
    chart_every: float = 0.5
    ui_interval: float = 0.25

    def selected(self, choice, up, key: str = "") -> tuple[Trace, str]:
        if up:
            return load_for_replay(up), f"uploaded file {Path(up).name}"
        if choice == YOURS:
            tr = self.records.live(key)
            if tr is None:
                raise ValueError("no run of yours on this page yet (a reload starts afresh): press ▶ Run, "
                                 "then replay it here")
            return tr, YOUR_RUN
        if choice in self.traces:
            return self.traces[choice], "recorded run"
        raise ValueError("pick a recorded run or upload a trace file")

    def on_select(self, choice, up, request: gr.Request = None):
        try:
            tr, _ = self.selected(choice, up, self.session_key(request))
        except ValueError as e:
            if up:
                gr.Warning(render.toast_text(f"That file cannot be replayed: {e}"))
            return render.message_html(f"That file cannot be replayed: {e}" if up else str(e))
        return describe_html(tr, "Uploaded" if up else "Your last run" if choice == YOURS else "Selected")

    def yours(self, up, request: gr.Request = None):
        # after a live run: the picker on it and its line (a picker set to its own value fires no change)
        return gr.update(value=YOURS), self.on_select(YOURS, up, request)

    def _deadline(self, stop) -> threading.Timer | None:
        """Stops the replay at the server's time limit (None: no limit)."""
        if not self.max_seconds:
            return None
        limit = self.max_seconds

        def time_up():
            stop.reason = f"replay stopped at the server's time limit of {limit:.0f} s"
            stop.set()
        timer = threading.Timer(limit, time_up)
        timer.daemon = True
        timer.start()
        return timer

    def run_replay(self, choice, up, pace, request: gr.Request = None):
        key = self.session_key(request)
        try:
            tr, source = self.selected(choice, up, key)
            pace = float(pace or 1.0)
            if not 0.1 <= pace <= 1000:
                raise ValueError("the replay speed must be between 0.1 and 1000")
        except (ValueError, TypeError) as e:
            msg = f"Cannot replay: {e}" if not isinstance(e, TypeError) else "Cannot replay: bad speed"
            yield message_outputs(msg)
            raise page_error(msg) from None  # said in the run info line; the API caller gets the error
        stop, done = self.sessions.take(key, wait=self.stop_grace)  # stops this visitor's run or replay first
        self.records.put(key, tr, f"replay: {tr.meta.get('label') or source}")  # its files and theory point
        inspector.put_trace(key, tr)  # clicks on its tokens open the p/q inspector
        timer = self._deadline(stop)
        try:
            yield from play(tr, pace, stop=stop, chart_every=self.chart_every, ui_interval=self.ui_interval)
        finally:
            if timer is not None:
                timer.cancel()
            self.sessions.end(key, done)

    def after(self, alpha, gamma, c, vmode=None, request: gr.Request = None):
        """A run or replay ended: offer its files, place it on the theory charts."""
        got = self.records.get(self.session_key(request))
        if got is None:
            return [gr.skip(), gr.skip()] + [gr.skip()] * 5
        tr, source = got
        js, cs = export(tr, self.records.folder(self.session_key(request)))
        m = measured_from(tr, source)
        updates = theory.measured_updates(m, alpha, gamma, c, vmode or theory.V_MODES[0])
        spec = tr.summaries().get("speculative")
        if m is None and spec is not None and spec.rounds and not spec.drafted:
            updates[3] = theory.nothing_drafted_html(source)  # say why no point appears
        return [gr.DownloadButton(value=str(js), interactive=True),
                gr.DownloadButton(value=str(cs), interactive=True), *updates]

    def stop_click(self, request: gr.Request = None):
        self.sessions.stop(self.session_key(request), wait=self.stop_grace)


def wire(box: ReplayBox, th: theory.TheoryTab, handlers: ReplayHandlers, outputs: list,
         live_events: list) -> list:
    """Hook replay, downloads and the theory overlay to the page. `live_events`:
    the live run's events (their end updates the downloads and the theory tab).
    Returns the replay's events (for the page's Stop to cancel)."""
    quiet = dict(api_visibility="private", show_progress="hidden")
    after_in = [th.alpha, th.gamma, th.c, th.vmode]
    after_out = [box.dl_json, box.dl_csv, *th.measured_outputs()]
    for ev in live_events:
        ev.then(handlers.after, after_in, after_out, **quiet)
        ev.then(handlers.yours, box.upload, [box.pick, box.info], **quiet)  # Replay now plays it
    for source in (box.pick, box.upload):
        source.change(handlers.on_select, [box.pick, box.upload], box.info, queue=False, **quiet)
    play_event = box.play.click(handlers.run_replay, [box.pick, box.upload, box.speed], outputs,
                                api_name="replay", concurrency_limit=8, concurrency_id="replay",
                                trigger_mode="once", show_progress="hidden")
    play_event.then(handlers.after, after_in, after_out, **quiet)
    # a live run replaces a replay in the panes: its handler stops the session's replay first
    # (Sessions.take). A cancel on Run's click did it in the browser until 2026-11-28, but the page sent
    # it only once the run ended, and it then cancelled the replay a visitor had started meanwhile
    box.stop.click(handlers.stop_click, None, None, queue=False, **quiet) \
        .then(None, None, None, cancels=[play_event, *live_events], api_visibility="private")
    theory.wire(th)
    return [play_event]
