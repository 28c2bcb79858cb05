"""llama.cpp as a reference engine for the bench: `llama-server` processes on
127.0.0.1, one per setting (plain; speculative per draft n_max), on the same
GGUF files as the default pair and the same prompt token ids.

Why the server and not llama-cli: /completion takes the prompt as token ids
(no second tokenisation), returns the generated token ids ("return_tokens")
and llama.cpp's own timings (prefill, decode, drafted, accepted), and the
/metrics counters give its verification steps. Built by
`bash scripts/setup.sh llamacpp` into .llamacpp/ (not in the main test path).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError
from .logs import log_reason
from .vllm_server import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "run `bash scripts/setup.sh llamacpp` (builds llama-server into .llamacpp/)"
START_TIMEOUT_S = float(os.environ.get("SPECVIZ_LLAMACPP_START_TIMEOUT", 300))
CTX = 4096  # KV cache per server: the bench prompts + new tokens fit; the GGUF's 32k would allocate ~1 GB
STOP = {"eos": "eos", "limit": "max_new_tokens", "word": "stop_word", "none": "stopped"}


class LlamaCppError(ModelError):
    """llama.cpp not built, a server that did not start, or a bad answer."""


def server_binary() -> Path:
    """$SPECVIZ_LLAMACPP_SERVER, else llama-server in $SPECVIZ_LLAMACPP (or .llamacpp)/bin."""
    explicit = os.environ.get("SPECVIZ_LLAMACPP_SERVER")
    path = Path(explicit) if explicit else (
        Path(os.environ.get("SPECVIZ_LLAMACPP") or ROOT / ".llamacpp") / "bin" / "llama-server")
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise LlamaCppError(f"no llama.cpp server at {path}: {SETUP_HINT}")
    return path


# ------------------------------------------------------------------ parsing


@dataclass
class Completion:
    """One /completion answer, in llama.cpp's own measurements."""

    token_ids: list[int]
    text: str
    stop_reason: str
    n_prompt: int
    prompt_ms: float  # prefill and the first token (server: t_prompt_ms)
    n_predicted: int  # generated tokens, the first one included
    predicted_ms: float  # first token to last
    drafted: int = 0
    accepted: int = 0
    decode_tps: float | None = None  # llama.cpp's predicted_per_second: (n - 1) / predicted_ms

    @property
    def elapsed(self) -> float:
        return (self.prompt_ms + self.predicted_ms) / 1e3


def parse_completion(answer: dict) -> Completion:
    """A /completion JSON answer (stream off, return_tokens on) -> Completion."""
    try:
        t = answer["timings"]
        tokens = [int(x) for x in answer["tokens"]]
        stop = answer.get("stop_type") or ("eos" if answer.get("stopped_eos") else
                                           "limit" if answer.get("stopped_limit") else "none")
        return Completion(tokens, answer.get("content", ""), STOP.get(stop, stop), int(t["prompt_n"]),
                          float(t["prompt_ms"]), int(t["predicted_n"]), float(t["predicted_ms"]),
                          int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)),
                          float(t["predicted_per_second"]) if t.get("predicted_per_second") else None)
    except (KeyError, TypeError, ValueError) as e:
        raise LlamaCppError(f"llama-server answered without {e} (is it a llama.cpp server with "
                            f"return_tokens?): {json.dumps(answer)[:200]}") from None


def parse_counter(metrics: str, name: str) -> float | None:
    """A `llamacpp:<name> value` line of /metrics (Prometheus text)."""
    m = re.search(rf"^llamacpp:{re.escape(name)}\s+(\S+)", metrics, re.M)
    return float(m.group(1)) if m else None


def system_info(log_text: str) -> str:
    """The CPU features llama.cpp's kernels use, from its start-up log ("CPU : SSE3 = 1 | ... AVX2 = 1")."""
    m = re.search(r"system_info:.*?\|\s*(CPU\s*:.*)$", log_text, re.M)
    if not m:
        return ""
    on = [k.strip() for k, v in re.findall(r"([A-Z0-9_]+)\s*=\s*(\d+)", m.group(1)) if v != "0"]
    return " ".join(on)


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def process_peak_mb(pid: int, key: str = "VmHWM") -> float | None:
    """A process's peak resident memory in MB (key "VmRSS": its resident memory now)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# ------------------------------------------------------------------ servers


def server_command(binary: str, target: str, port: int, threads: int, draft: str | None = None,
                   n_max: int = 0, n_min: int = 0) -> list[str]:
    """One slot, no prompt cache; with a draft: draft-simple speculative decoding, n_max drafts per
    round (p_min 0: the draft never stops early, a fixed γ like ours)."""
    cmd = [binary, "-m", target, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", str(CTX), "-np", "1", "--cache-ram", "0", "--no-webui", "--metrics",
           # its CPU features (system_info) are logged from verbosity 4 only (llama-server 0.5.0, built from
           # the llama-cpp-python 0.3.36 sdist); that level adds ~1 log line per token, not per op
           "-lv", "4"]
    if draft:
        cmd += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max),
                "--spec-draft-n-min", str(n_min), "--spec-draft-p-min", "0", "-td", str(threads),
                "-tbd", str(threads)]
    return cmd


@dataclass
class Server:
    """A llama-server this process started; stop() ends it."""

    name: str
    cmd: list[str]
    url: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None
    info: dict = field(default_factory=dict)

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        port = free_port()
        cmd = [*self.cmd]
        cmd[cmd.index("--port") + 1] = str(port)
        self.cmd, self.url = cmd, f"http://127.0.0.1:{port}"
        fd, log = tempfile.mkstemp(prefix=f"specviz-llamacpp-{self.name.replace(':', '-')}-", suffix=".log")
        self.log = Path(log)
        with os.fdopen(fd, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LlamaCppError(f"llama-server ({self.name}) exited with code {self.proc.returncode}: "
                                    f"{log_reason(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.info["system_info"] = system_info(self.log.read_text(errors="replace"))
                        return
            except (OSError, ValueError):
                pass  # 503 while loading, refused before listening
            time.sleep(0.2)
        self.stop()
        raise LlamaCppError(f"llama-server ({self.name}) did not answer in {timeout:.0f} s")

    def complete(self, ids: list[int], max_new_tokens: int) -> Completion:
        body = {"prompt": list(ids), "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1,
                "seed": 0, "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                return parse_completion(json.loads(r.read().decode()))
        except urllib.error.HTTPError as e:
            raise LlamaCppError(f"llama-server ({self.name}) refused the request: "
                                f"{e.read().decode(errors='replace')[:300]}") from None
        except (OSError, ValueError) as e:
            raise LlamaCppError(f"llama-server ({self.name}) did not answer: {e}") from None

    def counter(self, name: str) -> float | None:
        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
                return parse_counter(r.read().decode(), name)
        except (OSError, ValueError):
            return None

    def cpu_s(self) -> float | None:
        return process_cpu_s(self.proc.pid) if self.proc else None

    def peak_mb(self) -> float | None:
        return process_peak_mb(self.proc.pid) if self.proc else None

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        if self.log is not None:
            self.log.unlink(missing_ok=True)
