"""The web app end to end through its API: `python app.py` on the tiny random
pair in a subprocess, driven with gradio_client."""
import time

import pytest

gradio_client = pytest.importorskip("gradio_client")
from browser.server import shared_server  # noqa: E402
from gradio_client import Client  # noqa: E402
from helpers import fake_pair, press_stop  # noqa: E402

GOOD = dict(gamma=4, max_new_tokens=48, temperature=0.0, top_p=1.0, top_k=0, seed=0, chat_template=False,
            mode="fair")
# output order of /run
BASE, SPEC, STATS, INFO = 0, 1, 2, 3


def args(prompt="def f(x):", **kw):
    a = {**GOOD, **kw}
    return (prompt, a["gamma"], a["max_new_tokens"], a["temperature"], a["top_p"], a["top_k"], a["seed"],
            a["chat_template"], a["mode"])


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def client(server):
    c = Client(server.url, verbose=False)
    # wait until the models are loaded (the status endpoint renders the page's status line)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        status = c.predict(api_name="/status")[0]
        if "sv-status-ready" in status:
            return c
        time.sleep(0.5)
    pytest.fail(f"models not ready: {status}\n{server.output()}")


def test_api_names(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/run", "/stop", "/load_pair", "/status"} <= names


def test_run_streams_and_finishes(client):
    job = client.submit(*args(max_new_tokens=200), api_name="/run")
    job.result(timeout=120)
    outs = job.outputs()
    assert len(outs) >= 3, "expected intermediate updates before the final one"
    final = outs[-1]
    assert final[SPEC].count('class="sv-round"') >= 1
    assert "sv-target" in final[BASE]
    assert "identical outputs" in final[INFO], final[INFO]
    assert "mode: <b>fair</b>" in final[INFO]
    assert "done (max tokens)" in final[STATS] or "done (end of text)" in final[STATS]
    # every streamed pane extends the previous one (append-only HTML)
    spec_panes = [o[SPEC] for o in outs if isinstance(o[SPEC], str) and "sv-round" in o[SPEC]]
    assert all(b.startswith(a) for a, b in zip(spec_panes, spec_panes[1:], strict=False))
    # plots come back as plotly JSON
    assert final[4] is not None


def test_parallel_mode_runs(client):
    out = client.predict(*args("hello", max_new_tokens=24, mode="parallel", temperature=0.8, seed=3),
                         api_name="/run")
    assert "mode: <b>parallel</b>" in out[INFO]
    assert "sampled run" in out[INFO]


def test_stop_cancels_promptly_and_next_run_is_clean(client):
    job = client.submit(*args(max_new_tokens=512, gamma=2), api_name="/run")
    end = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < end and not job.done():
        time.sleep(0.05)
    final = press_stop(client, job)
    assert "stopped" in final[STATS] or "stopped" in final[INFO]
    out = client.predict(*args(max_new_tokens=16), api_name="/run")
    assert "identical outputs" in out[INFO] and "stopped" not in out[STATS]


def test_job_cancel_then_app_keeps_serving(client, server):
    job = client.submit(*args(max_new_tokens=512), api_name="/run")
    end = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < end and not job.done():
        time.sleep(0.05)
    job.cancel()
    time.sleep(0.5)
    assert server.alive()
    out = client.predict(*args(max_new_tokens=16), api_name="/run")
    assert "identical outputs" in out[INFO]


@pytest.mark.parametrize("bad, message", [
    (dict(prompt="   "), "prompt is empty"),
    (dict(gamma=99), "16"),
    (dict(gamma=0), "1"),
    (dict(max_new_tokens=100000), "512"),
    (dict(temperature=-1), "0"),
    (dict(mode="warp-speed"), "fair"),
])
def test_bad_settings_give_a_message_and_app_keeps_serving(client, server, bad, message):
    bad = dict(bad)
    prompt = bad.pop("prompt", "def f(x):")
    with pytest.raises(Exception) as info:
        client.predict(*args(prompt, **bad), api_name="/run")
    assert message in str(info.value), str(info.value)
    assert server.alive()


def test_good_run_after_bad_ones(client):
    out = client.predict(*args(max_new_tokens=8), api_name="/run")
    assert "identical outputs" in out[INFO]


def test_model_errors_are_shown_and_the_pair_stays(client):
    # local paths typed in the page are refused without --allow-local-paths
    status = client.predict("custom", "/etc", "/tmp", api_name="/load_pair")[0]
    assert "Local paths are disabled" in status
    # a model id that cannot be loaded: the error is shown, the old pair keeps serving
    client.predict("custom", "no-such-org/no-such-model", "no-such-org/no-such-draft", api_name="/load_pair")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        status = client.predict(api_name="/status")[0]
        if "sv-status-loading" not in status:
            break
        time.sleep(0.3)
    assert "no-such-org/no-such-model" in status and "Still using" in status, status
    out = client.predict(*args(max_new_tokens=8), api_name="/run")
    assert "identical outputs" in out[INFO]


# ---------------------------------------------------------------- in-process


@pytest.fixture(scope="module")
def inproc(inproc_app):
    """A client of the page built in this process on the tiny pair (so the engine
    can be monkeypatched): the session's (conftest.py)."""
    return inproc_app.client()


@pytest.mark.parametrize("error", ["cuda", "runtime"])
def test_out_of_memory_mid_run_is_reported_and_app_keeps_serving(inproc, monkeypatch, error):
    import torch

    import specviz.ui.handlers as blocks  # the page's handlers look these names up

    real_race = blocks.race

    def failing_race(*a, **kw):
        for i, item in enumerate(real_race(*a, **kw)):
            if i == 3:
                if error == "cuda":
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory: "
                                   "you tried to allocate 1234 bytes. out of memory")
            yield item

    monkeypatch.setattr(blocks, "race", failing_race)
    with pytest.raises(Exception) as info:
        inproc.predict(*args(max_new_tokens=32), api_name="/run")
    assert "out of memory" in str(info.value)
    monkeypatch.setattr(blocks, "race", real_race)
    out = inproc.predict(*args(max_new_tokens=8), api_name="/run")
    assert "identical outputs" in out[INFO]


def test_startup_load_failure_is_shown_and_app_serves(tmp_path):
    """A --target that cannot be loaded: the page says why, nothing crashes."""
    import app
    from specviz.ui import render

    ns = app.build_parser().parse_args(["--target", str(tmp_path / "missing"), "--draft", str(tmp_path / "d")])
    demo, manager = app.create_app(ns)
    assert not manager.wait(30)
    status = manager.status()
    assert status["error"] and "missing" in status["error"]
    html = render.status_html(status)
    assert "could not be loaded" in html and "sv-status-error" in html
    bad = app.build_parser().parse_args(["--pair", "no-such-pair"])
    demo2, manager2 = app.create_app(bad)
    assert "unknown pair" in manager2.status()["error"]


def test_page_served_after_ready_paints_the_current_status():
    """issue 41: a page opened after the models were ready showed the status box's build-time value
    ("Loading models… joining 22 parts") for 1-5 s, until its first poll. The config it is served with
    (`/config`, and `/` that embeds it) now carries the status, Run button and timer as they are."""
    import json
    import threading
    import urllib.request

    from browser.server import free_port

    from specviz.models import PairSpec
    from specviz.ui.blocks import build_demo
    from specviz.ui.loader import ModelManager

    gate = threading.Event()

    def gated(spec, device=None, progress=None):
        progress("joining 22 parts", 0.1)
        gate.wait(60)
        return fake_pair(device="cpu", precision_label="float32")

    spec = PairSpec("x", "t", "d", "X + Y", False)
    manager = ModelManager(loader=gated, calibration="off")
    manager.start(spec)
    demo = build_demo(manager, initial=spec, network=False)  # built while loading, as app.py does
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)

    def served(path: str) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30).read().decode()

    def props(elem_id: str) -> dict:
        comps = json.loads(served("/config"))["components"]
        return next(c["props"] for c in comps if c["props"].get("elem_id") == elem_id)

    try:
        assert "Loading models" in props("sv-status")["value"] and not props("sv-run")["interactive"]
        gate.set()
        assert manager.wait(30)
        status, run = props("sv-status"), props("sv-run")
        assert "sv-status-ready" in status["value"] and "X + Y" in status["value"]
        assert "Loading models" not in status["value"]
        assert run["interactive"] and run["value"] == "▶ Run"
        page = served("/")
        assert "sv-status-ready" in page and "sv-status-loading" not in page
        # no gradio run history: it rewrote every call's outputs into localStorage (ui/blocks.py)
        assert json.loads(served("/config"))["run_history"] is False
    finally:
        gate.set()
        demo.close()


def test_loader_reports_progress_and_friendly_errors():
    from specviz.models import ModelError, PairSpec
    from specviz.ui.loader import ModelManager

    spec = PairSpec("x", "t", "d", "X + Y", False)
    seen = []

    def ok(spec, device=None, progress=None):
        progress("loading target t", 0.3)
        seen.append(manager.status()["message"])
        return fake_pair(device="cpu", precision_label="float32")

    manager = ModelManager(loader=ok)
    manager.start(spec)
    assert manager.wait(10) and seen == ["loading target t"]
    assert manager.status()["ready"] and manager.status()["label"] == "X + Y"

    def oom(spec, device=None, progress=None):
        raise RuntimeError("CUDA error: out of memory")

    m2 = ModelManager(loader=oom)
    m2.start(spec)
    assert not m2.wait(10) and "out of memory" in m2.status()["error"]

    def bad(spec, device=None, progress=None):
        raise ModelError("could not load 'x': not found")

    manager._loader = bad
    manager.start(spec, owner="visitor-a")
    manager.wait(10)
    st = manager.status()
    assert st["ready"] and st["error"] == "could not load 'x': not found"  # old pair still serves
    # only the visitor who asked for the failed pair sees its error
    assert manager.status("visitor-a")["error"] and manager.status("visitor-b")["error"] is None


@pytest.mark.parametrize("method", ["lookup", "adaptive", "early-exit", "layer-skip"])
def test_other_draft_methods(client, method):
    out = client.predict(*args("abcabcabcabc", max_new_tokens=16), method, api_name="/run")
    assert "identical outputs" in out[INFO]
    if method == "lookup":
        assert "prompt lookup" in out[INFO]


def test_a_zerogpu_calls_capture_note_is_on_the_run_line(inproc, monkeypatch):
    """What the call captured before the clocks (models/gpu_path.prepare_call, ZeroGPU only) is said on
    the run's line, for the run's whole life."""
    import specviz.ui.handlers as blocks
    note = "CUDA graphs captured in this GPU call: 10 in 0.50 s, before the clocks"
    seen = []
    monkeypatch.setattr(blocks, "prepare_call", lambda pair, end: seen.append(end) or note)
    out = inproc.predict(*args(max_new_tokens=8), api_name="/run")
    assert note in out[INFO] and seen and seen[0] > 8
