"""Many visitors, Stop, closed tabs, time limits, and nothing leaks.

`python app.py` on the tiny random pair (the session's shared test server; its
RSS is measured with psutil around the runs) driven by gradio_client:

* 8 concurrent clients x 3 runs (greedy, sampled with a fixed seed, parallel
  mode), with a cancelled and a stopped long run in between: every run
  completes and equals the same run done alone, so no visitor ever sees another
  visitor's tokens; queued runs report their queue position.
* 50 consecutive runs, mixed settings, every fifth stopped midway: the server's
  RSS stays flat (bound below) and a greedy run at the end still equals the
  baseline and the same run at the start.

In process (engine slowed down by monkeypatching): the operator's time limit
really ends a run, and a client that disconnects (a closed tab) ends its run
at once: the race's stop Event is set and the engines stop stepping.
"""
import http.client
import json
import re
import threading
import time
import uuid

import pytest

pytest.importorskip("gradio_client")
psutil = pytest.importorskip("psutil")

from browser.server import free_port, ready_client, shared_server  # noqa: E402
from gradio_client.utils import Status  # noqa: E402
from helpers import run_fields  # noqa: E402

FIELDS = run_fields()  # every input of /run, in order (a raw queue/join must send them all)
GOOD = dict(prompt="def f(x):", gamma=4, max_new_tokens=24, temperature=0.0, top_p=1.0, top_k=0, seed=0,
            chat_template=False, mode="fair", method="draft", gamma_auto=False,
            tree_shape="", tree_budget="", window=4, guesses=2, exit_layer="", trained=True, skip_layers="", fresh_memory=False,
            share_memory=False)
BASE, SPEC, STATS, INFO = 0, 1, 2, 3
MAX_NEW = 512  # the server's limit on new tokens (the built-in default)
RSS_BOUND_MB = 150  # growth of the server's RSS over 50 runs, after warm-up
TOKEN = re.compile(r'<span class="sv-tok ([^"]*)"(?: data-[a-z]+="[^"]*")* title="[^"]*">(.*?)</span>', re.S)


def args(**kw):
    a = {**GOOD, **kw}
    return tuple(a[f] for f in FIELDS)


def tokens(pane: str) -> list[tuple[str, str]]:
    """(outcome, text) of every token span in a pane (tooltips hold timings, so
    whole panes differ between identical runs)."""
    return [(next(c for c in cls.split() if c not in ("sv-tok", "sv-nl", "sv-empty")), text)
            for cls, text in TOKEN.findall(pane)]


def result(out) -> tuple:
    """What must be equal between two runs of the same settings."""
    return tokens(out[BASE]), tokens(out[SPEC])


def rss_mb(server) -> float:
    return psutil.Process(server.proc.pid).memory_info().rss / 2**20


@pytest.fixture(scope="module")
def server():
    return shared_server()


@pytest.fixture(scope="module")
def client(server):
    return ready_client(server)


def wait_started(job, timeout=60):
    """Until the job has sent its first update (it left the queue and runs)."""
    end = time.monotonic() + timeout
    while not job.outputs() and not job.done() and time.monotonic() < end:
        time.sleep(0.02)
    assert job.outputs() or job.done(), "the run never started"


def test_second_client_sees_its_queue_position(server):
    a, b = ready_client(server), ready_client(server)
    long = a.submit(*args(max_new_tokens=MAX_NEW, gamma=1), api_name="/run")
    wait_started(long)
    short = b.submit(*args(max_new_tokens=8), api_name="/run")
    seen = set()
    end = time.monotonic() + 20
    while not long.done() and time.monotonic() < end:
        st = short.status()
        seen.add((st.code, st.rank, st.queue_size))
        if st.code == Status.IN_QUEUE:
            break
        time.sleep(0.02)
    assert (Status.IN_QUEUE, 0, 1) in seen, seen  # next in line, one waiting
    long.cancel()
    out = short.result(timeout=60)
    assert "identical outputs" in out[INFO]


# one visitor's three runs: greedy, sampled with a fixed seed, sampled in parallel mode
def visitor_runs(i: int) -> list[dict]:
    prompt = f"visitor {i}: def f{i}(x):"
    return [
        dict(prompt=prompt, gamma=1 + i % 5, temperature=0.0, method="draft", max_new_tokens=16),
        dict(prompt=prompt, gamma=3, temperature=0.8, top_p=0.9, top_k=40, seed=100 + i,
             method=("draft", "lookup", "adaptive")[i % 3], max_new_tokens=16),
        dict(prompt=prompt, gamma=4, temperature=1.0, seed=7 * i + 1, mode="parallel" if i % 2 else "fair",
             max_new_tokens=16),
    ]


N_VISITORS = 8


def test_concurrent_visitors_get_their_own_outputs(server, client):
    # what each run gives alone, one at a time
    solo = {(i, k): result(client.predict(*args(**r), api_name="/run"))
            for i in range(N_VISITORS) for k, r in enumerate(visitor_runs(i))}
    rss_before = rss_mb(server)
    clients = [ready_client(server) for _ in range(N_VISITORS)]
    got, errors, statuses = {}, [], []
    lock = threading.Lock()

    def visitor(i: int) -> None:
        c = clients[i]
        try:
            for k, r in enumerate(visitor_runs(i)):
                if k == 1:  # a long run, cancelled (job.cancel, as the page's Stop chain does)
                    long = c.submit(*args(prompt=f"long {i}", max_new_tokens=MAX_NEW), api_name="/run")
                    wait_started(long, 120)
                    long.cancel()
                elif k == 2:  # a long run, stopped through the Stop button's endpoint
                    long = c.submit(*args(prompt=f"long {i}", max_new_tokens=MAX_NEW), api_name="/run")
                    wait_started(long, 120)
                    c.predict(api_name="/stop")
                    final = long.result(timeout=30)
                    assert "stopped by you" in final[INFO], final[INFO]
                job = c.submit(*args(**r), api_name="/run")
                while not job.done():
                    st = job.status()
                    with lock:
                        statuses.append((st.code, st.rank, st.queue_size))
                    time.sleep(0.05)
                out = job.result(timeout=120)
                with lock:
                    got[i, k] = out
        except Exception as e:  # noqa: BLE001 - reported below
            with lock:
                errors.append((i, repr(e)))

    threads = [threading.Thread(target=visitor, args=(i,)) for i in range(N_VISITORS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    wall = time.monotonic() - t0
    assert not errors, errors
    assert len(got) == N_VISITORS * 3
    for (i, k), out in got.items():
        assert result(out) == solo[i, k], f"visitor {i} run {k} differs from the same run alone"
        for pane in (out[BASE], out[SPEC]):
            assert f"visitor {i}:" in pane
            assert not any(f"visitor {j}:" in pane for j in range(N_VISITORS) if j != i)
        if k == 0:
            assert "identical outputs" in out[INFO]
    queued = [s for s in statuses if s[0] == Status.IN_QUEUE]
    assert queued and max(s[2] or 0 for s in queued) >= 2, "no queue position was ever reported"
    print(f"\n{N_VISITORS} visitors x 5 runs in {wall:.1f} s; queue positions seen: "
          f"max rank {max(s[1] or 0 for s in queued)}, max queue size {max(s[2] or 0 for s in queued)}; "
          f"RSS {rss_before:.0f} -> {rss_mb(server):.0f} MB")
    assert server.alive()


def mixed_run(n: int) -> dict:
    return dict(prompt=f"run {n}: " + "abc " * (n % 4), gamma=1 + n % 8, max_new_tokens=8 + (n * 7) % 17,
                temperature=(0.0, 0.7, 1.3)[n % 3], top_p=(1.0, 0.9)[n % 2], top_k=(0, 20)[n % 2 == 0],
                seed=n, method=("draft", "lookup", "adaptive")[n % 3], mode=("fair", "parallel")[n % 4 == 3])


def test_fifty_runs_keep_memory_flat_and_caches_correct(server, client):
    greedy = args(prompt="def quicksort(arr):", max_new_tokens=32, gamma=4)
    first = client.predict(*greedy, api_name="/run")
    assert "identical outputs" in first[INFO]
    for n in range(5):  # warm-up: every method and mode once more
        client.predict(*args(**mixed_run(n)), api_name="/run")
    rss0 = rss_mb(server)
    peak = rss0
    t0 = time.monotonic()
    for n in range(50):
        if n % 5 == 4:  # stopped midway: alternately cancelled and Stopped
            job = client.submit(*args(**{**mixed_run(n), "max_new_tokens": MAX_NEW}), api_name="/run")
            wait_started(job)
            if n % 10 == 4:
                job.cancel()
            else:
                client.predict(api_name="/stop")
                assert "stopped by you" in job.result(timeout=30)[INFO]
        else:
            out = client.predict(*args(**mixed_run(n)), api_name="/run")
            assert "sv-round" in out[SPEC] and "sv-target" in out[BASE]
        peak = max(peak, rss_mb(server))
    wall = time.monotonic() - t0
    last = client.predict(*greedy, api_name="/run")
    rss1 = rss_mb(server)
    print(f"\n50 runs in {wall:.1f} s; server RSS after warm-up {rss0:.0f} MB, after 50 runs {rss1:.0f} MB "
          f"(growth {rss1 - rss0:+.1f} MB, peak {peak:.0f} MB, bound {RSS_BOUND_MB} MB)")
    assert rss1 - rss0 < RSS_BOUND_MB
    # the KV caches and models are not left changed by any run (stopped ones included)
    assert "identical outputs" in last[INFO]
    assert result(last) == result(first)
    assert server.alive()


# ---------------------------------------------------------------- in process


@pytest.fixture()
def slow_engine(monkeypatch):
    """Every target step of the engines takes >= 20 ms: a 400-token run lasts
    well over 10 s. Yields a counter of steps taken."""
    import specviz.engine.decoding as decoding
    real = decoding.forward_logits

    class Steps(list):
        real = None

    steps = Steps([0])

    def slow(*a, **kw):
        steps[0] += 1
        time.sleep(0.02)
        return real(*a, **kw)

    monkeypatch.setattr(decoding, "forward_logits", slow)
    steps.real = real
    return steps


def test_operator_limits_from_flags_end_the_run(tmp_path, slow_engine, monkeypatch):
    """app.py's --max-new-tokens / --max-seconds / --fixed-pair reach the page, and the time
    limit really ends a run (race's timer sets its halt Event; the engines stop
    at their next step)."""
    import app as app_module
    import specviz.engine.decoding as decoding
    from specviz.models.tiny import save_tiny_pair

    # monkeypatch restores all three after the test (create_app exports the flags to the environment)
    monkeypatch.setenv("SPECVIZ_MAX_NEW_TOKENS", "100")  # the flag wins
    monkeypatch.setenv("SPECVIZ_MAX_SECONDS", "300")  # the flag wins
    monkeypatch.setenv("SPECVIZ_MAX_PROMPT_TOKENS", "50")  # no flag: the environment counts
    target, draft = save_tiny_pair(tmp_path)
    ns = app_module.build_parser().parse_args(["--target", target, "--draft", draft, "--max-new-tokens", "600",
                                               "--max-seconds", "3", "--fixed-pair"])
    demo, manager = app_module.create_app(ns)
    assert manager.wait(60)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        from gradio_client import Client
        c = Client(f"http://127.0.0.1:{port}/", verbose=False)
        # --fixed-pair: no visitor can swap the shared pair
        status = c.predict("custom", "org/big", "org/small", api_name="/load_pair")[0]
        assert "The model pair is fixed on this server" in status and "sv-status-ready" in status
        with pytest.raises(Exception, match=r"Max new tokens must be between 1 and 600, got 601\."):
            c.predict(*args(max_new_tokens=601), api_name="/run")
        with pytest.raises(Exception, match=r"The prompt is too long: 60 tokens, the limit here is 50\."):
            c.predict(*args(prompt="x" * 60), api_name="/run")
        t0 = time.monotonic()
        out = c.predict(*args(max_new_tokens=600), api_name="/run")
        took = time.monotonic() - t0
        assert "stopped at the server's time limit of 3 s" in re.sub(r"<[^>]+>", "", out[INFO]).replace(
            "&#x27;", "'")
        assert "stopped" in out[STATS]
        print(f"\ntime limit 3 s: the run took {took:.2f} s ({slow_engine[0]} engine steps)")
        assert took < 8, took  # 3 s + one step + rendering, not the 24+ s the run would take
        # the next run (at full speed) starts clean
        monkeypatch.setattr(decoding, "forward_logits", slow_engine.real)
        nxt = c.predict(*args(max_new_tokens=8), api_name="/run")
        assert nxt[STATS].count("done (") == 2, re.sub(r"<[^>]+>", " ", nxt[STATS] + nxt[INFO])
    finally:
        demo.close()


def test_closed_tab_ends_the_run(inproc_app, slow_engine, monkeypatch):
    """A browser tab that closes mid-run drops its /queue/data stream; gradio then
    closes the run's generator (GeneratorExit), whose finally sets the stop Event:
    the engines stop stepping and the worker is free."""
    import specviz.ui.handlers as blocks  # the page's handlers look these names up

    real_race = blocks.race
    races = []

    def watched_race(*a, **kw):
        rec = {"stop": kw["stop"], "closed": None}
        races.append(rec)

        def events():
            try:
                yield from real_race(*a, **kw)
            finally:
                rec["closed"] = time.monotonic()
        return events()

    monkeypatch.setattr(blocks, "race", watched_race)  # looked up at each run: the shared page sees it
    app = inproc_app
    config = json.load(__import__("urllib.request").request.urlopen(app.url + "config"))
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "run")
    session = uuid.uuid4().hex[:10]
    conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
    body = json.dumps({"data": list(args(max_new_tokens=400)), "fn_index": fn_index, "session_hash": session,
                       "event_data": None, "trigger_id": None})
    conn.request("POST", "/gradio_api/queue/join", body, {"Content-Type": "application/json"})
    assert conn.getresponse().read()
    conn.request("GET", f"/gradio_api/queue/data?session_hash={session}")
    stream = conn.getresponse()
    while True:  # until the page is streaming and the engines are stepping
        line = stream.readline()
        assert line, "the stream ended before the run was streaming"
        if b"process_generating" in line and slow_engine[0] >= 3:
            break
    gone = time.monotonic()
    conn.sock.close()  # the tab closes
    conn.close()
    end = time.monotonic() + 15
    while races[0]["closed"] is None and time.monotonic() < end:
        time.sleep(0.05)
    assert races[0]["closed"] is not None, "the run went on after its client left"
    assert races[0]["stop"].is_set()
    assert races[0]["closed"] - gone < 5
    steps = slow_engine[0]
    time.sleep(0.5)
    assert slow_engine[0] == steps, "the engines kept stepping"
    # the worker is free: a new visitor's run starts and finishes at once
    monkeypatch.undo()
    out = app.client().predict(*args(max_new_tokens=8), api_name="/run")
    assert "identical outputs" in out[INFO]
