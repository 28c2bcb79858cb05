"""Replay through the app's API (the shared `python app.py` server on the tiny
pair, driven with gradio_client): a shipped trace streams and finishes, Stop
stops it, a bad upload is a clear error."""
import time

import pytest

gradio_client = pytest.importorskip("gradio_client")
from browser.server import shared_server  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from helpers import press_stop  # noqa: E402

from specviz.ui import replay as rp  # noqa: E402

BASE, SPEC, STATS, INFO = 0, 1, 2, 3


@pytest.fixture(scope="module")
def client():
    return Client(shared_server().url, verbose=False)


@pytest.fixture(scope="module")
def shipped():
    traces = rp.shipped()
    assert traces, "no shipped traces"
    return traces


def test_replay_streams_and_finishes(client, shipped):
    name, tr = min(shipped.items(), key=lambda kv: kv[1].summaries()["baseline"].elapsed)
    job = client.submit(name, None, 20.0, api_name="/replay")
    job.result(timeout=120)
    outs = job.outputs()
    assert len(outs) >= 2, "expected the first frame and the final state"
    final = outs[-1]
    assert "not live" in final[INFO] and tr.meta["hardware"] in final[INFO]
    assert final[SPEC].count('class="sv-round"') == len([e for s, e in tr.events if s == "speculative"]) - 1
    assert "sv-target" in final[BASE]
    assert "done" in final[STATS] and "measured speedup, prompt read included" in final[STATS]
    assert "without the prompt read" in final[STATS]  # the other figure beside it (issue 71)
    assert "of it: prompt read" in final[STATS]  # and each side's prompt read
    # the same numbers the recorded run had
    s = tr.summaries()
    speedup = s["speculative"].tokens_per_s / s["baseline"].tokens_per_s
    assert f"{speedup:.2f}×" in final[STATS]


def test_stop_stops_a_replay(client, shipped):
    name = max(shipped, key=lambda n: shipped[n].summaries()["baseline"].elapsed)
    job = client.submit(name, None, 1.0, api_name="/replay")
    end = time.monotonic() + 60
    while len(job.outputs()) < 1 and time.monotonic() < end:
        time.sleep(0.05)
    final = press_stop(client, job)
    assert "replay stopped by you" in final[INFO]


def test_a_run_ends_the_sessions_replay(client, shipped):
    """A visitor pressed Run while a replay played: both went on, their frames took turns in the
    same panes, and the replay, ending last, hid the run (a browser pass on 2026-11-28)."""
    from test_app import args
    name = max(shipped, key=lambda n: shipped[n].summaries()["baseline"].elapsed)
    replay = client.submit(name, None, 1.0, api_name="/replay")
    end = time.monotonic() + 60
    while len(replay.outputs()) < 1 and time.monotonic() < end:
        time.sleep(0.05)
    assert not replay.done(), "replay finished before the run could be tested"
    out = client.predict(*args(max_new_tokens=8), api_name="/run")
    assert replay.done(), "the replay went on after the run"
    assert "replay stopped" in replay.outputs()[-1][INFO]
    assert "identical outputs" in out[INFO] and "not live" not in out[INFO]


def test_bad_upload_is_a_clear_error(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": "world"}')
    with pytest.raises(Exception) as info:
        client.predict(None, handle_file(str(bad)), 1.0, api_name="/replay")
    assert "not a SpecViz trace" in str(info.value) or "unsupported trace version" in str(info.value)


def test_replay_plays_your_last_run(shipped):
    """A visitor found Replay played a 2026-11-23 recording after their run: their own played only by
    downloading its trace and uploading it again. The picker's "your last run" plays this session's
    last live run, still after a replay of a recorded one."""
    from test_app import args
    mine = Client(shared_server().url, verbose=False)  # a session of its own
    with pytest.raises(Exception, match="no run of yours on this page yet"):
        mine.predict(rp.YOURS, None, 20.0, api_name="/replay")
    run = mine.predict(*args(max_new_tokens=8), api_name="/run")
    name = min(shipped, key=lambda n: shipped[n].summaries()["baseline"].elapsed)
    mine.predict(name, None, 20.0, api_name="/replay")  # a recorded run's replay in between
    final = mine.predict(rp.YOURS, None, 20.0, api_name="/replay")
    assert "not live" in final[INFO] and "not live" not in run[INFO]
    assert final[BASE] == run[BASE]  # the run's own tokens
    assert final[SPEC].count('class="sv-round"') == run[SPEC].count('class="sv-round"')
