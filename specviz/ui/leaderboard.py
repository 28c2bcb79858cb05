"""The "Race all methods" tab: one prompt, the ticked methods, each raced beside plain
decoding step by step in fair mode (specviz/run/leaderboard.py), a leaderboard sorted
by × plain (a ratio of the same moments) with a bar chart, and each method's panes one
pick away, their speedup box showing the row's ratio. While other programs take the
CPU, the table says so.

The panes are the live tab's (PaneStream over a RunView): while the race runs
they follow the run in progress; afterwards the selector re-renders any
method's recorded events (Board.trace) through the same path a replay takes.
A whole race saves and loads as one bundle (specviz/run/race_bundle.py); bundles
shipped in assets/races/ show instantly, for a stage.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from ..engine.cpu.threads import settle
from ..engine.pair import dtype_of
from ..errors import free_memory, run_error_text
from ..machine import Lock
from ..models.gpu_path import prepare_call
from ..run.leaderboard import (
    DEFAULT_KEYS,
    END,
    PLAIN,
    START,
    Board,
    entry,
    new_board,
    race_methods,
)
from ..run.race_bundle import load_bundle, save_bundle
from ..run.request import MAX_GAMMA, Limits, RequestError
from . import busy
from . import replay as replay_ui
from .charts import all_charts
from .glossary import recorded_on
from .handlers import SETTLE  # the pause after each page update, before the next timed step
from .leaderboard_render import bar_chart, pick_choices, progress_html, replay_banner, table_html
from .panes import PaneStream, page_error
from .state import RunView
from .trained import methods_update, offered  # noqa: F401 (the race's list: re-exported)
from .tree_view import latest_tree_figure

RACES_DIR = Path(__file__).resolve().parents[2] / "assets" / "races"
UI_INTERVAL = 0.25  # as the live tab (ui/handlers.py)
CHART_INTERVAL = 0.5
WARMUP = 4  # new tokens of an unrecorded warm-up before each timed run (first forwards of a shape are slow)

INTRO = ("<div class='sv-explainer'><b>Race all methods</b> on one prompt: each ticked method races "
         "<b>plain decoding</b> in fair mode, one step of each in turn, each timed on its own clock, with "
         "the same prompt, budget and sampling, so each × plain compares the same moments of the machine. "
         "The leaderboard's numbers all come from each run's own events; greedy outputs are checked "
         "token for token against plain decoding. Pick a method below the table to see its race in the "
         "usual panes.</div>")


OFFERED = offered()  # before a pair is loaded; handlers.poll_race adds the trained ones once it is


def shipped() -> dict[str, Board]:
    """The race bundles shipped in assets/races, by file name (unreadable ones skipped)."""
    out = {}
    for p in sorted(RACES_DIR.glob("*.json")):
        try:
            out[p.name] = load_bundle(p)
        except ValueError:
            continue
    return out


@dataclass
class BoardTab:
    prompt: gr.Textbox
    methods: gr.CheckboxGroup
    gamma: gr.Slider
    max_new: gr.Slider
    temperature: gr.Slider
    seed: gr.Number
    run_btn: gr.Button
    stop_btn: gr.Button
    state: gr.HTML
    table: gr.HTML
    chart: gr.Plot
    pick: gr.Dropdown
    download: gr.DownloadButton
    recorded: gr.Dropdown
    upload: gr.File
    show_btn: gr.Button
    panes: list  # base pane, speculative pane, stats, run info, 4 charts, token tree (panes.N_OUTPUTS)
    races: dict = field(default_factory=dict)  # shipped bundles by file name

    @property
    def inputs(self) -> list:
        return [self.methods, self.prompt, self.gamma, self.max_new, self.temperature, self.seed]

    @property
    def outputs(self) -> list:
        return [self.state, self.table, self.chart, self.pick, self.download, *self.panes]


def _controls(first: dict, limits: Limits) -> dict:
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            prompt = gr.Textbox(first["prompt"], label="Prompt", lines=4, max_lines=10,
                                elem_id="sv-lb-prompt")
            methods = gr.CheckboxGroup([(entry(k).label, k) for k in OFFERED],
                                       value=[k for k in DEFAULT_KEYS if k in OFFERED], label="Methods",
                                       info="Each races plain decoding, step by step",
                                       elem_id="sv-lb-methods")
        with gr.Column(scale=2, min_width=280):
            with gr.Row():
                gamma = gr.Slider(1, MAX_GAMMA, value=first["gamma"], step=1, label="γ",
                                  info="All but auto γ", elem_id="sv-lb-gamma")
                max_new = gr.Slider(1, limits.max_new_tokens, value=min(first["max_new_tokens"], 64,
                                                                        limits.max_new_tokens),
                                    step=1, label="Max new tokens", info="Each run", elem_id="sv-lb-max-new")
            with gr.Row():
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature",
                                        info="0 = greedy (outputs checked)", elem_id="sv-lb-temperature")
                seed = gr.Number(0, precision=0, minimum=0, label="Seed", elem_id="sv-lb-seed")
            with gr.Row():
                run_btn = gr.Button("▶ Run race", variant="primary", elem_id="sv-lb-run")
                stop_btn = gr.Button("■ Stop", variant="secondary", elem_id="sv-lb-stop")
    return dict(prompt=prompt, methods=methods, gamma=gamma, max_new=max_new, temperature=temperature,
                seed=seed, run_btn=run_btn, stop_btn=stop_btn)


def _recorded(races: dict) -> dict:
    # each named by the machine, precision and date it ran on (issue 71: nothing shipped passes for this
    # machine's timings)
    choices = [(f"{b.meta.get('label') or n} · {recorded_on(b.meta)}", n) for n, b in races.items()]
    with gr.Accordion("Recorded races · download yours", open=False, elem_id="sv-lb-recorded"):
        with gr.Row(equal_height=False):
            recorded = gr.Dropdown(choices, value=choices[0][1] if choices else None, label="Recorded races",
                                   info="Races shipped with this page, each named by the machine, "
                                        "precision and date it ran on (their timings, not this machine's)",
                                   scale=3,
                                   elem_id="sv-lb-recorded-pick")
            upload = gr.File(label="…or a race bundle (.json)", file_types=[".json"], type="filepath",
                             height=110, scale=2, elem_id="sv-lb-upload")
        with gr.Row():
            show_btn = gr.Button("Show recorded race", elem_id="sv-lb-show")
            download = gr.DownloadButton("Download this race (JSON bundle)", interactive=False,
                                         elem_id="sv-lb-download")
    return dict(recorded=recorded, upload=upload, show_btn=show_btn, download=download)


def _panes() -> list:
    run_info = gr.HTML("<div class='sv-runinfo'></div>", elem_id="sv-lb-runinfo")
    with gr.Row(equal_height=True):
        with gr.Column(min_width=300, elem_classes=["sv-pane-col"]):
            gr.HTML("<h2 class='sv-pane-title' id='sv-lb-baseline-title'>Baseline: the target alone, one "
                    "token per pass</h2>")
            base = gr.HTML("", elem_classes=["sv-pane"], elem_id="sv-lb-baseline")
        with gr.Column(min_width=300, elem_classes=["sv-pane-col"]):
            gr.HTML("<h2 class='sv-pane-title' id='sv-lb-speculative-title'>The picked method: draft "
                    "guesses, target verifies</h2>")
            spec = gr.HTML("", elem_classes=["sv-pane"], elem_id="sv-lb-speculative")
    stats = gr.HTML("", elem_id="sv-lb-stats")
    view = RunView(4, 0.0, "fair")
    empty = all_charts(view)
    plots = []
    for row in range(2):
        with gr.Row():
            plots += [gr.Plot(empty[i], show_label=False, elem_id=f"sv-lb-chart-{i}")
                      for i in (2 * row, 2 * row + 1)]
    plots.append(gr.Plot(latest_tree_figure(view), show_label=False, elem_id="sv-lb-chart-tree"))
    return [base, spec, stats, run_info, *plots]


def build_tab(first: dict, limits: Limits) -> BoardTab:
    """The tab's components (inside the page's gr.Blocks, beside the other tabs)."""
    races = shipped()
    with gr.Tab("Race all methods", id="race", elem_id="sv-tab-race"):
        gr.HTML(INTRO)
        parts = _controls(first, limits)
        state = gr.HTML(progress_html(None, "Ready: each ticked method races plain decoding in turn."),
                        elem_id="sv-lb-state-box")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=320):
                table = gr.HTML(table_html(None), elem_id="sv-lb-table")
            with gr.Column(scale=2, min_width=300):
                chart = gr.Plot(bar_chart(None), show_label=False, elem_id="sv-lb-chart")
        parts |= _recorded(races)
        pick = gr.Dropdown([], value=None, label="Show a method's run in the panes",
                           info="Its recorded events, rendered as in the live tab", elem_id="sv-lb-pick")
        panes = _panes()
    return BoardTab(**parts, state=state, table=table, chart=chart, pick=pick, panes=panes, races=races)


# ------------------------------------------------------------------ handlers


def pane_stream(board: Board, key: str, banner: str = "", live: bool = False) -> PaneStream:
    """A PaneStream for one run of the board, its recorded events so far already added. live: a race
    starting now, so the baseline pane starts empty (it showed the first race's whole plain run, with
    the new race's tokens appended after it)."""
    tr = board.trace(key, live=live)
    view, head = replay_ui.view_for(tr)
    view.gamma_auto = bool(tr.meta["settings"].get("gamma_auto"))
    view.dtype = dtype_of(board.meta.get("precision") or "")
    panes = PaneStream(view, head, banner=banner)
    for side, ev in tr.events:
        panes.add(side, ev)
    return panes


def _picked(board: Board, key: str, side: str) -> str | None:
    """The method selector while a race streams: a finished run names itself; a starting one
    clears it (else it named the last run while the panes showed the next); None: unchanged."""
    if side == START:
        return ""
    return key if side == END and key != PLAIN and board.row(key) else None


@dataclass
class BoardHandlers:
    page: object  # ui/handlers.Handlers: its request checks, model manager, limits and stop flags
    session_key: object
    races: dict = field(default_factory=dict)
    stop_grace: float = 5.0
    boards: OrderedDict = field(default_factory=OrderedDict)  # each session's latest race
    lock: Lock = field(default_factory=Lock)

    def _keep(self, key: str, board: Board) -> None:
        with self.lock:
            self.boards[key] = board
            self.boards.move_to_end(key)
            while len(self.boards) > 32:
                self.boards.popitem(last=False)

    def _board(self, key: str) -> Board | None:
        with self.lock:
            return self.boards.get(key)

    def _download(self, key: str, board: Board):
        folder = self.page.records.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("specviz-race-*"):
            old.unlink(missing_ok=True)
        stamp = str(board.meta.get("recorded") or "race").replace(":", "").replace("+0000", "Z")[:17]
        path = save_bundle(board, folder / f"specviz-race-{stamp}.json")
        return gr.DownloadButton(value=str(path), interactive=True)

    def _outputs(self, board, panes, note="", banner="", charts=True, pick=None, download=None,
                 live=True) -> list:
        pane_out = panes.outputs(charts) if panes is not None else [gr.skip()] * 9
        # "" clears the picker: sent as None, which gradio takes without its "not in the choices" warning
        pick_out = gr.skip() if pick is None else gr.Dropdown(choices=pick_choices(board), value=pick or None)
        busy.METER.sample()
        return [progress_html(board, note, banner), table_html(board, busy.busy_reason({}) if live else ""),
                bar_chart(board) if charts else gr.skip(), pick_out,
                download if download is not None else gr.skip(), *pane_out]

    def run(self, methods, prompt, gamma, max_new, temperature, seed, request: gr.Request = None):
        key = self.session_key(request)
        try:
            from ..run.leaderboard import parse_keys
            keys = parse_keys(methods or [])
            req, pair, ids = self.page._checked(prompt, gamma, max_new, temperature, 1.0, 0, seed, False,
                                                "fair", "draft")
            board = new_board(pair, req, keys)
        except RequestError as e:
            yield [progress_html(None, str(e))] + [gr.skip()] * 13
            raise page_error(str(e)) from None  # said above the table; the API caller gets the error
        yield from self._race(key, pair, req, ids, board)

    def _race(self, key, pair, req, ids, board):
        stop, done = self.page.sessions.begin(key)
        self.page.bridge.send("board", key, board)
        panes, last, last_chart = None, 0.0, 0.0
        stream = race_methods(pair, req, ids, board, stop=stop, time_limit=self.page.limits.max_seconds,
                              warmup=WARMUP)
        try:
            # ZeroGPU: this call's graphs, captured before the races' clocks (models/gpu_path.py)
            captured = prepare_call(pair, len(ids) + req.max_new_tokens + req.gamma + 1)
            if captured:
                board.meta["graphs"] = captured  # said under the progress bar, and kept with the race
            yield self._outputs(board, None, pick=None, download=gr.DownloadButton(interactive=False))
            for k, side, ev in stream:
                if side == START:  # the method and plain decoding beside it, in the panes
                    panes = pane_stream(board, k, live=True)
                elif side not in (START, END):
                    panes.add(side, ev)
                busy.note_race(board, k, side)
                now = time.perf_counter()
                if side in (START, END) or now - last >= UI_INTERVAL:
                    charts = side == END or now - last_chart >= CHART_INTERVAL
                    yield self._outputs(board, panes, charts=charts, pick=_picked(board, k, side))
                    settle(SETTLE)  # fair mode: the engine clocks are paused meanwhile
                    last = time.perf_counter()
                    last_chart = last if charts else last_chart
            yield from self._finish(key, board, stop)
        except Exception as err:  # noqa: BLE001 - out of memory and friends: say so, keep serving
            stream.close()
            free_memory()
            msg = run_error_text(err)
            yield [progress_html(board, msg)] + [gr.skip()] * 13
            raise page_error(msg, print_exception=True) from None
        finally:
            stop.set()
            stream.close()
            self.page.sessions.end(key, done)

    def _finish(self, key, board: Board, stop):
        note = "stopped by you" if stop.is_set() else "race finished"
        if board.meta.get("baseline_error"):
            note = f"the baseline did not finish: {board.meta['baseline_error']}"
        best = next(iter(pick_choices(board)), (None, None))[1]
        panes = pane_stream(board, best) if best else None
        self.page.bridge.send("board", key, board)  # as it ended: from a forked call, the page's copy
        yield self._outputs(board, panes, note, pick=best or "", download=self._download(key, board))

    def show(self, pick, request: gr.Request = None):
        """The method selector: re-render that method's recorded run into the panes."""
        board = self._board(self.session_key(request))
        if board is None or not pick or pick not in board.runs:
            return [gr.skip()] * 9
        return pane_stream(board, pick).outputs(charts=True)

    def load_recorded(self, name, up, request: gr.Request = None):
        """A shipped or uploaded race bundle: its table, chart and fastest method, at once."""
        try:
            if up:
                board, source = load_bundle(up), f"uploaded file {Path(up).name}"
            elif name in self.races:
                board, source = self.races[name], "shipped with this page"
            else:
                raise ValueError("pick a recorded race or upload a race bundle")
        except ValueError as e:
            yield [progress_html(None, f"That race cannot be shown: {e}")] + [gr.skip()] * 13
            return
        key = self.session_key(request)
        self._keep(key, board)
        banner = replay_banner(board.meta, source)
        best = next(iter(pick_choices(board)), (None, None))[1]
        panes = pane_stream(board, best) if best else None
        yield self._outputs(board, panes, "recorded race", banner, pick=best or "",
                            download=self._download(key, board), live=False)

    def stop(self, request: gr.Request = None):
        self.page.sessions.stop(self.session_key(request), wait=self.stop_grace)


def wire(tab: BoardTab, page_handlers, session_key) -> list:
    """The tab's events; the race shares the live run's queue ("generate"), so a race and a
    live run never overlap. Returns the race event (for a page-wide Stop)."""
    h = BoardHandlers(page_handlers, session_key, tab.races)
    for c in (tab.gamma, tab.max_new, tab.temperature, tab.seed):  # checked and named by make_request
        c.preprocess = lambda payload: payload
    # ZeroGPU on a Space: one borrowed GPU call for all the races (else a no-op)
    run = page_handlers.gpu_call(h.run, max_tokens_arg=3, methods_arg=0)
    page_handlers.bridge.register("board", h._keep)  # a forked race's board, for the picker (hosting/forked)
    race = tab.run_btn.click(run, tab.inputs, tab.outputs, api_name="race_methods", concurrency_limit=1,
                             concurrency_id="generate", trigger_mode="once", show_progress="hidden")
    tab.pick.input(h.show, tab.pick, tab.panes, api_visibility="private", show_progress="hidden")
    tab.show_btn.click(h.load_recorded, [tab.recorded, tab.upload], tab.outputs, api_visibility="private",
                       show_progress="hidden")
    tab.stop_btn.click(h.stop, None, None, queue=False, api_visibility="private", show_progress="hidden") \
        .then(None, None, None, cancels=[race], api_visibility="private")
    return [race]
