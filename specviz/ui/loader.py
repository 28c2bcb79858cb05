"""ModelManager: loads a model pair in a background thread and reports progress.

The page polls status() (a plain dict) to show loading progress, errors and the
ready pair. A failing load leaves the previous pair (if any) in service, so the
app keeps working and the visitor sees why the new pair did not load.

Ready in seconds (issue 21): a pair loads with the cached calibration, else an
untimed safe default (fp32), and Run is enabled at once. When nothing quiet is
cached, the calibration then runs in the background (BackgroundCalibration:
a second copy of the pair, timed with a hard budget, pausing while a run goes)
and its pair replaces the default one when it is done. On a busy 2-core machine
the blocking calibration took 11.5 minutes before Run was enabled.
"""
from __future__ import annotations

import gc
import inspect
import os
import threading
import time
from pathlib import Path

from ..engine.pair import runs_as
from ..errors import load_error_text
from ..machine import PAUSE, Lock, on_zerogpu
from ..models import PairSpec, load_pair
from ..run import isolation

CALIBRATION = ("background", "off", "blocking")  # off: --no-calibrate; blocking: measure before ready
BUDGET = float(os.environ.get("SPECVIZ_CALIBRATION_BUDGET", 300))  # seconds, the background calibration


class CalibrationStopped(Exception):
    """The background calibration ran past its budget (or the pair changed)."""


def _takes(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class ModelManager:
    def __init__(self, device: str | None = None, loader=load_pair, quantize: str | None = None,
                 precision: str | None = None, draft_vocab: int | None = None,
                 calibration: str = "background",
                 calibration_file: str | Path | None = None, budget: float = BUDGET, prewarm: bool = False):
        self.prewarm = prewarm  # stage mode: one short run of each side before Run is enabled
        self.calibration = calibration if calibration in CALIBRATION else "background"
        # a stored calibration (stage machines): read if it exists, else written by this start's measurement
        self.calibration_file = Path(calibration_file) if calibration_file else None
        self.budget = budget
        self.calib: dict = {}  # the background calibration's state, shown in the page
        self.device = device
        self.draft_vocab = draft_vocab
        self.quantize = quantize if quantize not in (None, "", "none") else None
        self.precision = precision if precision not in (None, "", "auto") else None
        self._loader = loader
        self._lock = Lock()
        self.pair = None  # the ModelPair in service
        self.spec: PairSpec | None = None  # its spec
        self.loading: PairSpec | None = None  # the spec being loaded
        self.message = ""
        self.frac = 0.0
        self.error: str | None = None
        self.generation = 0  # bumps on every change of state
        self.owner: str | None = None  # who asked for the current/last load (a session id)
        self._thread: threading.Thread | None = None
        self._first: PairSpec | None = None  # the start pair (the stored calibration file is its)

    # ------------------------------------------------------------ loading

    def start(self, spec: PairSpec, owner: str | None = None) -> bool:
        """Start loading `spec` in the background; False if a load is already running.
        `owner` (a session id): only that session is shown the error if this load
        fails while an older pair keeps serving."""
        with self._lock:
            if self.loading is not None:
                return False
            self.loading, self.owner = spec, owner
            self.message, self.frac, self.error = f"starting: {spec.label}", 0.0, None
            self.generation += 1
        self._thread = threading.Thread(target=self._run, args=(spec,), name="specviz-load", daemon=True)
        self._thread.start()
        return True

    def _progress(self, msg: str, frac: float) -> None:
        with self._lock:
            self.message, self.frac = str(msg), float(frac or 0.0)
            self.generation += 1

    def _extra(self, spec: PairSpec, mode: str) -> dict:
        extra = {"quantize": self.quantize} if self.quantize else {}
        if self.precision:
            extra["precision"] = self.precision
        if self.draft_vocab is not None:
            extra["draft_vocab"] = self.draft_vocab
        if _takes(self._loader, "calibration"):
            extra["calibration"] = mode
            if self.calibration_file is not None and spec is self._first:
                extra["cache_file"] = self.calibration_file
        return extra

    def _run(self, spec: PairSpec) -> None:
        self._first = self._first or spec
        t0 = time.monotonic()
        mode = "auto" if self.calibration == "blocking" else "cached"
        try:
            extra = self._extra(spec, mode)
            with isolation.untimed_work():  # never during a timed step of a fair race
                pair = self._loader(spec, device=self.device, progress=self._progress, **extra)
                if self.prewarm and not on_zerogpu():  # ZeroGPU: no GPU outside a run's call
                    self._progress("warming up: one short run of each side", 0.98)
                    prewarm(pair)
        except BaseException as err:  # noqa: BLE001 - shown in the page, the app keeps serving
            with self._lock:
                self.error = load_error_text(err)
                self.loading = None
                self.generation += 1
            print(f"SpecViz: loading {spec.label} failed after {time.monotonic() - t0:.0f} s: {self.error}",
                  flush=True)  # the host's log says it too (a first start is timed from it)
            gc.collect()
            return
        with self._lock:
            self.pair, self.spec = pair, spec
            self.calib = {}
            self.loading, self.error, self.frac = None, None, 1.0
            self.message = "models ready"
            self.generation += 1
        print(f"SpecViz: models ready ({spec.label}) in {time.monotonic() - t0:.0f} s", flush=True)
        gc.collect()
        if self.calibration == "background" and pair.calibration in ("untimed", "noisy") and not on_zerogpu():
            BackgroundCalibration(self, spec, pair).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no load is running (tests, CLI); True if a pair is ready."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.loading is not None:
            if end is not None and time.monotonic() > end:
                break
            time.sleep(0.05)
        return self.pair is not None

    # ------------------------------------------------------------ state

    @property
    def ready(self) -> bool:
        return self.pair is not None and self.loading is None

    def status(self, viewer: str | None = None) -> dict:
        """State for the page. A failed switch of pair is an error for the
        session that asked for it (or everyone, with viewer None); the others
        just keep using the pair in service."""
        with self._lock:
            pair, spec = self.pair, self.spec
            error = self.error
            if error and pair is not None and viewer is not None and self.owner is not None \
                    and viewer != self.owner:
                error = None
            return dict(
                loading=self.loading is not None,
                loading_label=self.loading.label if self.loading else None,
                message=self.message, frac=self.frac, error=error,
                ready=pair is not None and self.loading is None,
                label=spec.label if spec else None,
                name=spec.name if spec else None,
                device=str(pair.device) if pair is not None else None,
                precision=runs_as(pair) if pair is not None else "",
                precision_note=pair.precision_note if pair is not None else "",
                calibration=pair.calibration if pair is not None else "",
                calib=dict(self.calib), calibration_mode=self.calibration,
                generation=self.generation,
                # why this pair / where each side runs / what the engine cannot show
                note=pair.note if pair is not None else "",
            )


def available_memory() -> float:
    """Bytes the kernel says can be allocated (inf where /proc/meminfo is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("inf")


def prewarm(pair, tokens: int = 8) -> None:
    """A short greedy run of each side, untimed: the first run on stage then starts warm
    (allocator, kernels and the tokenizer's caches ready). Best effort."""
    from ..run.request import encode_prompt, make_request
    from ..run.runner import run_events
    try:
        req = make_request("def add(a, b):", max_new_tokens=tokens, gamma=4)
        ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
        for mode in ("baseline", "speculative"):
            for _ in run_events(pair, req, mode, ids):
                pass
    except Exception:  # noqa: BLE001 - warming is an optimisation; a real run reports real errors
        pass


class BackgroundCalibration:
    """Times a second copy of the pair (load_pair(calibration="fresh")) with a
    hard budget, pausing while any run goes (its steps must not share the CPU
    with timing forwards), then swaps it in for the untimed or noisy pair."""

    def __init__(self, manager: ModelManager, spec: PairSpec, pair):
        self.m, self.spec, self.pair = manager, spec, pair
        self.t0 = time.monotonic()
        self.paused = 0.0  # seconds spent waiting for runs

    def start(self) -> None:
        self._set(state="running", step="starting", started=time.time(), budget=self.m.budget)
        threading.Thread(target=self._run, name="specviz-calibrate", daemon=True).start()

    def _set(self, **kw) -> None:
        with self.m._lock:
            self.m.calib = {**self.m.calib, **kw, "elapsed": round(time.monotonic() - self.t0, 1)}
            self.m.generation += 1

    def _over(self) -> bool:
        return time.monotonic() - self.t0 > self.m.budget or self.m.spec is not self.spec

    def check(self) -> None:
        """Before each timed forward: wait while a run goes, stop at the budget."""
        if isolation.race_running():
            self._set(step="paused while a run goes")
            with isolation.background_paused():  # the race's clocks start once this job waits here
                while isolation.race_running() and not self._over():
                    time.sleep(0.2)
            self._set(disturbed=True)
        if self._over():
            raise CalibrationStopped(f"stopped at its {self.m.budget:g} s budget")

    def _progress(self, msg: str, frac: float) -> None:
        self.check()
        self._set(step=str(msg))

    def _room(self) -> bool:
        """A second copy (and a fp32 reload while casting) must fit in the free memory."""
        need = 2 * sum(p.numel() * p.element_size() for m in (self.pair.target, self.pair.draft)
                       if m is not None and hasattr(m, "parameters") for p in m.parameters())
        return need <= 0.9 * available_memory()

    def _run(self) -> None:
        if not self._room():
            self._set(state="skipped", step="not enough free memory for a second copy of the pair; "
                                           "`python -m specviz generate` calibrates once and caches it")
            return
        PAUSE.set(self.check)  # this thread's context only
        try:
            with isolation.background_job():  # races wait for its pause points (run/isolation.py)
                pair = self.m._loader(self.spec, device=self.m.device, progress=self._progress,
                                      **self.m._extra(self.spec, "fresh"))
        except CalibrationStopped as e:
            self._set(state="stopped", step=str(e))
            return
        except BaseException as e:  # noqa: BLE001 - the untimed pair keeps serving
            self._set(state="failed", step=load_error_text(e))
            return
        finally:
            gc.collect()
        with self.m._lock:
            if self.m.spec is not self.spec:  # another pair was loaded meanwhile
                return
            self.m.pair = pair  # runs under way keep the pair they started with
        self._set(state="done", step=pair.precision_note)
        del self.pair
        from ..engine.cpu.memory import trim_heap
        trim_heap()  # the untimed pair's memory back to the OS: 4.48 GB resident after runs, 3.28 without
