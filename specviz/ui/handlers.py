"""What the page does when a visitor acts: one method per event, no layout.

Handlers get and return component values; ui/layout.py builds the components
and ui/blocks.py wires them together. Only events reach this module (through
specviz.run.race); HTML comes from render.py, figures from charts.py.
"""
from __future__ import annotations

import inspect
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field

import gradio as gr

from ..calibration.selfspec import pending, resolve_options
from ..engine.cpu.threads import settle
from ..engine.pair import OURS
from ..engine.suffix_tree import MEMORY
from ..errors import ModelError, free_memory, run_error_text
from ..hosting import forked
from ..hosting.forked import Bridge
from ..hosting.spaces import ZEROGPU_FIXED, gpu_decorator, on_zerogpu
from ..machine import Lock
from ..models import PairSpec, available_pairs, resolve_pair
from ..models.gpu_path import prepare_call
from ..run import isolation
from ..run.race import MODES, RaceInfo, race
from ..run.request import Limits, RequestError, encode_prompt, make_request
from ..run.trace import record, trace_for
from . import busy, inspector, live, method_options, render, trained
from . import replay as replay_ui
from .loader import ModelManager
from .panes import PaneStream, calibrating_outputs, failed_outputs, page_error
from .runqueue import RunQueue
from .state import RunView

UI_INTERVAL = live.UI_INTERVAL  # seconds between page updates while a run streams (≤ 4/s)
# fair mode: seconds to wait, after the run's first update (its empty charts), before the engines start:
# a browser on these cores draws it meanwhile (engine/cpu/threads.settle; later updates: ui/live.py).
# Why 0.35: headless Chromium on the same 2 cores (Zen 4, 2026-11-29) drew that update at 1.1-1.8 cores
# for ~0.25 s and 0.4 for the next 0.25 s, after the 0.1 s wait had ended: plain's prompt read, the
# race's first step, met it. 12 interleaved pairs of a browser and an API run with 0.35: plain's steps
# 1.26x and the speculative side's 1.27x their API times (with 0.1: 1.26x and 1.22x, 1.28x and 1.22x in
# two samples of 16: the headline read 2-9 % high); a run's wall time 1.19-1.28x the sides' sum.
SETTLE = float(os.environ.get("SPECVIZ_UI_SETTLE", 0.35))
# the boxes under Run for the methods that copy from earlier runs (suffix, hybrid), after the method
# settings among /run's inputs: fresh memory (no earlier run), share memory (other visitors' preset runs)
MEMORY_BOXES = ("fresh_memory", "share_memory")
STOP_GRACE = 5.0  # Stop waits this long for the run to end cleanly before cancelling it
TINY = "tiny"
CUSTOM = "custom"
CLI = "cli"


@dataclass
class PairChoices:
    """The pair picker's entries: (label, key) plus how to build each spec."""

    specs: dict[str, PairSpec] = field(default_factory=dict)
    labels: list[tuple[str, str]] = field(default_factory=list)
    initial: str | None = None

    def add(self, key: str, spec: PairSpec | None, label: str) -> None:
        if spec is not None:
            self.specs[key] = spec
        self.labels.append((label, key))


def pair_choices(initial: PairSpec | None, network: bool | None = None) -> PairChoices:
    choices = PairChoices()
    if initial is not None and initial.name not in {p.name for p in available_pairs(network)}:
        # the default pair from the Hub (a Space without the embedded packages) keeps its own label
        label = initial.label if initial.name == "default" else f"Command line: {initial.label}"
        choices.add(CLI, initial, label)
    for p in available_pairs(network):
        choices.add(p.name, p, p.label)
    choices.add(TINY, None, "Tiny random pair (loads instantly, writes gibberish; for testing)")
    choices.add(CUSTOM, None, "Custom: type a target and a draft below")
    if initial is not None:
        choices.initial = CLI if CLI in choices.specs else initial.name
    return choices


_tiny_dir: str | None = None


def tiny_spec() -> PairSpec:
    global _tiny_dir
    from ..models.tiny import save_tiny_pair
    if _tiny_dir is None:
        folder = tempfile.mkdtemp(prefix="specviz-tiny-")
        save_tiny_pair(folder)
        _tiny_dir = folder
    spec = resolve_pair("custom", f"{_tiny_dir}/target", f"{_tiny_dir}/draft", allow_local_paths=True)
    return PairSpec(TINY, spec.target, spec.draft, "Tiny random pair (testing)", True)


class Sessions:
    """Stop flags per browser session (Stop must only stop its own run). On ZeroGPU a run goes on in a
    forked process: Stop there travels as the bridge's flag (hosting/forked.py)."""

    def __init__(self, bridge: Bridge | None = None):
        self._lock = Lock()
        self._runs: dict[str, tuple[threading.Event, threading.Event]] = {}
        self.bridge = bridge

    def begin(self, key: str) -> tuple[threading.Event, threading.Event]:
        stop, done = threading.Event(), threading.Event()
        with self._lock:
            self._runs[key] = (stop, done)
        if self.bridge is not None and self.bridge.is_open(key):  # inside a forked call: the page's Stop
            self.bridge.watch_stop(key, stop, done)
        return stop, done

    def take(self, key: str, wait: float = 0.0) -> tuple[threading.Event, threading.Event]:
        """begin(key), after stopping what the session ran (a replay playing into the same panes: it
        went on, and its frames and the run's took turns on the page until the later one ended)."""
        self.stop(key, wait)
        return self.begin(key)

    def end(self, key: str, done: threading.Event) -> None:
        done.set()
        with self._lock:
            if self._runs.get(key, (None, None))[1] is done:
                del self._runs[key]

    def stop(self, key: str, wait: float = 0.0) -> bool:
        with self._lock:
            run = self._runs.get(key)
        if run is None:
            return False
        run[0].set()
        if self.bridge is not None:  # the run itself is in a forked process (ZeroGPU)
            self.bridge.ask_stop(key)
        run[1].wait(wait)
        return True


def expected(err: BaseException) -> bool:
    """A visitor's mistake or running out of memory: one line in the log, no traceback (bugs keep theirs)."""
    from ..errors import is_oom
    return isinstance(err, (RequestError, ModelError)) or is_oom(err)


def _also(note: str, more: str) -> str:
    return f"{note}; {more}" if note else more


def remember(key: str, docs: list) -> None:
    """Outputs a forked run wrote into the suffix drafters' memory, into this process's (hosting/forked)."""
    for scope, label, tokens in docs:
        MEMORY.add(scope, label, tokens, time.monotonic())


def request_key(args: tuple, kwargs: dict) -> str:
    """The session key of a handler's call, from its gr.Request (the last argument, or by name)."""
    request = kwargs.get("request", next((a for a in reversed(args) if isinstance(a, gr.Request)), None))
    return session_key(request)


def session_key(request: gr.Request | None) -> str:
    # a plain HTTP API call may come without a session: give it a key of its own, so
    # that two such callers never share a Stop flag or a recorded run
    return getattr(request, "session_hash", None) or f"anonymous-{uuid.uuid4().hex}"


def run_button_props(status: dict) -> dict:
    if status["ready"]:
        return dict(value="▶ Run", interactive=True)
    if status["loading"]:
        return dict(value="loading models…", interactive=False)
    return dict(value="no models loaded", interactive=False)


def button_state(status: dict):
    return gr.Button(**run_button_props(status))


@dataclass
class Handlers:
    """The page's event handlers and the server state they share."""

    manager: ModelManager
    limits: Limits
    presets: list[dict]
    choices: PairChoices
    allow_local_paths: bool = False
    fixed_pair: bool = False
    sessions: Sessions | None = None  # made with the bridge
    records: replay_ui.Records = field(default_factory=replay_ui.Records)  # each session's latest run
    queue: RunQueue = field(default_factory=RunQueue)  # who pressed Run, who runs (ui/runqueue.py)
    _ready_seen: set = field(default_factory=set)  # sessions whose replay section was collapsed once
    # what a run gives the page's stores, across ZeroGPU's fork (hosting/forked.py); off ZeroGPU at once
    bridge: Bridge = field(default_factory=Bridge)
    # the metadata of the recording the busy banner's replay button plays (the picker's first shipped
    # run; ui/blocks.py sets it), None: no recording to offer
    replay_offer: dict | None = None

    def __post_init__(self):
        self.sessions = self.sessions or Sessions(self.bridge)
        self.bridge.register("trace", lambda key, tr: self.records.put(key, tr))  # records may be replaced
        self.bridge.register("rounds", inspector.LATEST.put)
        self.bridge.register("queue_start", self.queue.start)
        self.bridge.register("queue_end", self.queue.end)
        # a forked run's outputs for the suffix drafters' memory: a fresh fork copies the page's memory
        self.bridge.register("memory", remember)

    def gpu_call(self, handler, max_tokens_arg: int, methods_arg: int | None = None):
        """handler as the page calls it: on ZeroGPU one borrowed GPU call in a forked process, bridged
        (its stores and Stop reach the page's process); elsewhere handler itself."""
        decorate = gpu_decorator(self.limits, max_tokens_arg=max_tokens_arg, methods_arg=methods_arg)
        if not on_zerogpu():
            return decorate(handler)
        return forked.wrap(self.bridge, handler, decorate, request_key,
                           lambda key: self.sessions.take(key, wait=STOP_GRACE), self.sessions.end)

    def status_line(self, status: dict) -> tuple[str, str]:
        """(status box with the calibration's line, the busy banner's reason)."""
        busy.METER.sample()
        line = busy.calib_html(status) if status["ready"] else ""
        reason = busy.busy_reason(status) if status["ready"] else ""
        return render.status_html(status, line) + busy.busy_html(reason, self.replay_offer), reason

    def poll(self, request: gr.Request = None):
        """Status, Run button, timer, the busy banner's replay offer, the replay section (collapsed
        once the models are ready, once per session: a visitor may open it again), the methods."""
        return self._poll(request)[:-1]

    def poll_race(self, request: gr.Request = None):
        """poll, then the race tab's methods (ui/blocks.py wires this one where the page has the tab)."""
        return self._poll(request)

    def _poll(self, request):
        key = session_key(request)
        status = self.manager.status(key)
        html, reason = self.status_line(status)
        btn = self.queue.button(key, status["ready"]) if status["ready"] or self.queue.busy(key) else None
        running = self.queue.busy(key)
        calibrating = (status.get("calib") or {}).get("state") == "running"
        every = 0.5 if status["loading"] else 1.0 if (running or calibrating) else 5.0
        fold = methods = race = gr.skip()
        if status["ready"] and key not in self._ready_seen:
            self._ready_seen.add(key)
            have = self.trained_methods()
            fold, methods = gr.Accordion(open=False), gr.Radio(choices=self.method_choices(have))
            from .trained import methods_update
            race = methods_update(have)
        return (html, btn or button_state(status), gr.Timer(value=every, active=True),
                gr.Button(visible=bool(reason) and self.replay_offer is not None), fold, methods, race)

    def trained_methods(self) -> frozenset:
        """The trained methods (Medusa heads, EAGLE) whose file the loaded pair's target has: shipped
        or trained here (engine/trained/store.py find); none where looking fails."""
        try:
            return trained.found(self.manager.pair)
        except Exception:  # noqa: BLE001 - no pair, or a target the heads cannot read: not offered
            return frozenset()

    def method_choices(self, have=None) -> list:
        """The live tab's methods: the trained ones only where the loaded pair has their file."""
        return method_options.method_choices(self.trained_methods() if have is None else have)

    def on_method(self, method):
        """The picked method's settings, its note for the loaded pair (ui/method_options.py on_method)."""
        return method_options.on_method(method, self.manager.pair)

    def run_pressed(self, request: gr.Request = None):
        key = session_key(request)
        self.queue.press(key)
        return gr.Button(value=self.queue.label(key) or "Running…", interactive=False), gr.Timer(1.0)

    def run_ended(self, request: gr.Request = None):
        self.queue.end(session_key(request))
        return button_state(self.manager.status(session_key(request)))

    def on_preset(self, name):
        preset = next((p for p in self.presets if p["name"] == name), None)
        if preset is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return (preset["prompt"], preset["gamma"], min(preset["max_new_tokens"], self.limits.max_new_tokens),
                preset["chat_template"])

    def on_pair_pick(self, key):
        return gr.update(visible=key == CUSTOM)

    def _spec_for(self, key, target, draft) -> PairSpec:
        if self.fixed_pair:
            raise ModelError("The model pair is fixed on this server: it cannot be changed from the page."
                             + (f" {ZEROGPU_FIXED}" if on_zerogpu() else ""))
        if not key or not isinstance(key, str):
            raise ModelError("Pick a model pair in the list first.")
        if key == CUSTOM:
            return resolve_pair("custom", target, draft, allow_local_paths=self.allow_local_paths)
        if key == TINY:
            return tiny_spec()
        if key in self.choices.specs:
            return self.choices.specs[key]
        return resolve_pair(key, None, None, allow_local_paths=self.allow_local_paths)

    def load_pair_click(self, key, target, draft, request: gr.Request = None):
        try:
            spec = self._spec_for(key, target, draft)
        except ModelError as e:
            gr.Warning(render.toast_text(e))
            status = self.manager.status(session_key(request))
            return (render.message_html(str(e)) + render.status_html(status), button_state(status),
                    gr.Timer(active=False))
        if isolation.race_running():  # it would share the CPU with timed steps (specviz/run/isolation.py)
            gr.Warning(isolation.REFUSE_LOAD)
            status = self.manager.status(session_key(request))
            return (render.message_html(isolation.REFUSE_LOAD, "warning") + render.status_html(status),
                    button_state(status), gr.Timer(active=False))
        if not self.manager.start(spec, owner=session_key(request)):
            gr.Warning("A model pair is already loading: wait until it is ready.")
        status = self.manager.status(session_key(request))
        return render.status_html(status), button_state(status), gr.Timer(active=True)

    def _checked(self, prompt, gamma, max_new_tokens, temperature, top_p, top_k, seed, chat_template, mode,
                 method, gamma_auto=False, options=None, scope=None, fresh_memory=False, share_memory=False):
        """(request, pair, prompt ids), or RequestError in words the visitor understands. `scope`:
        the visitor's session, whose earlier outputs alone the suffix drafters may copy from."""
        gamma = "auto" if gamma_auto is True else gamma
        method = method or "draft"
        req = make_request(prompt, method=method, gamma=gamma, max_new_tokens=max_new_tokens,
                           temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                           chat_template=chat_template, limits=self.limits,
                           options=method_options.collect(method, options or {}), scope=scope,
                           fresh_memory=fresh_memory, share_memory=share_memory)
        if mode not in MODES:
            raise RequestError(f"Unknown execution mode {mode!r}: choose fair or parallel.")
        pair = self.manager.pair
        if pair is None or not self.manager.ready:
            status = self.manager.status()
            raise RequestError("The models are still loading: wait until the Run button is enabled."
                               if status["loading"] else
                               f"No model pair is loaded ({status['error'] or 'not started'}).")
        return req, pair, encode_prompt(pair.tokenizer, req, pair.max_positions, self.limits)

    def run(self, prompt, gamma, max_new_tokens, temperature, top_p, top_k, seed, chat_template, mode,
            method="draft", gamma_auto=False, options: dict | None = None, request: gr.Request = None,
            fresh_memory=False, share_memory=False):
        """One race, streamed into the panes. `options`: the method settings by name (the page
        sends every method's controls; method_options.collect keeps the picked method's).
        `fresh_memory`: the suffix drafters read no earlier run's output (the page's box under Run);
        `share_memory`: they also read every visitor's runs of the presets (the box beside it, off)."""
        try:
            req, pair, ids = self._checked(prompt, gamma, max_new_tokens, temperature, top_p, top_k, seed,
                                           chat_template, mode, method, gamma_auto, options,
                                           scope=session_key(request), fresh_memory=fresh_memory is True,
                                           share_memory=share_memory is True)
        except RequestError as e:
            yield failed_outputs(str(e))  # said in the run info line; the API caller gets the error
            raise page_error(str(e)) from None
        except Exception as e:  # noqa: BLE001 - e.g. a tokenizer refusing odd input: say so, keep serving
            msg = run_error_text(e)
            yield failed_outputs(msg)
            raise page_error(msg, print_exception=not expected(e)) from None
        yield from self._race(req, pair, ids, mode, session_key(request))

    def page_run(self):
        """`run` as gradio calls it: every input positional (the method settings last, in
        method_options.KEYS order, made one mapping here), the request injected by its
        annotation. Gradio reads the signature, so it is spelled out."""
        settings = [p for p in inspect.signature(self.run).parameters
                    if p not in ("options", "request", *MEMORY_BOXES)]
        n, k = len(settings), len(method_options.KEYS)

        def handler(*values):
            *inputs, request = values
            boxes = dict(zip(MEMORY_BOXES, inputs[n + k:], strict=False))  # under Run (API: optional)
            yield from self.run(*inputs[:n], options=method_options.as_mapping(inputs[n:n + k]),
                                request=request, **boxes)

        P = inspect.Parameter
        names = (*settings, *method_options.KEYS, *MEMORY_BOXES)  # the boxes under Run last (API callers)
        params = [P(name, P.POSITIONAL_OR_KEYWORD) for name in names]
        handler.__signature__ = inspect.Signature(
            [*params, P("request", P.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request)])
        handler.__annotations__ = {"request": gr.Request}
        return handler

    def _race(self, req, pair, ids, mode: str, key: str):
        """Stream one race into the panes; errors become a message, the server keeps serving."""
        # a forked call's session was taken in the page's process (hosting/forked.wrap)
        stop, done = (self.sessions.begin(key) if self.bridge.is_open(key) else
                      self.sessions.take(key, wait=STOP_GRACE))
        self.bridge.send("queue_start", key)
        stream = panes = None
        # what this run adds to the drafters' memory goes home from a fork (below); elsewhere it is home
        held = MEMORY.docs() if self.bridge.is_open(key) else None
        try:
            view = RunView(req.gamma, req.temperature, mode, req.prompt, req.chat_template)
            view.method, view.gamma_auto, view.dtype = req.method, req.gamma_auto, pair.dtype
            view.fresh_memory, view.reads_memory = req.fresh_memory, bool(req.scope) and not req.fresh_memory
            view.shares_memory = view.reads_memory and req.share_memory
            # shown next to the method in the run header, with what calibration chose for a blank exit
            # layer or skip set (the run resolves the same, cached, values: run/runner.py)
            ours = pair.engine == OURS
            calibrate = ours and pending(pair, req.method, req.options)
            if calibrate:  # its first run on this machine measures first: say so, not "Press Run"
                yield calibrating_outputs(calibrate)
            view.options = resolve_options(pair, req.method, req.options) if ours else req.options
            view.costs = pair.costs  # calibration at load: plain step and v(k)
            view.unmeasured = pair.unmeasured  # another engine (vLLM): n/a, never 0
            # the p/q inspector reads the rounds as they come
            self.bridge.track("rounds", key, view.spec.rounds)
            head = render.prompt_span(req.prompt, req.chat_template and pair.has_chat_template)
            info = RaceInfo(mode)
            # ZeroGPU: this call's graphs, captured before the race's clocks (models/gpu_path.py)
            view.note = prepare_call(pair, len(ids) + req.max_new_tokens + req.gamma + 1)
            stream = race(pair, req, ids, mode, stop=stop, time_limit=self.limits.max_seconds, info=info,
                          pace="split" if mode == "fair" else "clock")
            # kept as a trace when it ends (or stops): downloads and the theory overlay
            stream = record(stream, trace_for(req, pair, mode, f"live run · {req.prompt[:40]}"),
                            on_end=lambda tr: self.bridge.send("trace", key, tr))
            # the engines run on a thread of their own, never waiting for the page; the panes follow
            # at the measured pace, a replay of what was timed in fair mode (ui/live.py)
            panes = PaneStream(view, head)  # replays: the same outputs
            pacer = live.Pacer(mode, req.max_new_tokens, split=lambda: info.split_at is not None)
            panes.banner = live.banner(pacer)
            yield panes.outputs(charts=True)  # the charts now and at the end only
            settle(SETTLE if mode == "fair" else 0.0)
            yield from live.follow(panes, stream, pacer, stop, interval=UI_INTERVAL,
                                   hold=live.HOLD if mode == "fair" else 0.0)
            panes.banner = live.banner(pacer, final=True)
            if info.timed_out:
                view.note = _also(view.note, f"stopped at the server's time limit of "
                                             f"{self.limits.max_seconds:g} s")
            elif stop.is_set():
                view.note = _also(view.note, "stopped by you")
            if held is not None:  # ZeroGPU: the next fork copies the page's memory, not this one's
                self.bridge.send("memory", key, MEMORY.since(held))
            yield panes.outputs(charts=True)
        except Exception as err:  # noqa: BLE001 - OOM and friends: tell the visitor, keep serving
            if stream is not None:
                live.close(stream)  # drop what the failed run held before freeing memory
            free_memory()
            msg = run_error_text(err)
            if panes is not None:
                view.error = msg
                panes.banner = ""  # "Timing both sides…" stood above the message of a run that had ended
                yield panes.outputs(charts=True)
            else:
                yield failed_outputs(msg)
            raise page_error(msg, print_exception=not expected(err)) from None
        finally:
            # however the run ends (done, error, Stop, or gradio closing this generator
            # on a cancel or a closed tab: GeneratorExit), the engines stop and the
            # worker is free for the next visitor
            stop.set()
            if stream is not None:
                live.close(stream)
            self.sessions.end(key, done)
            self.bridge.send("queue_end", key)

    def stop_click(self, request: gr.Request):
        # ask the engines to stop at their next step and wait a little so the
        # final (stopped) state reaches the page; the chained cancel follows
        self.sessions.stop(session_key(request), wait=STOP_GRACE)
