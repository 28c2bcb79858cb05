"""Fair-mode isolation: the VirtualClock counts only a side's own steps, and
pair loads / replays never share the CPU with a timed step."""
import threading
import time
from types import SimpleNamespace

import pytest
from helpers import fake_pair

from specviz.engine import rounds
from specviz.engine.events import Outcome, RunSummary, TokenEvent
from specviz.run import isolation, race

WORK = {"baseline": 0.010, "speculative": 0.004}  # seconds of "engine work" per event
N = 6


def _fake_run_events(pair, req, side, prompt_ids, stop=None, clock=None):
    for i in range(N):
        time.sleep(WORK[side])
        yield TokenEvent(i, "x", Outcome.TARGET, clock.now())
    yield RunSummary(side=side, method="plain", token_ids=[], text="", n_tokens=N, elapsed=clock.now(),
                     prefill=0.0, target_forwards=N, stop_reason="max_new_tokens")


def _elapsed(consumer_sleep: float) -> dict:
    out = {}
    for side, ev in race.race(fake_pair(device="cpu"), None, [], mode="fair"):
        if isinstance(ev, RunSummary):
            out[side] = ev.elapsed
        time.sleep(consumer_sleep)  # rendering, sending, a slow browser…
    return out


class _FakeTime:
    """A time source only this test moves: engine work and consumer time both advance it, so what
    the clocks count is exact and no wall-clock time is compared (a loaded machine cannot flip it)."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t

    process_time = perf_counter

    def sleep(self, s):
        self.t += s


def test_consumer_time_is_not_counted(monkeypatch):
    """The fake engine's work and the consumer's time both run on the fake time source (this module's
    `time` and the clocks'), so the clocks must count exactly the engine's work."""
    fake = _FakeTime()
    monkeypatch.setattr(rounds, "time", fake)
    monkeypatch.setitem(globals(), "time", fake)
    monkeypatch.setattr(race, "run_events", _fake_run_events)
    quick, sleepy = _elapsed(0.0), _elapsed(0.05)
    for side in ("baseline", "speculative"):
        assert sleepy[side] == pytest.approx(WORK[side] * N) == quick[side], (side, quick, sleepy)


def test_a_step_waits_for_untimed_work_off_the_clock(monkeypatch):
    monkeypatch.setattr(race, "run_events", _fake_run_events)
    held = threading.Event()

    def replay_render():  # e.g. a replay's render holding the lock for 0.3 s
        with isolation.untimed_work():
            held.set()
            time.sleep(0.3)

    th = threading.Thread(target=replay_render)
    th.start()
    held.wait()
    got = _elapsed(0.0)
    th.join()
    for side in ("baseline", "speculative"):
        assert got[side] < WORK[side] * N + 0.15, got  # the 0.3 s wait is not counted


def test_race_running_flag():
    assert not isolation.race_running()
    with isolation.racing():
        assert isolation.race_running()
    assert not isolation.race_running()


def test_pair_load_waits_for_a_timed_step():
    from specviz.ui.loader import ModelManager
    order = []

    def loader(spec, device=None, progress=None, **kw):
        order.append("load")
        raise RuntimeError("no model here")

    m = ModelManager(loader=loader)
    with isolation.timed_step():
        m.start(SimpleNamespace(label="x", name="x"))
        time.sleep(0.2)
        order.append("step done")
    m._thread.join(5)
    assert order == ["step done", "load"]


def test_a_race_starts_its_clocks_only_once_background_work_is_paused():
    """A background job (the page's calibration) computes between pause points; a race entering
    `racing()` waits for the next one, so none of its steps is timed beside the job's work."""
    order, at_work = [], threading.Event()

    def job():
        with isolation.background_job():
            at_work.set()
            time.sleep(0.3)  # packing a layer: no pause point here
            order.append("job reached its pause point")
            with isolation.background_paused():
                while isolation.race_running():
                    time.sleep(0.01)
            order.append("job resumed")

    t = threading.Thread(target=job)
    t.start()
    at_work.wait(5)
    with isolation.racing():
        order.append("race timing")
    t.join(5)
    assert order == ["job reached its pause point", "race timing", "job resumed"]


def test_a_race_waits_no_longer_than_its_bound_for_background_work(monkeypatch):
    """A job that never reaches a pause point holds a race back at most BACKGROUND_WAIT_S."""
    monkeypatch.setattr(isolation, "BACKGROUND_WAIT_S", 0.05)
    with isolation.background_job():
        assert isolation.wait_background(0.01) is False
        with isolation.racing():
            assert isolation.race_running()
    assert isolation.wait_background(0.01) is True
