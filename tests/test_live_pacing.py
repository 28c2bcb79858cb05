"""A live run on the page (ui/live.py): the engines never wait for the page, the page updates at
most once per interval whatever the number of tokens, and in fair mode the panes replay the timed
run at its measured pace, ending about when the engines do (issue 71). Fake clocks throughout: no
test compares wall-clock durations."""
import threading

import pytest

from specviz.engine.events import Outcome, RoundEvent, RunSummary, TokenEvent, event_time
from specviz.ui import live

# the default run of issue 71: plain 96 tokens in 5.21 s (prompt read 0.17 s), the draft model in 2.75 s
N, PLAIN, SPEC, PREFILL = 96, 5.21, 2.75, 0.17
PER_ROUND = 5  # tokens a speculative round adds


def _plain():
    step = (PLAIN - PREFILL) / (N - 1)
    return [TokenEvent(i, "x", Outcome.TARGET, PREFILL + i * step) for i in range(N)]


def _rounds():
    n_rounds = -(-N // PER_ROUND)
    out = []
    for i in range(n_rounds):
        t0, t1 = SPEC * i / n_rounds, SPEC * (i + 1) / n_rounds
        total = min(N, (i + 1) * PER_ROUND)
        toks = [TokenEvent(j, "x", Outcome.ACCEPTED, t1, round=i) for j in range(total - i * PER_ROUND)]
        out.append(RoundEvent(index=i, gamma=4, draft_ids=[], q=[], p=[], u=[], overlap=[], n_accepted=4,
                              appended_id=0, resampled=False, t_start=t0, t_draft=0.0, t_verify=0.0, t_end=t1,
                              draft_forwards=4, tokens=toks, total_tokens=total))
    return out


def _summary(side, elapsed):
    return RunSummary(side=side, method="plain", token_ids=[], text="", n_tokens=N, elapsed=elapsed,
                      prefill=PREFILL, target_forwards=N, stop_reason="max_new_tokens")


def fair_race(overhead=1.05):
    """(wall time it comes out, side, event) as the fair race emits a run: the two sides stepped in
    turn, so an event at time v on the shared clock comes out once both clocks passed v (or the other
    side ended): at wall min(v, plain) + min(v, spec), times `overhead` (the race's own work)."""
    events = [("baseline", ev) for ev in _plain()] + [("baseline", _summary("baseline", PLAIN))]
    events += [("speculative", ev) for ev in _rounds()] + [("speculative", _summary("speculative", SPEC))]
    events.sort(key=lambda se: (event_time(se[1]), isinstance(se[1], RunSummary)))
    return [((min(event_time(ev), PLAIN) + min(event_time(ev), SPEC)) * overhead, side, ev) for side, ev in events]


def play(pacer, schedule, tick=0.25):
    """Feed `pacer` as the page does, a tick at a time: -> {id(event): wall time it was shown}, the
    wall time the stream ended."""
    shown, i, wall, ended = {}, 0, 0.0, None
    while i < len(schedule) or not pacer.drained:
        wall += tick
        while i < len(schedule) and schedule[i][0] <= wall:
            pacer.feed(schedule[i][1], schedule[i][2])
            i += 1
        if i == len(schedule) and ended is None:
            ended = wall
            pacer.end(wall)
        for _, ev in pacer.due(wall):
            shown[id(ev)] = wall
        assert wall < 100, "the replay never ended"
    return shown, ended


def test_fair_panes_type_at_the_measured_pace_and_end_with_the_engines():
    schedule = fair_race()
    engines = schedule[-1][0]  # the engines' wall time: about plain + speculative
    pacer = live.Pacer("fair", N)
    shown, ended = play(pacer, schedule)
    done = max(shown.values())
    assert done <= 1.3 * (PLAIN + SPEC), (done, engines)  # issue 71: ≤ 1.3x the sum of the sides
    assert done <= ended * (1 + live.TAIL) + 0.25
    # every event shown at its own time on the shared clock plus one delay: the panes type at the pace
    # the table reports (a tick's rounding and the odd short wait for the engines aside)
    delays = [shown[id(ev)] - event_time(ev) for _, _, ev in schedule]
    assert max(delays) - min(delays) <= 0.6, (min(delays), max(delays))
    plain = [shown[id(ev)] for _, side, ev in schedule if side == "baseline" and isinstance(ev, TokenEvent)]
    pace = (N - 1) / (plain[-1] - plain[0])
    assert pace == pytest.approx(N / PLAIN, rel=0.12), pace
    assert pacer.skipped < 0.5
    for when, _, ev in schedule:  # never shown before the engines made it
        assert shown[id(ev)] >= when


def test_fair_shown_as_they_come_would_type_at_half_the_pace():
    """What the page did before (each event at once): the plain pane typed at about half its measured
    speed while both sides ran (issue 71: 6.5 tok/s against 20.8; the rest was the page's pauses)."""
    schedule = fair_race()
    first_half = [w for w, side, ev in schedule if side == "baseline" and isinstance(ev, TokenEvent)
                  and event_time(ev) <= SPEC]
    pace = (len(first_half) - 1) / (first_half[-1] - first_half[0])
    assert pace < 0.6 * N / PLAIN


def test_parallel_mode_shows_events_as_they_come():
    pacer = live.Pacer("parallel", N)
    evs = _plain()[:5]
    for ev in evs:
        pacer.feed("baseline", ev)
    assert [ev for _, ev in pacer.due(0.01)] == evs and not pacer.replaying
    assert live.banner(pacer) == ""


def test_a_stop_shows_everything_at_once():
    pacer = live.Pacer("fair", N)
    for ev in _plain()[:30]:
        pacer.feed("baseline", ev)
    assert pacer.due(0.5) == []  # nothing to pace yet: the speculative side has not written
    assert len(pacer.due(0.75, flush=True)) == 30 and pacer.drained


def test_a_run_that_ends_before_the_replay_starts_ends_within_the_tail():
    """A run far shorter than its token budget (an early end of text) gets a late start from its
    extrapolation: what would run past the tail is skipped, and the page says so."""
    pacer = live.Pacer("fair", 10 * N)
    schedule = fair_race()
    for _, side, ev in schedule:
        pacer.feed(side, ev)
    pacer.end(8.0)
    shown = []
    wall = 8.0
    while not pacer.drained:
        wall += 0.25
        shown += pacer.due(wall)
    assert wall <= 8.0 * (1 + live.TAIL) + 0.25
    assert len(shown) == len(schedule) and pacer.skipped > 0
    assert "skipped" in live.banner(pacer)


def test_banner_says_the_panes_replay_what_was_timed():
    pacer = live.Pacer("fair", N)
    assert "Timing both sides" in live.banner(pacer)
    assert live.banner(pacer, final=True) == ""  # never replayed (stopped before): nothing to say
    play(pacer, fair_race())
    assert "replay of the timed run" in live.banner(pacer)
    assert "replayed the timed run" in live.banner(pacer, final=True)


# ------------------------------------------------------------ follow(): the page's loop


class FakeWall:
    """The page's clock, moved only by the page's naps. The fake engine makes an event once the clock
    reaches its time; each nap returns once the engine has made everything due by then."""

    def __init__(self):
        self.t = 0.0
        self.cv = threading.Condition()
        self.engine_at: float | None = None  # the time the engine waits for
        self.engine_done = False

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        with self.cv:
            self.t += s
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: self.engine_done or (self.engine_at or 0) > self.t, 10)

    def until(self, w: float) -> None:
        with self.cv:
            self.engine_at = w
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: self.t >= w, 10)

    def engine(self, schedule):
        try:
            for when, side, ev in schedule:
                self.until(when)
                yield side, ev
        finally:
            with self.cv:
                self.engine_done = True
                self.cv.notify_all()


class Panes:
    """PaneStream's part that follow() uses; records what the page was sent and under which guard."""

    def __init__(self, guarded):
        self.added, self.outs, self.banner, self.guarded = [], [], "", guarded

    def add(self, side, ev):
        assert self.guarded(), "rendered outside the guard"
        self.added.append((side, ev))

    def outputs(self, charts=True):
        assert not charts, "a live run's updates carry no charts"
        assert self.guarded()
        self.outs.append(len(self.added))
        return ["out", len(self.added)]

    def unchanged(self):
        return ["same"]


def _guard():
    state = {"on": False}

    class Guard:
        def __enter__(self):
            state["on"] = True

        def __exit__(self, *exc):
            state["on"] = False

    return Guard, lambda: state["on"]


def test_follow_updates_per_interval_not_per_token():
    wall = FakeWall()
    schedule = fair_race()
    guard, guarded = _guard()
    panes = Panes(guarded)
    pacer = live.Pacer("fair", N)
    stop = threading.Event()
    outs = list(live.follow(panes, wall.engine(schedule), pacer, stop, interval=0.25, clock=wall.clock,
                            sleep=wall.sleep, guard=guard))
    assert [ev for _, ev in panes.added] == [ev for _, _, ev in schedule]  # all of it, in order
    assert len(outs) <= wall.t / 0.25 + 1 < len(schedule) / 2  # bounded by the duration, not the tokens
    assert wall.t <= 1.3 * (PLAIN + SPEC)
    assert not stop.is_set()  # a run that ended by itself is not "stopped by you"


def test_follow_yields_while_nothing_is_due_so_a_cancel_can_close_it():
    """gradio closes a cancelled run's generator on its event loop and retries while it runs: while the
    replay waits for its start, follow yields a no-change update at least every KEEPALIVE."""
    wall = FakeWall()
    guard, guarded = _guard()
    panes = Panes(guarded)
    stamps = []
    for out in live.follow(panes, wall.engine(fair_race()), live.Pacer("fair", N), threading.Event(),
                           interval=0.25, clock=wall.clock, sleep=wall.sleep, guard=guard):
        stamps.append((wall.t, out == ["same"]))
    assert any(same for _, same in stamps)  # the replay started late: it waited, yielding
    times = [0.0] + [t for t, _ in stamps]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= live.KEEPALIVE + 0.25 + 1e-9


def test_a_hold_waits_under_the_guard_after_each_update_while_the_engines_run():
    """SPECVIZ_UI_HOLD: the engines may wait (between two timed steps: the guard) while a browser on
    the same cores draws an update; never once they have ended."""
    wall = FakeWall()
    guard, guarded = _guard()
    held = []
    panes = Panes(guarded)
    outs = list(live.follow(panes, wall.engine(fair_race()), live.Pacer("fair", N), threading.Event(),
                            clock=wall.clock, sleep=wall.sleep, guard=guard, hold=0.1,
                            pause=lambda s: held.append((s, guarded(), wall.engine_done))))
    assert held and len(held) <= len(outs)
    assert all(s == 0.1 and inside for s, inside, _ in held)


def test_the_engines_never_wait_for_the_page():
    """However slow the page (here it never asks for a second update), the engines run to their end."""
    ran = []

    def engine():
        for i, ev in enumerate(_plain()):
            ran.append(i)
            yield "baseline", ev

    pump = live.Pump(engine()).start()
    assert pump.join(30)  # a guard against a hang, not a timing: nobody took anything meanwhile
    assert len(ran) == N
    items, ended = pump.take()
    assert ended and len(items) == N


def test_an_error_is_raised_after_what_came_before_it_was_shown():
    wall = FakeWall()

    def failing():
        for when, side, ev in fair_race()[:40]:
            wall.until(when)
            yield side, ev
        with wall.cv:
            wall.engine_done = True
        raise MemoryError("out of memory")

    guard, guarded = _guard()
    panes = Panes(guarded)
    with pytest.raises(MemoryError):
        list(live.follow(panes, failing(), live.Pacer("fair", N), threading.Event(), clock=wall.clock,
                         sleep=wall.sleep, guard=guard))
    assert len(panes.added) == 40  # flushed: the failed run's events all on the page


def test_closing_the_page_stops_the_engines():
    """A cancel (gradio closes the generator at a yield): the engines are told to stop, and end."""
    stop = threading.Event()
    gate = threading.Event()

    def engine():
        i = 0
        while not stop.is_set():
            yield "baseline", TokenEvent(i, "x", Outcome.TARGET, i * 0.01)
            i += 1
            gate.wait(0.001)
        yield "baseline", RunSummary(side="baseline", method="plain", token_ids=[], text="", n_tokens=i,
                                     elapsed=i * 0.01, prefill=0.0, target_forwards=i, stop_reason="stopped")

    guard, guarded = _guard()
    gen = live.follow(Panes(guarded), engine(), live.Pacer("parallel", N), stop, interval=0.001, guard=guard)
    next(gen)
    gen.close()
    assert stop.is_set()


def test_a_live_run_of_the_tiny_pair_shows_all_of_it(tiny_pair):
    """The real race on the tiny pair through the page's path (a real PaneStream): the final panes hold
    every token; the numbers are the engines' own."""
    from specviz.run.race import race
    from specviz.run.request import encode_prompt, make_request
    from specviz.ui import render
    from specviz.ui.panes import PaneStream
    from specviz.ui.state import RunView

    req = make_request("def f(x):", gamma=3, max_new_tokens=24, temperature=0.0)
    ids = encode_prompt(tiny_pair.tokenizer, req)
    view = RunView(req.gamma, req.temperature, "fair", req.prompt)
    panes = PaneStream(view, render.prompt_span(req.prompt, False))
    stop = threading.Event()
    direct = PaneStream(RunView(req.gamma, req.temperature, "fair", req.prompt), panes.base_html)
    events = []

    def stream():
        for item in race(tiny_pair, req, ids, "fair", stop=stop):
            events.append(item)
            yield item

    list(live.follow(panes, stream(), live.Pacer("fair", req.max_new_tokens), stop, interval=0.02))
    for side, ev in events:
        direct.add(side, ev)
    assert view.finished and panes.base_html == direct.base_html and panes.spec_html == direct.spec_html
    ends = {side: ev for side, ev in events if isinstance(ev, RunSummary)}
    assert view.base.summary is ends["baseline"] and view.spec.summary is ends["speculative"]


@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_the_run_handler_charts_at_the_ends_and_says_what_the_panes_show(tiny_pair, mode):
    """The page's /run handler on the tiny pair, called in this process (no server): its updates in
    between carry no charts, the last one all of them, and in fair mode the run line says the panes
    replayed the timed run."""
    from specviz.run.request import Limits
    from specviz.ui.handlers import Handlers, PairChoices
    from specviz.ui.loader import ModelManager

    manager = ModelManager(loader=lambda spec, **_: tiny_pair)
    manager.start(tiny_pair.spec)
    assert manager.wait(60)
    page = Handlers(manager, Limits.from_env(), [], PairChoices())
    outs = list(page.run("def f(x):", 3, 24, 0.0, 1.0, 0, 0, False, mode))
    first, *between, last = outs
    assert all(o[4] is not None and not isinstance(o[4], dict) for o in (first, last))  # figures
    assert between and all(isinstance(o[4], dict) for o in between)  # gr.skip(): charts left as they were
    assert "identical outputs" in last[3]
    assert ("replayed the timed run" in last[3]) == (mode == "fair")


def test_every_pane_update_has_the_pages_run_outputs_length():
    """A keep-alive, a message and an update without charts are as long as a full one (panes.N_OUTPUTS:
    the page's run outputs, ui/layout.py)."""
    from specviz.ui import panes as panes_mod
    from specviz.ui.panes import PaneStream
    from specviz.ui.state import RunView

    p = PaneStream(RunView(3, 0.0, "fair", "x"), "")
    lengths = {len(p.outputs(charts=True)), len(p.outputs(charts=False)), len(p.unchanged()),
               len(panes_mod.message_outputs("m"))}
    assert lengths == {panes_mod.N_OUTPUTS}


# ------------------------------------------------------------ the page's race: pace "split" (run/race.py)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def split_race():
    """(wall, side, event) as the page's race (pace "split", run/race._Split) emits the default run,
    each step taking its own time on the wall; (the wall at the split, each side's clock then); and the
    sides stepped after the split, in order."""
    from specviz.run import race
    queues = {"baseline": [*_plain(), _summary("baseline", PLAIN)],
              "speculative": [*_rounds(), _summary("speculative", SPEC)]}
    clocks, out = {s: _Clock() for s in queues}, dict.fromkeys(queues, 0)
    info = race.RaceInfo("fair")
    split = race._Split(N, info)
    running, pending, wall, schedule, at, steps = set(queues), {s: [] for s in queues}, 0.0, [], None, []
    while running:
        side = race._next_side("split", split, running, clocks, out)
        if info.split_at is not None and at is None:
            at = (wall, {s: c.t for s, c in clocks.items()})
        if at is not None:
            steps.append(side)
        ev = queues[side].pop(0)
        wall += event_time(ev) - clocks[side].t
        clocks[side].t = event_time(ev)
        out[side] += race._out(ev)
        pending[side].append(ev)
        if isinstance(ev, RunSummary):
            running.discard(side)
        horizon = min((clocks[s].t for s in running), default=float("inf"))
        for s in queues:  # as race._fair: what no running side can still precede, in time order
            while pending[s] and event_time(pending[s][0]) <= horizon:
                schedule.append((wall, s, pending[s].pop(0)))
    schedule.sort(key=lambda x: x[0])
    return schedule, at, steps


def test_the_page_race_splits_so_both_sides_meet_the_replay_alike():
    """Both sides step by tokens, then the speculative side's last share alone, then plain's: at the
    split each side has the same share of its time left (a browser drawing the replay from there on
    slows both alike), and it comes when P/T - LEAD of each is left."""
    from specviz.run.race import _Split
    schedule, (split_wall, at), steps = split_race()
    left = {"baseline": 1 - at["baseline"] / PLAIN, "speculative": 1 - at["speculative"] / SPEC}
    assert left["baseline"] == pytest.approx(left["speculative"], abs=0.06), left
    assert left["baseline"] == pytest.approx(PLAIN / (PLAIN + SPEC) - _Split.LEAD, abs=0.06), left
    # after the split: every speculative step, then every plain one
    assert steps == sorted(steps, key=lambda side: side == "baseline") and len(set(steps)) == 2


def test_the_replay_starts_at_the_split_never_waits_and_ends_soon_after_the_engines():
    schedule, (split_wall, _), _ = split_race()
    engines_end = schedule[-1][0]
    state = {"wall": 0.0}
    pacer = live.Pacer("fair", N, split=lambda: state["wall"] >= split_wall)
    shown, i, wall, tick = {}, 0, 0.0, 0.05
    while i < len(schedule) or not pacer.drained:
        wall += tick
        state["wall"] = wall
        while i < len(schedule) and schedule[i][0] <= wall:
            pacer.feed(schedule[i][1], schedule[i][2])
            i += 1
        if i == len(schedule):
            pacer.end(wall)
        for _, ev in pacer.due(wall):
            shown[id(ev)] = wall
        assert wall < 100
    assert pacer.start == pytest.approx(split_wall, abs=tick + 1e-9)
    plain = [shown[id(ev)] for _, side, ev in schedule if side == "baseline" and isinstance(ev, TokenEvent)]
    # the panes type at the measured pace (never stalled waiting for the engines), and the replay
    # ends about LEAD of the engines' time after them, within the tail: nothing skipped
    assert (N - 1) / (plain[-1] - plain[0]) == pytest.approx(N / PLAIN, rel=0.06)
    assert max(shown.values()) <= engines_end + 0.2 * (PLAIN + SPEC) + tick
    assert pacer.skipped < 0.05


def test_without_a_split_the_replay_starts_as_planned():
    """A split that never comes (a side ended before it): the old plan, once a side has ended."""
    pacer = live.Pacer("fair", N, split=lambda: False)
    shown, ended = play(pacer, fair_race())
    assert len(shown) == len(fair_race()) and pacer.start is not None


def test_split_picks_by_tokens_then_speculative_alone_then_plain():
    from specviz.run.race import RaceInfo, _next_side, _Split
    info = RaceInfo("fair")
    split = _Split(100, info)
    clocks = {"baseline": _Clock(), "speculative": _Clock()}
    out = {"baseline": 10, "speculative": 20}
    clocks["baseline"].t, clocks["speculative"].t = 1.0, 1.0  # plain 0.1 s a token, speculative 0.05
    both = {"baseline", "speculative"}
    assert _next_side("split", split, both, clocks, out) == "baseline" and info.split_at is None
    # P/T = 2/3: the split once both have 1 - (2/3 - LEAD) of their tokens out
    need = round((1 - (2 / 3 - _Split.LEAD)) * 100 + 0.5)
    out = {"baseline": need, "speculative": need}
    clocks["baseline"].t, clocks["speculative"].t = need * 0.1, need * 0.05
    assert _next_side("split", split, both, clocks, out) == "speculative" and info.split_at is not None
    assert _next_side("split", split, both, clocks, out) == "speculative"
    assert _next_side("split", split, {"baseline"}, clocks, out) == "baseline"
