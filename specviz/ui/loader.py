"""ModelManager: loads a model pair in a background thread and reports progress.

The page polls status() (a plain dict) to show loading progress, errors and the
ready pair. A failing load leaves the previous pair (if any) in service, so the
app keeps working and the visitor sees why the new pair did not load.
"""
from __future__ import annotations

import gc
import threading
import time

from .. import isolation
from ..errors import load_error_text
from ..models import PairSpec, load_pair


class ModelManager:
    def __init__(self, device: str | None = None, loader=load_pair, quantize: str | None = None,
                 precision: str | None = None, draft_vocab: int | None = None):
        self.device = device
        self.draft_vocab = draft_vocab
        self.quantize = quantize if quantize not in (None, "", "none") else None
        self.precision = precision if precision not in (None, "", "auto") else None
        self._loader = loader
        self._lock = threading.Lock()
        self.pair = None  # the ModelPair in service
        self.spec: PairSpec | None = None  # its spec
        self.loading: PairSpec | None = None  # the spec being loaded
        self.message = ""
        self.frac = 0.0
        self.error: str | None = None
        self.generation = 0  # bumps on every change of state
        self.owner: str | None = None  # who asked for the current/last load (a session id)
        self._thread: threading.Thread | None = None

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

    def _run(self, spec: PairSpec) -> None:
        try:
            extra = {"quantize": self.quantize} if self.quantize else {}
            if self.precision:
                extra["precision"] = self.precision
            if self.draft_vocab is not None:
                extra["draft_vocab"] = self.draft_vocab
            with isolation.untimed_work():  # never during a timed step of a fair race
                pair = self._loader(spec, device=self.device, progress=self._progress, **extra)
        except BaseException as err:  # noqa: BLE001 - shown in the page, the app keeps serving
            with self._lock:
                self.error = load_error_text(err)
                self.loading = None
                self.generation += 1
            gc.collect()
            return
        with self._lock:
            self.pair, self.spec = pair, spec
            self.loading, self.error, self.frac = None, None, 1.0
            self.message = "models ready"
            self.generation += 1
        gc.collect()

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
                precision=getattr(pair, "precision", "") or (str(pair.dtype).removeprefix("torch.")
                                                             if pair is not None else ""),
                precision_note=getattr(pair, "precision_note", "") if pair is not None else "",
                generation=self.generation,
                # why this pair / where each side runs / what the engine cannot show
                note=getattr(pair, "note", "") if pair is not None else "",
            )
