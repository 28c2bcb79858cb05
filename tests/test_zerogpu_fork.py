"""ZeroGPU's forked calls, as spaces runs them: a fake `spaces` whose GPU call runs the page's run in a
forked process, as spaces 0.51.3 runs a generator (zero/wrappers.py, generator_function_wrapper):
the arguments and each yield pickled through queues, and a cancel (GeneratorExit at the page's end)
sets an event the fork reads after each yield, then closes the run without a last yield.

What a run leaves for the page (the inspector's rounds, the trace behind the downloads and the theory
chart) must reach the page's process, and Stop, pressed there, must reach the run in the fork: it
ends as a Stop ends it anywhere, its last state ("stopped by you") on the page (hosting/forked.py)."""
import functools
import multiprocessing
import sys
import time

import pytest

gradio_client = pytest.importorskip("gradio_client")
from browser.server import InProcessApp  # noqa: E402
from helpers import press_stop  # noqa: E402
from test_app import INFO, STATS, args  # noqa: E402

from specviz.hosting.forked import Bridge  # noqa: E402
from specviz.ui import inspector  # noqa: E402
from specviz.ui.replay import Records  # noqa: E402


def _child(task, arg_queue, res_queue, stop):
    """The fork: run the call, each yield back through the queue; a set stop closes the run."""
    a, kw = arg_queue.get()
    try:
        gen = task(*a, **kw)
        for res in gen:
            if stop.is_set():
                gen.close()
                break
            res_queue.put(("ok", res))
    except Exception as err:  # noqa: BLE001 - as spaces: the error goes home
        res_queue.put(("error", err))
    res_queue.put(("end", None))


class ForkingSpaces:
    """spaces.GPU for generators, each call a fresh fork (spaces may also reuse an idle one)."""

    procs: list = []

    @classmethod
    def GPU(cls, fn=None, duration=60):
        def wrap(task):
            @functools.wraps(task)
            def handler(*a, **kw):
                duration(*a, **kw) if callable(duration) else duration
                ctx = multiprocessing.get_context("fork")
                arg_queue, res_queue, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
                arg_queue.put((a, kw))  # pickled, as spaces sends them
                proc = ctx.Process(target=_child, args=(task, arg_queue, res_queue, stop), daemon=True)
                proc.start()
                cls.procs.append(proc)
                while True:
                    kind, value = res_queue.get(timeout=120)
                    if kind == "end":
                        return
                    if kind == "error":
                        raise value
                    try:
                        yield value
                    except GeneratorExit:
                        stop.set()
                        raise
            return handler
        return wrap(fn) if fn is not None else wrap


@pytest.fixture(scope="module")
def forked_app(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setitem(sys.modules, "spaces", ForkingSpaces)
    mp.setenv("SPACES_ZERO_GPU", "true")
    records = Records()
    from specviz.run.race import on_engine_thread
    on_engine_thread(lambda: None)  # the page's process has raced before: its fair thread exists
    app = InProcessApp(tmp_path_factory.mktemp("tiny-forked"), records=records)
    app.records = records
    yield app
    app.close()
    mp.undo()


@pytest.fixture
def slow_steps(monkeypatch):
    """Each forward 30 ms slower (set before the fork, so the fork's run has it)."""
    from specviz.engine import decoding
    real = decoding.forward_logits

    def slow(*a, **kw):
        time.sleep(0.03)
        return real(*a, **kw)
    monkeypatch.setattr(decoding, "forward_logits", slow)


def test_a_forked_run_leaves_its_rounds_and_trace_in_the_pages_process(forked_app):
    client = forked_app.client()
    out = client.predict(*args(max_new_tokens=24), api_name="/run")
    assert "identical outputs" in out[INFO]
    proc = ForkingSpaces.procs[-1]
    proc.join(30)
    assert proc.exitcode == 0  # the run was in another process, and it ended
    key = client.session_hash
    got = forked_app.records.get(key)  # the downloads and the theory chart read it here
    assert got is not None, "the run's trace stayed in the fork"
    rounds = inspector.LATEST.get(key)  # the p/q inspector reads it here
    spec = got[0].summaries()["speculative"]
    assert rounds and len(rounds) == spec.rounds
    assert [r.index for r in rounds] == list(range(len(rounds)))


def test_stop_reaches_a_forked_run_and_its_last_state_reaches_the_page(forked_app, slow_steps):
    client = forked_app.client()
    job = client.submit(*args(max_new_tokens=400, gamma=2), api_name="/run")
    end = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < end and not job.done():
        time.sleep(0.05)
    proc = ForkingSpaces.procs[-1]
    final = press_stop(client, job)
    assert "stopped by you" in final[INFO], final[INFO]  # said by the fork, after the Stop reached it
    assert "stopped" in final[STATS]
    proc.join(10)
    assert proc.exitcode == 0, "the forked run went on after Stop"
    got = forked_app.records.get(client.session_hash)
    assert got is not None and got[0].summaries()["speculative"].stop_reason == "stopped"


def test_a_forked_run_ends_the_sessions_replay(forked_app):
    """The replay plays in the page's process, the run in a fork: the run's call, begun in the page's
    process, stops the replay first (a browser pass on 2026-11-28 saw both take turns in the panes)."""
    from specviz.ui import replay as rp
    shipped = rp.shipped()
    client = forked_app.client()
    replay = client.submit(max(shipped, key=lambda n: shipped[n].summaries()["baseline"].elapsed), None, 1.0,
                           api_name="/replay")
    end = time.monotonic() + 60
    while not replay.outputs() and time.monotonic() < end:
        time.sleep(0.05)
    assert not replay.done(), "the replay finished before the run could be tested"
    out = client.predict(*args(max_new_tokens=8), api_name="/run")
    assert replay.done() and "replay stopped" in replay.outputs()[-1][INFO]
    assert "identical outputs" in out[INFO] and "stopped" not in out[STATS]


def test_a_forked_runs_clear_message_reaches_the_page(forked_app):
    """An empty prompt: the fork's gr.Error crosses back (pickled) as the page's one clear line."""
    with pytest.raises(Exception, match="The prompt is empty"):
        forked_app.client().predict(*args(prompt="   "), api_name="/run")


def test_the_next_forked_run_is_clean(forked_app):
    out = forked_app.client().predict(*args(max_new_tokens=16), api_name="/run")
    assert "identical outputs" in out[INFO] and "stopped" not in out[STATS]


def test_the_bridge_applies_at_once_outside_a_forked_call():
    """Off ZeroGPU (no call open) a store is given what it is sent at once: the same path as before."""
    got = []
    b = Bridge()
    b.register("trace", lambda key, tr: got.append((key, tr)))
    b.register("rounds", lambda key, items: got.append((key, items)))
    rounds = [1]
    b.send("trace", "k", "T")
    b.track("rounds", "k", rounds)
    assert got == [("k", "T"), ("k", rounds)] and got[1][1] is rounds  # the live list itself
    b.ask_stop("k")  # no forked calls: no flag, nothing raised
    assert b.flags is None


def test_the_bridge_carries_a_forked_calls_stores_with_its_yields():
    home, rounds = {}, []
    b = Bridge()
    b.register("trace", lambda key, tr: home.__setitem__(("trace", key), tr))
    b.register("rounds", lambda key, items: home.__setitem__(("rounds", key), items))

    def run(request):
        b.track("rounds", request, rounds)
        for i in range(3):
            rounds.append(i)
            yield f"out{i}"
        b.send("trace", request, "T")

    call = b.forked(run, lambda a, kw: a[0])
    sent = list(call("k"))  # in the fork: nothing applied there
    assert home == {} and [out for out, _ in sent] == [("out0",), ("out1",), ("out2",), None]
    outs = list(b.home(iter(sent), "k"))  # at home: applied, in order
    assert outs == ["out0", "out1", "out2"]
    assert home[("trace", "k")] == "T" and home[("rounds", "k")] == [0, 1, 2]
    assert home[("rounds", "k")] is not rounds  # the page's own copy
    assert not b.is_open("k")


def test_a_forked_race_of_all_methods_leaves_its_board_for_the_picker(forked_app):
    """The race-all tab's board (what its method picker re-renders) crosses the fork whole."""
    import gc

    from specviz.ui.leaderboard import BoardHandlers
    client = forked_app.client()
    out = client.predict(["draft", "suffix"], "def f(x):", 4, 12, 0.0, 0, api_name="/race_methods")
    assert "race finished" in out[0], out[0]
    boards = next(h for h in gc.get_objects() if isinstance(h, BoardHandlers)
                  and h.page.records is forked_app.records)
    board = boards._board(client.session_hash)
    assert board is not None and {"draft", "suffix"} <= set(board.runs), "the board stayed in the fork"


def test_a_forked_runs_output_joins_the_pages_memory_and_the_next_fork_copies_from_it(forked_app):
    """The suffix drafters' memory of earlier outputs: a fresh fork copies the page's process, so a
    run's output must reach it, or every run on ZeroGPU would start from an empty memory."""
    from specviz.engine.suffix_tree import MEMORY
    client = forked_app.client()
    key = client.session_hash
    run = dict(prompt="def f(x):", max_new_tokens=24)
    client.predict(*args(**run), method="suffix", api_name="/run")
    tree = MEMORY.tree(key)
    assert tree is not None and len(tree.docs) == 1 and next(iter(tree.docs.values())), \
        "the run's output stayed in the fork"
    client.predict(*args(**run), method="suffix", api_name="/run")  # a fresh fork
    places = [(r.info.get("source") or {}).get("where") for r in inspector.LATEST.get(key)]
    assert "memory" in places, places  # copied from the first run's output
    assert len(MEMORY.tree(key).docs) == 2


def _takes(locks, out) -> None:
    out.put(all(lock.acquire(timeout=2) for lock in locks))


def test_a_fork_gets_free_locks_and_its_own_fair_thread():
    """fork copies a lock as another thread holds it (a replay rendering under isolation.TIMED, a
    store being written), and an executor without its thread: a forked run waited on either for ever."""
    import threading

    from specviz.machine import Lock
    from specviz.run import isolation
    from specviz.run.race import on_engine_thread
    on_engine_thread(lambda: None)
    mine, held, release = Lock(), threading.Event(), threading.Event()

    def hold():
        with isolation.TIMED, mine:
            held.set()
            release.wait(30)
    threading.Thread(target=hold, daemon=True).start()
    held.wait(10)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    try:
        proc = ctx.Process(target=_takes, args=([isolation.TIMED, mine], out))
        proc.start()
        assert out.get(timeout=20) is True
        proc.join(10)
        fair = ctx.Process(target=lambda: out.put(on_engine_thread(lambda: "stepped")))
        fair.start()
        assert out.get(timeout=20) == "stepped"
        fair.join(10)
    finally:
        release.set()


def test_on_zerogpu_the_pair_is_the_one_the_space_starts_with(monkeypatch, tmp_path):
    """A forked worker outlives its call and keeps the pair it was forked with: a pair loaded later in
    the page's process would be named on the page while the worker raced the old one."""
    import app
    from specviz.models import ModelError
    from specviz.models.tiny import save_tiny_pair
    from specviz.ui.handlers import Handlers
    monkeypatch.setitem(sys.modules, "spaces", ForkingSpaces)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    target, draft = save_tiny_pair(tmp_path)
    demo, manager = app.create_app(app.build_parser().parse_args(["--target", str(target), "--draft", str(draft)]))
    handlers = next(f.fn.__self__ for f in demo.fns.values() if f.api_name == "load_pair")
    assert isinstance(handlers, Handlers) and handlers.fixed_pair
    with pytest.raises(ModelError, match="keeps the pair it began with"):
        handlers._spec_for("custom", "org/big", "org/small")
    import gradio as gr  # the pair section says so, and offers nothing to pick (a browser pass found both)

    from specviz.hosting.spaces import ZEROGPU_FIXED
    assert any(isinstance(b, gr.Markdown) and ZEROGPU_FIXED in (b.value or "") for b in demo.blocks.values())
    assert not any(isinstance(b, gr.Dropdown) and b.label == "Target + draft" and b.interactive is not False
                   for b in demo.blocks.values())
    manager.wait(60)
