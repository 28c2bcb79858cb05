"""The Gradio page, assembled: handlers (ui/handlers.py), then the layout
(ui/layout.py) inside `gr.Blocks`, then the event wiring below.

Only events reach the page (through specviz.run.race); the HTML comes from
render.py, the figures from charts.py, the numbers from state.RunView.
"""
from __future__ import annotations

import os

import gradio as gr

from ..models import PairSpec
from ..prompts import load_presets
from ..run.race_bundle import load_bundle
from ..run.request import Limits
from . import inspector, render, stage
from . import leaderboard as board_ui
from . import replay as replay_ui
from .draft_source import READS_MEMORY
from .handlers import STOP_GRACE, Handlers, pair_choices, run_button_props, session_key
from .layout import Page, build_page
from .loader import ModelManager
from .runqueue import PRESS_JS, RACE, RACING, SUBMIT_JS


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


class LivePage(gr.Blocks):
    """Blocks whose served config (`/` and `/config`: the page's first paint) carries the status
    box, Run button and poll timer as they are now. Gradio computes its config once at launch, and a
    callable `value=` runs only as a load event after the paint: a page opened after the models were
    ready showed "Loading models…" for 1-5 s (issue 41)."""

    first_paint = None  # () -> {component id: props now}, set by build_demo

    @property
    def config(self):
        served = self.__dict__.get("_served_config")
        if served is None or self.first_paint is None:
            return served
        return with_props(served, self.first_paint())

    @config.setter
    def config(self, value):
        self.__dict__["_served_config"] = value


def with_props(config: dict, props: dict[int, dict]) -> dict:
    """A copy of gradio's config with these components' props replaced (the rest shared, unchanged)."""
    comps = [dict(c, props={**c["props"], **props[c["id"]]}) if c.get("id") in props else c
             for c in config["components"]]
    return {**config, "components": comps}


def first_paint(page: Page, handlers: Handlers):
    """The props a page served now starts with: what the first poll would set."""
    def props() -> dict[int, dict]:
        status = handlers.manager.status()
        return {page.status._id: dict(value=handlers.status_line(status)[0]),
                page.run_btn._id: run_button_props(status),
                page.timer._id: dict(active=status["loading"])}
    return props


def wire(demo: gr.Blocks, page: Page, handlers: Handlers) -> None:
    """Every event of the page: status polling, presets, pair loading, run, replay, stop."""
    quiet = dict(api_visibility="private", show_progress="hidden", queue=False)
    status_out = [page.status, page.run_btn, page.timer]
    poll_out = status_out + [page.busy_replay, page.replay.accordion, page.method]
    poll = handlers.poll
    if page.board is not None:  # the race's methods too: the trained ones once the pair has them
        poll, poll_out = handlers.poll_race, poll_out + [page.board.methods]
    page.timer.tick(poll, None, poll_out, **quiet)
    demo.load(poll, None, poll_out, api_name="status", show_progress="hidden", queue=False)
    page.preset.change(handlers.on_preset, page.preset, [page.prompt, page.gamma, page.max_new, page.chat],
                       **quiet)
    page.pair_pick.change(handlers.on_pair_pick, page.pair_pick, page.custom_row, **quiet)
    page.load_btn.click(handlers.load_pair_click, [page.pair_pick, page.custom_target, page.custom_draft],
                        status_out, api_name="load_pair", show_progress="hidden")
    # checked (and named) by make_request
    raw_values(page.gamma, page.max_new, page.temperature, page.top_p, page.top_k, page.seed)
    if page.method_options is not None:  # show the picked method's settings; its check_options names bad ones
        page.method.change(handlers.on_method, page.method, page.method_options.outputs, **quiet)
        raw_values(*page.method_options.numbers)
    boxes = [c for c in (page.fresh_memory, page.share_memory) if c is not None]
    if boxes:  # the boxes under Run, for the methods that copy from earlier runs
        def show(m):
            shown = [gr.update(visible=m in READS_MEMORY)] * len(boxes)
            return shown if len(shown) > 1 else shown[0]
        page.method.change(show, page.method, boxes, **quiet)
    # ZeroGPU on a Space: borrow a GPU per run, for as long as its limits need (else a no-op)
    run = handlers.gpu_call(handlers.page_run(), max_tokens_arg=2)
    # no gradio tracker: the Run button is the one queue counter (ui/runqueue.py; issue 51)
    once = dict(concurrency_limit=1, concurrency_id="generate", trigger_mode="once", show_progress="hidden")
    # one run per press: the button disables itself in the browser first (ui/runqueue.py), and
    # the prompt's Enter presses the button (a second event would queue a second run)
    page.run_btn.click(handlers.run_pressed, None, [page.run_btn, page.timer], js=PRESS_JS, **quiet)
    run_event = page.run_btn.click(run, page.run_inputs, page.run_outputs, api_name="run", **once)
    # gradio 6 runs a .then() only after a success: a run that raised (an empty prompt) left the
    # button disabled until Stop, so the failure path frees it too
    run_event.then(handlers.run_ended, None, page.run_btn, **quiet)
    run_event.failure(handlers.run_ended, None, page.run_btn, **quiet)
    page.prompt.submit(None, None, None, js=SUBMIT_JS, api_visibility="private", queue=False)
    replay = replay_ui.ReplayHandlers(page.replay.traces, handlers.records, handlers.sessions, session_key,
                                      STOP_GRACE, handlers.limits.max_seconds)
    inspector.wire(page.spec_pane, page.inspector, session_key)
    insp_out = [page.inspector["html"], page.inspector["plot"]]
    for press in (page.run_btn, page.replay.play):  # a new run or replay: no old token stays picked
        press.click(inspector.cleared, None, insp_out, **quiet)
    replay_events = replay_ui.wire(page.replay, page.theory, replay, page.run_outputs, [run_event])
    stop = page.stop_btn.click(handlers.stop_click, None, None, api_name="stop", queue=False,
                               show_progress="hidden")
    stop.then(None, None, None, cancels=[run_event, *replay_events], api_visibility="private") \
        .then(handlers.run_ended, None, page.run_btn, **quiet)
    # the busy banner's offer: the selected recorded run, as the replay button plays it, named by the
    # machine, precision and date of the picker's first shipped run (the one selected at first)
    handlers.replay_offer = replay_ui.first_meta(page.replay.traces)
    page.busy_replay.click(None, None, None, js="() => { window.svReplay && window.svReplay(); return []; }",
                           api_visibility="private", queue=False)  # ui/stage.py PAGE_JS
    if page.board is not None:  # the "Race all methods" tab
        race_pressed(page.board.run_btn)  # before the race's own click: see race_pressed
        race_button(page.board, board_ui.wire(page.board, handlers, session_key))
        bundle_checked(page.board.upload)


def race_pressed(btn) -> None:
    """The press shows at once: disabled in the browser, then "Racing…" from the server. Wired before
    the race's own click (board_ui.wire): registered after it, gradio ran this press's script and
    label only once the race's first updates had been drawn, ~3.5 s on a busy 2-core machine (issue 59)."""
    btn.click(lambda: gr.update(value=RACING, interactive=False), None, btn,
              js="() => { const b = document.querySelector('#sv-lb-run'); if (b) b.disabled = true; "
                 "const s = document.querySelector('#sv-lb-stop'); if (s) s.focus({preventScroll: true}); "
                 "return []; }", api_visibility="private", show_progress="hidden", queue=False)


def race_button(board, races: list) -> None:
    """"▶ Run race" reads "Racing…" and is disabled from the press (race_pressed) until the race ends
    or stops (issue 51: it kept its label and stayed enabled). The release is queued: an unqueued .then()
    after a queued event was dropped in about half of the tries (gradio 6.31), leaving "Racing…"."""
    quiet = dict(api_visibility="private", show_progress="hidden", queue=False)
    btn = board.run_btn

    def freed():
        return gr.update(value=RACE, interactive=True)
    queued = dict(quiet, queue=True)
    for race in races:
        race.then(freed, None, btn, **queued)
        race.failure(freed, None, btn, **queued)
    board.stop_btn.click(freed, None, btn, **quiet)


def bundle_checked(upload) -> None:
    """A race bundle is read as it lands: one that cannot be read is dropped, and the upload box says
    why in its own label (and a toast), where the visitor's eyes are (issue 59: random bytes showed
    Python's "'utf-8' codec can't decode…" in the state line above the table, after Show)."""
    label = upload.label

    def check(path):
        if path:
            try:
                load_bundle(path)
            except ValueError as e:
                gr.Warning(render.toast_text(f"That file cannot be shown: {e}"))
                why = str(e).removeprefix("not a SpecViz race bundle: ")
                return gr.File(value=None, label=f"⚠ Not a race bundle ({why}): upload a .json file saved by "
                                                 "“Download this race”")
        return gr.File(label=label)
    upload.upload(check, upload, upload, api_visibility="private", show_progress="hidden")


def build_demo(manager: ModelManager, initial: PairSpec | None = None, default_mode: str = "fair",
               allow_local_paths: bool = False, limits: Limits | None = None,
               network: bool | None = None, fixed_pair: bool = False, stage_mode: bool = False,
               records: replay_ui.Records | None = None) -> gr.Blocks:
    """The page. fixed_pair: visitors cannot load another model pair (a public
    or on-stage server, where the pair in service is shared by everyone). records:
    where each session's latest run is kept (the UI-overhead bench passes its own to read)."""
    limits = limits or Limits.from_env()
    # gradio's run history (launch(run_history=...), read from this variable when not given) keeps every
    # call, polls included, with its outputs (the panes' HTML, the charts' figures) in the browser's
    # localStorage and writes the whole list again every 0.5 s while a run streams: the browser's CPU per
    # default run grew from 1.8 to 4.3 s over 8 runs in one page, and the plain side's measured time with
    # it (headless Chromium on the same 2-core Zen 4, 2026-11-29). The page keeps its own runs (Replay).
    os.environ.setdefault("GRADIO_RUN_HISTORY", "False")
    presets = load_presets()
    handlers = Handlers(manager, limits, presets, pair_choices(initial, network),
                        allow_local_paths=allow_local_paths, fixed_pair=fixed_pair)
    if records is not None:
        handlers.records = records
    with LivePage(title="SpecViz: speculative decoding, visible and measured") as demo:
        page = build_page(presets=presets, choices=handlers.choices, limits=limits, default_mode=default_mode,
                          status=manager.status(), allow_local_paths=allow_local_paths, fixed_pair=fixed_pair,
                          stage=stage_mode)
        wire(demo, page, handlers)
        stage.wire(demo, page, presets, stage_mode)  # ?stage=1 / --stage, the keys (ui/stage.py)
    demo.first_paint = first_paint(page, handlers)
    return demo
