"""engine/cpu/threads.py: the fair race steps on the cores other programs leave free (issue 59's drift:
beside a loop on one of two cores, a two-thread step ran 1.6-3.8x slower than a one-thread one)."""
import pytest
import torch
from helpers import fake_pair

from specviz.engine.cpu import threads
from specviz.engine.events import RunSummary
from specviz.machine import CpuMeter
from specviz.run.race import on_engine_thread, race
from specviz.run.request import make_request


def meter(others: list[float], cores=2):
    """A CpuMeter whose /proc readings give `others` cores used by other programs, one per reading."""
    used, own, t = [0.0], [0.0], [0.0]

    def read():
        o = others.pop(0) if len(others) > 1 else others[0]
        t[0] += 1.0
        used[0] += o + 1.0
        own[0] += 1.0
        return used[0], own[0]
    return CpuMeter(read=read, cores=cores, clock=lambda: t[0], interval=0.0)


@pytest.mark.parametrize("others,want", [(0.0, 2), (0.3, 2), (0.6, 1), (1.0, 1), (1.9, 1)])
def test_threads_are_the_cores_others_leave_free(others, want):
    g = threads.Governor(meter([others]))
    g.base = 2
    g.meter.sample()  # the first reading has nothing to compare with
    assert g.threads() == want


def test_no_proc_keeps_the_thread_count(monkeypatch):
    monkeypatch.setattr("os.getloadavg", lambda: (1.5, 1.5, 1.5))  # it counts our own threads too
    g = threads.Governor(CpuMeter(read=lambda: None, cores=2, interval=0.0))  # no /proc here
    g.base = 2
    assert g.threads() == 2


def test_a_fair_race_on_a_loaded_machine_steps_on_one_thread_and_restores(monkeypatch, tok, target, draft):
    monkeypatch.setattr(threads, "METER", meter([1.0]))  # another program keeps one of two cores busy
    base = on_engine_thread(torch.get_num_threads)
    on_engine_thread(torch.set_num_threads, 2)
    try:
        pair = fake_pair(target=target, draft=draft, tokenizer=tok, eos_ids=[], device=torch.device("cpu"))
        req = make_request("x = [1, 2, 3]\ny = [", method="draft", gamma=3, max_new_tokens=12)
        ends = {s: e for s, e in race(pair, req, tok.encode(req.prompt), mode="fair")
                if isinstance(e, RunSummary)}
        assert ends["baseline"].token_ids == ends["speculative"].token_ids
        for side in ("baseline", "speculative"):
            used = ends[side].extra["threads"]
            assert used.get("1", 0) >= sum(used.values()) - 1  # the first step may precede a reading
        assert on_engine_thread(torch.get_num_threads) == 2  # restored after the race
    finally:
        on_engine_thread(torch.set_num_threads, base)


def machine(busy, others_before: float):
    """A simulated machine for settle(): busy(t) cores in use (everyone's) at t s after the update;
    METER's last reading before the update saw `others_before`."""
    t, used = [0.0], [0.0]

    def sleep(s):
        n = max(1, round(s / 0.001))
        for _ in range(n):
            used[0] += busy(t[0]) * s / n
            t[0] += s / n
    m = CpuMeter(read=lambda: None, cores=2, interval=0.0)
    m.others, m.exact = others_before, True
    return m, (lambda: (used[0], 0.0)), sleep, (lambda: t[0])


@pytest.mark.parametrize("busy,before,want", [
    (lambda t: 1.0 if t < 0.3 else 0.0, 0.0, (0.3, 0.36)),  # a browser draws for 0.3 s: wait for it
    (lambda t: 0.0, 0.0, (0.1, 0.16)),  # nothing drawn here (a browser elsewhere): the pause alone
    (lambda t: 1.0, 1.0, (0.1, 0.16)),  # a program on one core all along: no wait for it
    (lambda t: 2.0, 0.0, (0.5, 0.56)),  # busy to the end: at most SETTLE_CAP
])
def test_a_pause_after_an_update_waits_for_the_drawing_not_for_a_steady_load(monkeypatch, busy, before, want):
    m, read, sleep, clock = machine(busy, before)
    monkeypatch.setattr(threads, "METER", m)
    waited = threads.settle(0.1, read=read, sleep=sleep, clock=clock)
    assert want[0] <= waited <= want[1], waited
    assert threads.settle(0.0, read=read, sleep=sleep, clock=clock) == 0.0  # SPECVIZ_UI_SETTLE=0: none
