"""The Run button while runs queue: "⏳ queue 2 of 3", then "Running…", disabled
throughout, and "▶ Run" again when the visitor's run ended (issue 21: the
button said "▶ Run" and stayed enabled, and a keyboard run plus a click queued
two runs). It is the page's one queue counter: the run event hides gradio's own
tracker, which counted differently ("queue: 1/1" beside "⏳ queue 2 of 2", issue 51).

Runs go one at a time (concurrency_id "generate"); gradio serves them first
come, first served, so the order in which sessions pressed Run is the queue.
"""
from __future__ import annotations

import time

import gradio as gr

from ..machine import Lock

RUN = "▶ Run"
RUNNING = "Running…"
RACE = "▶ Run race"  # the Race all methods tab's button (ui/blocks.py): "Racing…" and disabled meanwhile
RACING = "Racing…"
STALE = 3600.0  # a press whose run never started (tab closed in the queue) is forgotten after this

# runs in the browser before the press reaches the server: the button is disabled
# at once (a second click or Enter cannot queue a second run) and the run's panes
# scroll into view when they are off screen, now and again when the run's first
# output lands (a focus or caret back in the prompt since, or a wait in the queue,
# scrolls them away; issue 21: 902 px below the top at 1280x720)
PRESS_JS = """() => {
  const b = document.querySelector('#sv-run');
  if (b) b.disabled = true;  // its label comes from run_pressed: a text set here would replace the node
                             // gradio writes labels into, and "Running…" stayed after every run
  // the focus goes to Stop (a disabled Run dropped it to <body>, and the next Tab skipped Stop);
  // ui/stage.py PAGE_JS gives it back to Run when the run ends
  const stop = document.querySelector('#sv-stop');
  if (stop) stop.focus({preventScroll: true});  // show() below decides the scroll
  window.svFocusBack = Date.now();
  const show = () => { if (window.svShowRun) window.svShowRun(); };  // ui/stage.py PAGE_JS
  show();
  if (window.svRunLands) window.svRunLands.disconnect();
  const pane = document.querySelector('#sv-speculative');
  if (pane) {
    window.svRunLands = new MutationObserver(() => { window.svRunLands.disconnect(); show(); });
    window.svRunLands.observe(pane, {childList: true, characterData: true, subtree: true});
  }
  return [];
}"""
# the prompt's Enter presses the button (one event, so trigger_mode="once" guards both)
SUBMIT_JS = """() => { const b = document.querySelector('#sv-run');
  if (b && !b.disabled) b.click(); return []; }"""


class RunQueue:
    """Which sessions pressed Run and wait, and which one runs."""

    def __init__(self, clock=time.monotonic):
        self._lock = Lock()
        self._waiting: dict[str, float] = {}  # session -> when it pressed (insertion order = queue order)
        self._running: set[str] = set()
        self._clock = clock

    def press(self, key: str) -> None:
        with self._lock:
            self._waiting.setdefault(key, self._clock())

    def start(self, key: str) -> None:
        with self._lock:
            self._waiting.pop(key, None)
            self._running.add(key)

    def end(self, key: str) -> None:
        with self._lock:
            self._waiting.pop(key, None)
            self._running.discard(key)

    def busy(self, key: str) -> bool:
        with self._lock:
            return key in self._waiting or key in self._running

    def label(self, key: str) -> str | None:
        """The button's text for this session, None when it has no run."""
        with self._lock:
            now = self._clock()
            for k in [k for k, t in self._waiting.items() if now - t > STALE]:
                del self._waiting[k]
            if key in self._running:
                return RUNNING
            if key not in self._waiting:
                return None
            order = list(self._waiting)
            ahead = len(self._running) + order.index(key)
            total = len(self._running) + len(order)
            return f"⏳ queue {ahead + 1} of {total}" if ahead else RUNNING

    def button(self, key: str, ready: bool):
        """The Run button for this session, or None to leave it to the loading state."""
        text = self.label(key)
        if text is not None:
            return gr.Button(value=text, interactive=False)
        return gr.Button(value=RUN, interactive=True) if ready else None
