"""Start `python app.py` on the tiny random pair in a subprocess, once per test
session (shared by test_app.py and test_browser.py), on a free port."""
from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    def __init__(self, *extra: str, startup_timeout: float = 180.0):
        from specviz.models.tiny import save_tiny_pair
        self.dir = tempfile.mkdtemp(prefix="specviz-app-test-")
        target, draft = save_tiny_pair(self.dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = open(Path(self.dir) / "app.log", "w+")
        # one intra-op thread: tiny models are faster that way, and much less
        # sensitive to other jobs on a small shared machine
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False",
               "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--target", target, "--draft", draft,
             "--port", str(self.port), "--host", "127.0.0.1", *extra],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.close)
        self._wait(startup_timeout)

    def _wait(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"app.py did not serve {self.url} in {timeout} s:\n{self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_server: AppServer | None = None


def shared_server() -> AppServer:
    global _server
    if _server is None or not _server.alive():
        _server = AppServer()
    return _server


def ready_client(server: AppServer, timeout: float = 120.0):
    """A gradio_client Client on `server` once its models are loaded."""
    from gradio_client import Client

    client = Client(server.url, verbose=False)
    end = time.monotonic() + timeout
    status = ""
    while time.monotonic() < end:
        status = client.predict(api_name="/status")[0]
        if "sv-status-ready" in status:
            return client
        time.sleep(0.3)
    raise TimeoutError(f"models not ready: {status}\n{server.output()}")


class InProcessApp:
    """The page built in this process on the tiny pair (so tests can monkeypatch
    the engine and see inside), served on a free port without blocking."""

    def __init__(self, root, limits=None, **build_kw):
        from specviz.models import resolve_pair
        from specviz.models.tiny import save_tiny_pair
        from specviz.ui.blocks import build_demo
        from specviz.ui.loader import ModelManager
        from specviz.ui.render import page_css

        target, draft = save_tiny_pair(root)
        self.dir = str(root)
        self.manager = ModelManager(device="cpu")
        spec = resolve_pair(None, target, draft)
        self.manager.start(spec)
        if not self.manager.wait(60):
            raise RuntimeError(f"tiny pair did not load: {self.manager.status()}")
        self.demo = build_demo(self.manager, initial=spec, network=False, limits=limits, **build_kw)
        self.demo.queue(default_concurrency_limit=4, max_size=64)  # as app.py
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.demo.launch(server_name="127.0.0.1", server_port=self.port, prevent_thread_lock=True, quiet=True,
                         css=page_css())

    def client(self):
        from gradio_client import Client
        return Client(self.url, verbose=False)

    def close(self) -> None:
        self.demo.close()
