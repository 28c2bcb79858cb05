"""The Gradio page: controls, two live panes, numbers, charts.

Only events reach this module (through specviz.race); the HTML comes from
render.py, the figures from charts.py, the numbers from state.RunView.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, field

import gradio as gr

from ..engine.proposers import method_spec
from ..models import ModelError, PairSpec, available_pairs, resolve_pair
from ..prompts import load_presets
from ..race import MODES, RaceInfo, race
from ..request import MAX_GAMMA, METHODS, Limits, RequestError, encode_prompt, make_request
from ..runner import free_memory, is_oom
from ..trace import record, trace_for
from . import draft_size, render, theory
from . import replay as replay_ui
from .charts import all_charts
from .loader import ModelManager
from .panes import PaneStream
from .state import RunView

UI_INTERVAL = 0.25  # seconds between page updates while a run streams (≤ 4/s)
SETTLE = float(os.environ.get("SPECVIZ_UI_SETTLE", 0.1))  # see PaneStream.settle
CHART_INTERVAL = 1.0  # charts are heavier: at most one redraw per second
STOP_GRACE = 5.0  # Stop waits this long for the run to end cleanly before cancelling it

try:  # ZeroGPU on Hugging Face Spaces: borrow a GPU for each run
    import spaces  # type: ignore

    gpu = spaces.GPU
except Exception:  # noqa: BLE001 - not on a Space: a no-op decorator
    def gpu(fn=None, **_kw):
        return fn if fn is not None else (lambda f: f)


def _as_sent(payload):
    return payload


def raw_values(*components):
    """Let these number inputs reach the handler as sent: make_request checks
    them and names the field ("γ (draft length) must be between 1 and 16, got
    99."), where gradio's own check answers an API caller's "abc" or null with
    an internal error about component indices. (An instance attribute, not a
    subclass: gradio writes a .pyi file next to any module that subclasses a
    component.)"""
    for c in components:
        c.preprocess = _as_sent
    return components


METHOD_CHOICES = [
    ("draft model: the small model guesses γ tokens", "draft"),
    ("adaptive γ: draft model, γ follows the acceptance rate", "adaptive"),
    ("prompt lookup: copy what followed the last n-gram earlier (no draft model)", "lookup"),
]
# every other registered method (early exit, layer skip, ...) from its own description
METHOD_CHOICES += [(f"{method_spec(m).label}: {method_spec(m).description}", m) for m in METHODS
                   if m not in {v for _, v in METHOD_CHOICES}]
MODE_CHOICES = [
    ("fair: each side timed alone (honest speedup)", "fair"),
    ("parallel: both at once (shares the hardware)", "parallel"),
]
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
    ch = PairChoices()
    if initial is not None and initial.name not in {p.name for p in available_pairs(network)}:
        ch.add(CLI, initial, f"Command line: {initial.label}")
    for p in available_pairs(network):
        ch.add(p.name, p, p.label)
    ch.add(TINY, None, "Tiny random pair (loads instantly, writes gibberish; for testing)")
    ch.add(CUSTOM, None, "Custom: type a target and a draft below")
    if initial is not None:
        ch.initial = CLI if CLI in ch.specs else initial.name
    return ch


_tiny_dir: str | None = None


def tiny_spec() -> PairSpec:
    global _tiny_dir
    from ..models.tiny import save_tiny_pair
    if _tiny_dir is None:
        d = tempfile.mkdtemp(prefix="specviz-tiny-")
        save_tiny_pair(d)
        _tiny_dir = d
    spec = resolve_pair("custom", f"{_tiny_dir}/target", f"{_tiny_dir}/draft", allow_local_paths=True)
    return PairSpec(TINY, spec.target, spec.draft, "Tiny random pair (testing)", True)


class Sessions:
    """Stop flags per browser session (Stop must only stop its own run)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[threading.Event, threading.Event]] = {}

    def begin(self, key: str) -> tuple[threading.Event, threading.Event]:
        stop, done = threading.Event(), threading.Event()
        with self._lock:
            self._runs[key] = (stop, done)
        return stop, done

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
        run[1].wait(wait)
        return True


def _session_key(request: gr.Request | None) -> str:
    # a plain HTTP API call may come without a session: give it a key of its own, so
    # that two such callers never share a Stop flag or a recorded run
    return getattr(request, "session_hash", None) or f"anonymous-{uuid.uuid4().hex}"


def _runtime_error_text(err: BaseException) -> str:
    text = str(err)
    if is_oom(err):
        return ("The run ran out of memory. Try fewer new tokens, a shorter prompt, a smaller γ or a smaller "
                "model pair. The app is still running.")
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"The run failed: {first}. The app is still running; try again or change the settings."


def build_demo(manager: ModelManager, initial: PairSpec | None = None, default_mode: str = "fair",
               allow_local_paths: bool = False, limits: Limits | None = None,
               network: bool | None = None, fixed_pair: bool = False) -> gr.Blocks:
    """The page. fixed_pair: visitors cannot load another model pair (a public
    or on-stage server, where the pair in service is shared by everyone)."""
    limits = limits or Limits.from_env()
    presets = load_presets()
    by_name = {p["name"]: p for p in presets}
    first = presets[0]
    choices = pair_choices(initial, network)
    sessions = Sessions()
    records = replay_ui.Records()  # each session's latest run as a trace (downloads, theory)

    # ---------------------------------------------------------------- handlers

    def button_state(status: dict):
        if status["ready"]:
            return gr.Button(value="▶ Run", interactive=True)
        if status["loading"]:
            return gr.Button(value="loading models…", interactive=False)
        return gr.Button(value="no models loaded", interactive=False)

    def poll(request: gr.Request = None):
        st = manager.status(_session_key(request))
        return render.status_html(st), button_state(st), gr.Timer(active=st["loading"])

    def on_preset(name):
        p = by_name.get(name)
        if p is None:
            return gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return p["prompt"], p["gamma"], min(p["max_new_tokens"], limits.max_new_tokens), p["chat_template"]

    def on_pair_pick(key):
        return gr.update(visible=key == CUSTOM)

    def load_pair_click(key, target, draft, request: gr.Request = None):
        try:
            if fixed_pair:
                raise ModelError("The model pair is fixed on this server: it cannot be changed from the page.")
            if not key or not isinstance(key, str):
                raise ModelError("Pick a model pair in the list first.")
            if key == CUSTOM:
                spec = resolve_pair("custom", target, draft, allow_local_paths=allow_local_paths)
            elif key == TINY:
                spec = tiny_spec()
            elif key in choices.specs:
                spec = choices.specs[key]
            else:
                spec = resolve_pair(key, None, None, allow_local_paths=allow_local_paths)
        except ModelError as e:
            gr.Warning(render.toast_text(e))
            st = manager.status(_session_key(request))
            return render.message_html(str(e)) + render.status_html(st), button_state(st), gr.Timer(active=False)
        if not manager.start(spec, owner=_session_key(request)):
            gr.Warning("A model pair is already loading: wait until it is ready.")
        st = manager.status(_session_key(request))
        return render.status_html(st), button_state(st), gr.Timer(active=True)

    def fail(message: str):
        """Show a visitor-readable error in the page and as a toast, keep serving."""
        return [gr.skip(), gr.skip(), gr.skip(), render.message_html(message), *[gr.skip()] * 4]

    @gpu
    def run(prompt, gamma, max_new_tokens, temperature, top_p, top_k, seed, chat_template, mode,
            method="draft", request: gr.Request = None):
        try:
            req = make_request(prompt, method or "draft", gamma, max_new_tokens, temperature, top_p, top_k, seed,
                               chat_template, limits)
            if mode not in MODES:
                raise RequestError(f"Unknown execution mode {mode!r}: choose fair or parallel.")
            pair = manager.pair
            if pair is None or not manager.ready:
                st = manager.status()
                raise RequestError("The models are still loading: wait until the Run button is enabled."
                                   if st["loading"] else
                                   f"No model pair is loaded ({st['error'] or 'not started'}).")
            ids = encode_prompt(pair.tokenizer, req,
                                getattr(pair.target.config, "max_position_embeddings", None), limits)
        except RequestError as e:
            yield fail(str(e))
            raise gr.Error(render.toast_text(e), print_exception=False) from None
        except Exception as e:  # noqa: BLE001 - e.g. a tokenizer refusing odd input: say so, keep serving
            msg = _runtime_error_text(e)
            yield fail(msg)
            raise gr.Error(render.toast_text(msg), print_exception=True) from None

        key = _session_key(request)
        stop, done = sessions.begin(key)
        stream = panes = None
        try:
            view = RunView(req.gamma, req.temperature, mode, req.prompt, req.chat_template)
            view.method = req.method
            head = render.prompt_span(req.prompt, req.chat_template and pair.has_chat_template)
            info = RaceInfo(mode)
            stream = race(pair, req, ids, mode, stop=stop, time_limit=limits.max_seconds, info=info)
            # kept as a trace when it ends (or stops): downloads and the theory overlay
            stream = record(stream, trace_for(req, pair, mode, f"live run · {req.prompt[:40]}"),
                            on_end=lambda tr: records.put(key, tr))
            # fair mode: the engines' clocks are paused while we render, so only wall
            # time is at stake; parallel mode: rendering competes with the engines
            chart_every = CHART_INTERVAL if mode == "parallel" else CHART_INTERVAL / 2
            settle = SETTLE if mode == "fair" else 0.0  # fair: engine clocks count engine work only
            panes = PaneStream(view, head, chart_every, UI_INTERVAL, settle=settle)  # replays take the same path
            yield panes.outputs(charts=True)
            yield from panes.follow(stream)
            if info.timed_out:
                view.note = f"stopped at the server's time limit of {limits.max_seconds:g} s"
            elif stop.is_set():
                view.note = "stopped by you"
            yield panes.outputs(charts=True)
        except Exception as err:  # noqa: BLE001 - OOM and friends: tell the visitor, keep serving
            if stream is not None:
                stream.close()  # drop what the failed run held before freeing memory
            free_memory()
            msg = _runtime_error_text(err)
            if panes is not None:
                view.error = msg
                yield panes.outputs(charts=True)
            else:
                yield fail(msg)
            raise gr.Error(render.toast_text(msg), print_exception=True) from None
        finally:
            # however the run ends (done, error, Stop, or gradio closing this generator
            # on a cancel or a closed tab: GeneratorExit), the engines stop and the
            # worker is free for the next visitor
            stop.set()
            if stream is not None:
                stream.close()
            sessions.end(key, done)

    def stop_click(request: gr.Request):
        # ask the engines to stop at their next step and wait a little so the
        # final (stopped) state reaches the page; the chained cancel follows
        sessions.stop(_session_key(request), wait=STOP_GRACE)

    # ---------------------------------------------------------------- layout

    st0 = manager.status()
    with gr.Blocks(title="SpecViz: speculative decoding, visible and measured") as demo:
        gr.HTML("<div class='sv-header'><h1 style='margin:0'>SpecViz</h1>"
                "<p style='margin:2px 0 0 0;opacity:.8'>Speculative decoding, made visible and honestly "
                "measured: a small draft model guesses, the big target model verifies.</p></div>")
        with gr.Accordion("What am I looking at?", open=True):
            gr.HTML(f"<div class='sv-explainer'>{render.EXPLAINER}</div>")
        status = gr.HTML(render.status_html(st0), elem_id="sv-status")
        # two tabs: the live demo (the layout below, entered without re-indenting it) and
        # the theory explorer (ui/theory.py)
        live_tab = contextlib.ExitStack()
        live_tab.enter_context(gr.Tab("Live demo", id="live", elem_id="sv-tab-live"))
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                preset = gr.Dropdown([p["name"] for p in presets], value=first["name"], label="Preset",
                                     info="Example prompts (code, chat, grounded): fills the prompt and settings",
                                     elem_id="sv-preset")
                prompt = gr.Textbox(first["prompt"], label="Prompt", lines=5, max_lines=14,
                                    info="Text the model continues (or answers, with the chat template on)",
                                    elem_id="sv-prompt")
            with gr.Column(scale=2):
                with gr.Row():
                    gamma = gr.Slider(1, MAX_GAMMA, value=first["gamma"], step=1, label="γ (draft length)",
                                      info="Draft guesses per round", elem_id="sv-gamma")
                    max_new = gr.Slider(1, limits.max_new_tokens, value=min(first["max_new_tokens"],
                                                                            limits.max_new_tokens),
                                        step=1, label="Max new tokens", info="Budget for each side",
                                        elem_id="sv-max-new")
                with gr.Row():
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature",
                                            info="0 = greedy (identical outputs)")
                    seed = gr.Number(0, precision=0, minimum=0, label="Seed",
                                     info="Same seed, same run")
                mode = gr.Radio(MODE_CHOICES, value=default_mode, label="Execution mode",
                                info="fair: each side gets the machine to itself on its own virtual clock. "
                                     "parallel: both run at once and slow each other down.")
                with gr.Row():
                    run_btn = gr.Button("▶ Run" if st0["ready"] else "loading models…", variant="primary",
                                        interactive=st0["ready"], elem_id="sv-run")
                    stop_btn = gr.Button("■ Stop", variant="secondary", elem_id="sv-stop")
        with gr.Accordion("More settings: sampling, draft method", open=False):
            with gr.Row():
                top_p = gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="Top-p",
                                  info="Keep the smallest set of tokens with this much probability (1 = off)")
                top_k = gr.Slider(0, 1000, value=0, step=1, label="Top-k",
                                  info="Keep only the k most likely tokens (0 = off)")
                chat = gr.Checkbox(first["chat_template"], label="Use the chat template",
                                   info="Wrap the prompt as a user message (instruct models)")
            method = gr.Radio(METHOD_CHOICES, value="draft", label="Where the guesses come from",
                              info="Every method is verified the same way, so the output law stays the target's",
                              elem_id="sv-method")
        with gr.Accordion("Model pair", open=False):
            gr.Markdown("The pair is shared by everyone using this server. Loading another one takes "
                        "a while; the current pair serves until the new one is ready.")
            with gr.Row():
                pair_pick = gr.Dropdown(choices.labels, value=choices.initial, label="Target + draft",
                                        info="Both models must share one tokenizer", scale=3)
                load_btn = gr.Button("Load pair" if not fixed_pair else "Load pair (fixed on this server)",
                                     scale=1, interactive=not fixed_pair)
            with gr.Row(visible=False) as custom_row:
                custom_target = gr.Textbox(label="Target model", placeholder="org/name on the Hugging Face Hub"
                                           + (" or a local folder" if allow_local_paths else ""),
                                           info="The big model whose output you want")
                custom_draft = gr.Textbox(label="Draft model", placeholder="org/name (same tokenizer)",
                                          info="A small model from the same family")
        replay_box = replay_ui.build_section()  # replay recorded runs, download yours (ui/replay.py)
        gr.HTML(render.legend_html())
        run_info = gr.HTML("<div class='sv-runinfo'></div>", elem_id="sv-runinfo")
        with gr.Row(equal_height=True):
            with gr.Column():
                gr.HTML("<div class='sv-pane-title'>Baseline: the target alone, one token per pass</div>")
                base_pane = gr.HTML("<span class='sv-placeholder'>Press Run: plain decoding streams here.</span>",
                                    elem_classes=["sv-pane"], elem_id="sv-baseline", autoscroll=True)
            with gr.Column():
                gr.HTML("<div class='sv-pane-title'>Speculative: draft guesses, target verifies</div>")
                spec_pane = gr.HTML("<span class='sv-placeholder'>Press Run: speculative rounds stream here.</span>",
                                    elem_classes=["sv-pane"], elem_id="sv-speculative", autoscroll=True)
        stats = gr.HTML(render.stats_html(RunView(first["gamma"], 0.0, default_mode).snapshot()),
                        elem_id="sv-stats")
        empty = all_charts(RunView(first["gamma"], 0.0, default_mode))
        with gr.Row():
            plot_alpha = gr.Plot(empty[0], show_label=False, elem_id="sv-chart-alpha")
            plot_speed = gr.Plot(empty[1], show_label=False, elem_id="sv-chart-speedup")
        with gr.Row():
            plot_time = gr.Plot(empty[2], show_label=False, elem_id="sv-chart-time")
            plot_pos = gr.Plot(empty[3], show_label=False, elem_id="sv-chart-position")
        live_tab.close()
        theory_tab = theory.build_tab()
        draft_size.build_tab()  # the committed draft-size analysis (static)
        timer = gr.Timer(0.5, active=st0["loading"])

        # ------------------------------------------------------------ events
        outputs = [base_pane, spec_pane, stats, run_info, plot_alpha, plot_speed, plot_time, plot_pos]
        poll_out = [status, run_btn, timer]
        timer.tick(poll, None, poll_out, api_visibility="private", show_progress="hidden", queue=False)
        demo.load(poll, None, poll_out, api_name="status", show_progress="hidden", queue=False)
        preset.change(on_preset, preset, [prompt, gamma, max_new, chat], api_visibility="private",
                      show_progress="hidden", queue=False)
        pair_pick.change(on_pair_pick, pair_pick, custom_row, api_visibility="private",
                         show_progress="hidden", queue=False)
        load_btn.click(load_pair_click, [pair_pick, custom_target, custom_draft], poll_out,
                       api_name="load_pair", show_progress="hidden")
        raw_values(gamma, max_new, temperature, top_p, top_k, seed)  # checked (and named) by make_request
        inputs = [prompt, gamma, max_new, temperature, top_p, top_k, seed, chat, mode, method]
        run_event = run_btn.click(run, inputs, outputs, api_name="run", concurrency_limit=1,
                                  concurrency_id="generate", trigger_mode="once",
                                  show_progress="full", show_progress_on=[run_info])
        submit_event = prompt.submit(run, inputs, outputs, api_visibility="private", concurrency_limit=1,
                                     concurrency_id="generate", trigger_mode="once", show_progress="full",
                                     show_progress_on=[run_info])
        replay_events = replay_ui.wire(replay_box, theory_tab, records, sessions, _session_key, outputs,
                                       [run_event, submit_event], STOP_GRACE, limits.max_seconds,
                                       run_triggers=[run_btn.click, prompt.submit])
        stop_btn.click(stop_click, None, None, api_name="stop", queue=False, show_progress="hidden") \
            .then(None, None, None, cancels=[run_event, submit_event, *replay_events], api_visibility="private")
    demo.specviz_records = records  # read by specviz.bench.ui_overhead
    return demo
