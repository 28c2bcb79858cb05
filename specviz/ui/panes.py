"""The one rendering path from a (side, event) stream to the page's outputs.

A live run (events from specviz.run.race) and a replay (events from
specviz.run.trace.replay) both go through PaneStream, so they show the same panes,
colours, numbers, badge and charts. A replay's updates are throttled (follow): at
most one page update per `ui_interval`, charts at most once per `chart_every`,
except that a slow stream (≥ 0.5 s between events) gets every redraw. A live run
is followed by ui/live.follow instead: the engines on a thread of their own, the
panes paced, no charts until the end.
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterable, Iterator

from ..engine.events import RoundEvent, TokenEvent
from . import render
from .charts import all_charts
from .state import RunView
from .tree_view import latest_tree_figure

# output order: Page.run_outputs in ui/layout.py (base pane, speculative pane, stats, run info, 4 charts,
# token tree): PaneStream.outputs builds that list from CHARTS; its length is N_OUTPUTS
CHARTS = 5  # 4 charts and the token tree
N_OUTPUTS = 4 + CHARTS
RUN_INFO = 3


def _skip():
    import gradio as gr
    return gr.skip()


def message_outputs(message: str) -> list:
    """A visitor-readable error in the run info line; every other output left as it is."""
    out = [_skip()] * N_OUTPUTS
    out[RUN_INFO] = render.message_html(message)
    return out


CALIBRATING = {"layer-skip": "which of the target's layers layer skip leaves out",
               "early-exit": "which of the target's layers early exit drafts from"}


def calibrating_outputs(method: str) -> list:
    """The page while a self-speculative method's one-time calibration runs before the race (a
    visitor's first layer-skip run showed "Press Run" in both panes for 35-45 s, 2026-11-28)."""
    out = _cleared(RunView(1, 0.0, ""), "measuring first: see the line above")
    what = CALIBRATING.get(method) or render.guesses_from(method)
    out[RUN_INFO] = render.message_html(
        f"Measuring, once for this pair on this machine, {what} "
        "(35-45 s on a 2-core CPU; cached, so later runs start at once). The race starts after it, "
        "and this time is not part of either side's clock.", kind="loading")
    return out


# the panes before a run, and after one that failed: the failure's message is in the run info line alone
IDLE_BASE = "<span class='sv-placeholder'>Press Run: plain decoding streams here.</span>"
IDLE_SPEC = "<span class='sv-placeholder'>Press Run: speculative rounds stream here.</span>"


def failed_outputs(message: str, view: RunView | None = None) -> list:
    """A run that failed (or never started): the message in the run info line, once; the panes as
    before any run, the numbers and charts empty. Nothing of the previous run stays on screen, and
    nothing else repeats the message (issue 71: a toast, the run info line, both panes and the
    speedup box each said it)."""
    view = view or RunView(1, 0.0, "")
    view.error = message
    out = PaneStream(view).outputs(charts=True)
    out[0], out[1] = IDLE_BASE, IDLE_SPEC
    return out


def page_error(text: str, print_exception: bool = False):
    """What a failed run raises once its message is on the page: gradio_client callers get an error
    with the message (the API call still fails), the page no toast (visible=False), so the message
    is said once, where the run's line is."""
    import gradio as gr
    return gr.Error(render.toast_text(text), visible=False, print_exception=print_exception)


def _cleared(view: RunView, placeholder: str) -> list:
    """`view`'s outputs with both panes showing `placeholder`: nothing of a previous run stays."""
    out = PaneStream(view).outputs(charts=True)
    out[0] = out[1] = f"<span class='sv-placeholder'>{placeholder}</span>"
    return out


class PaneStream:
    def __init__(self, view: RunView, head: str = "", chart_every: float = 0.5, ui_interval: float = 0.25,
                 banner: str = "", guard=None):
        self.view = view
        self.base_html = head  # baseline pane (prompt, then one span per token)
        self.spec_html = head  # speculative pane (prompt, then one span per round)
        self.chart_every = chart_every
        self.ui_interval = ui_interval
        self.banner = banner  # HTML above the run info (replays say so here, and live runs: ui/live.py)
        # replays: render under isolation.untimed_work, never during a fair race's timed step
        self.guard = guard or contextlib.nullcontext

    def add(self, side: str, ev) -> bool:
        """Take one event; True if it changed what the charts show."""
        self.view.add(side, ev)
        if side == "baseline" and isinstance(ev, TokenEvent):
            self.base_html += render.token_span(ev)
        elif side == "speculative" and isinstance(ev, RoundEvent):
            self.spec_html += render.round_html(ev, self.view.method)
            return True
        return False

    def run_info(self, snap: dict) -> str:
        return self.banner + render.run_info_html(snap)

    def outputs(self, charts: bool = True) -> list:
        """[baseline pane, speculative pane, numbers, run info, 4 charts, token tree];
        charts not redrawn are gr.skip()."""
        snap = self.view.snapshot()
        if charts:
            figs = all_charts(self.view) + [latest_tree_figure(self.view)]
        else:
            import gradio as gr
            figs = [gr.skip()] * CHARTS
        return [self.base_html, self.spec_html, render.stats_html(snap), self.run_info(snap), *figs]

    def unchanged(self) -> list:
        """An update that changes nothing on the page (ui/live.follow's keep-alive)."""
        import gradio as gr
        return [gr.skip()] * N_OUTPUTS

    def follow(self, stream: Iterable[tuple[str, object]]) -> Iterator[list]:
        """Consume the stream, yielding throttled outputs (not the final state:
        the caller adds its notes, then yields outputs(charts=True))."""
        last_ui = last_chart = prev_event = time.perf_counter()
        dirty = False  # charts lag the events
        for side, ev in stream:
            with self.guard():
                dirty |= self.add(side, ev)
            now = time.perf_counter()
            slow = now - prev_event >= 0.5  # a slow stream has time for every redraw
            prev_event = now
            if now - last_ui >= self.ui_interval or slow:
                charts = dirty and (slow or now - last_chart >= self.chart_every)
                with self.guard():
                    out = self.outputs(charts)
                yield out
                # time spent rendering and sending is not the stream being slow: counting it
                # made every event after a slow redraw "slow", redrawing charts each time
                last_ui = prev_event = time.perf_counter()
                if charts:
                    last_chart, dirty = last_ui, False
