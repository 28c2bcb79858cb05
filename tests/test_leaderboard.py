"""Race all methods (specviz/run/leaderboard.py) on the tiny random pair: every number
of the table is the run's own, the greedy check, the sort, Stop, the CLI and the
race bundle's round trip."""
import json
import threading
from dataclasses import replace

import pytest

from specviz.cli.main import main
from specviz.engine import datastore as store
from specviz.engine.events import RoundEvent, RunSummary, TokenEvent
from specviz.engine.metrics import run_stats
from specviz.models import load_pair, resolve_pair
from specviz.run.leaderboard import END, PLAIN, START, new_board, parse_keys, race_methods
from specviz.run.race_bundle import bundle_dict, load_bundle, save_bundle
from specviz.run.request import encode_prompt, make_request
from specviz.run.trace import load_trace, trace_costs

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = "x = [1, 2, 3]\ny = [1, 2, 3]\nx = ["
KEYS = ["draft", "auto", "tree", "staged", "lookup", "lookahead", "rest"]


@pytest.fixture(scope="module")
def pair(pair_dirs):
    mp = pytest.MonkeyPatch()
    p = load_pair(resolve_pair(None, *pair_dirs), device="cpu")
    ds = store.from_tokens(p.tokenizer.encode("x = [1, 2, 3]\ny = [1, 2, 3]\n"))  # not the stdlib build
    mp.setattr(store, "for_tokenizer", lambda tokenizer, path=None: ds)
    yield p
    mp.undo()


def race(pair, keys=KEYS, temperature=0.0, max_new=16, stop=None, on_event=None):
    req = make_request(PROMPT, gamma=3, max_new_tokens=max_new, temperature=temperature, seed=3)
    ids = encode_prompt(pair.tokenizer, req)
    board = new_board(pair, req, keys)
    stream = []
    for item in race_methods(pair, req, ids, board, stop=stop, warmup=2):
        stream.append(item)
        if on_event is not None:
            on_event(*item)
    return board, stream


@pytest.fixture(scope="module")
def greedy(pair):
    return race(pair)


def test_every_number_is_the_runs_own(greedy):
    board, stream = greedy
    rows = board.rows()
    assert [r.key for r in rows if r.key != PLAIN] and rows[0].tokens_per_s is not None
    assert {r.key for r in rows} == {PLAIN, *KEYS}
    spd = [r.speedup if r.tau >= 1.005 or r.speedup <= 1 else 1.0 for r in rows]
    assert spd == sorted(spd, reverse=True)  # by × plain, a τ 1.00 run never above plain
    plain = next(r for r in rows if r.key == PLAIN)
    rates = sorted(board.runs[k].plain_summary.tokens_per_s for k in KEYS)
    # the plain row: the median of the plain runs raced beside the methods, all of them on hover
    assert plain.tokens_per_s == rates[(len(rates) - 1) // 2] and plain.speedup == 1.0
    assert plain.identical == "reference" and plain.plain_then == f"{rates[0]:.2f}-{rates[-1]:.2f}"
    assert board.baseline is board.runs[KEYS[0]].plain  # the reference: the first whole plain run
    for r in rows:
        if r.key == PLAIN:
            continue
        s, p = board.runs[r.key].summary, board.runs[r.key].plain_summary
        st = run_stats(s, p, trace_costs(board.trace(r.key)))  # against the plain run raced beside it
        assert (r.tokens_per_s, r.speedup, r.tau, r.alpha_hat, r.c, r.v) == \
            (s.tokens_per_s, st.speedup, st.tau, st.alpha_hat, st.c, st.verify_cost)
        assert r.speedup == pytest.approx(s.tokens_per_s / p.tokens_per_s)
        assert r.plain_tokens_per_s == p.tokens_per_s and r.plain_then == f"{p.tokens_per_s:.2f}"
        assert r.plain_how.startswith(f"÷ {p.tokens_per_s:.2f} tok/s: plain decoding raced beside it")
        # CPU time of each side's steps, beside the wall time (process time: never more than 1 s/s/core)
        assert 0 < s.extra["cpu_s"] and 0 < p.extra["cpu_s"] and r.cpu_speedup == pytest.approx(
            (s.n_tokens / s.extra["cpu_s"]) / (p.n_tokens / p.extra["cpu_s"]))
        assert r.n_tokens == s.n_tokens == p.n_tokens == 16 and not r.error and r.paired
        assert r.gamma == ("auto" if r.key == "auto" else "3")
        # greedy on fp32: every method reproduces plain decoding token for token
        assert r.identical == "identical", (r.key, r.detail)
        assert s.token_ids == p.token_ids == board.base_summary.token_ids
    assert board.runs["auto"].summary.gamma_policy and not board.runs["draft"].summary.gamma_policy
    assert board.runs["lookup"].summary.method == "lookup" and board.runs["tree"].summary.method == "tree"


def test_each_method_races_plain_step_by_step(greedy):
    board, stream = greedy
    marks = [(k, s) for k, s, _ in stream if s in (START, END)]
    assert marks == [m for k in KEYS for m in ((k, START), (k, END))]  # one race at a time
    current, sides = None, []
    for k, side, ev in stream:  # every event lies between its own race's START and END
        if side == START:
            current, sides = k, []
        elif side == END:
            current = None
            # both sides in one race, interleaved: plain's last event comes after the method's first
            assert "speculative" in sides and "baseline" in sides[sides.index("speculative"):], (k, sides)
        else:
            assert k == current and side in ("baseline", "speculative")
            sides.append(side)
            assert ev in (board.runs[k].plain if side == "baseline" else board.runs[k].events)
    assert all(isinstance(e, (TokenEvent, RunSummary)) for r in board.runs.values() for e in r.plain)
    assert all(isinstance(e, (RoundEvent, RunSummary)) for r in board.runs.values() for e in r.events)


def test_the_picked_runs_box_shows_the_rows_ratio(greedy):
    """Issue 59: picked under the race table, the hybrid's speedup box said 1.76× while its row said
    1.98× (the box divided by the first plain run, the row by a same-minute mean). Now both divide by
    the plain run raced beside it: one ratio per run."""
    from specviz.ui.leaderboard import pane_stream
    from specviz.ui.speedup_box import stats_html
    board, _ = greedy
    for k in KEYS:
        row = board.row(k)
        view = pane_stream(board, k).view
        snap = view.snapshot()
        assert snap["stats"]["speedup"] == pytest.approx(row.speedup, rel=1e-12)
        assert f"{row.speedup:.2f}×" in stats_html(snap)
        assert "first plain" not in board.trace(k).meta["label"]


def test_a_different_output_is_called_a_mismatch(greedy):
    board, _ = greedy
    bad = load_bundle(json.dumps(bundle_dict(board)))
    rounds = [e for e in bad.runs["lookup"].events if isinstance(e, RoundEvent)]
    tok = next(t for t in rounds[0].tokens if t.in_output)
    tok.token_id, tok.gap = tok.token_id + 1, None
    assert bad.row("lookup").identical == "mismatch"
    assert "bug" in bad.row("lookup").detail
    assert bad.row("draft").identical == "identical"


def test_sampled_race_and_greedy_only_methods(pair):
    board, _ = race(pair, ["draft", "lookahead"], temperature=0.8, max_new=8)
    draft = board.row("draft")
    assert draft.identical == "n/a (sampled)" and draft.tokens_per_s > 0
    look = board.row("lookahead")
    assert look.tokens_per_s is None and "greedy only" in look.error
    assert [r.key for r in board.rows()][-1] == "lookahead"  # no result: last


def test_stop_leaves_the_rest_unrun(pair):
    stop = threading.Event()

    def stop_after_the_first(key, side, ev):
        if key == "tree" and side == END:
            stop.set()
    board, stream = race(pair, ["tree", "draft", "lookup"], stop=stop, on_event=stop_after_the_first)
    assert board.base_summary is not None and board.row("tree").ranked
    assert [board.runs[k].error for k in ("draft", "lookup")] == ["stopped before it ran"] * 2
    assert [r.key for r in board.rows() if r.tokens_per_s is not None] in ([PLAIN, "tree"], ["tree", PLAIN])


def test_a_run_cut_by_stop_is_shown_not_ranked(pair):
    """Stop during a contender's run: its numbers stay (measured up to the stop), but it is not
    ranked, drawn or counted as done, and the progress line counts only the runs that ended."""
    from specviz.cli.leaderboard import table
    from specviz.ui.leaderboard_render import bar_chart, progress_html, table_html
    stop = threading.Event()

    def stop_in_draft(key, side, ev):
        if key == "draft" and isinstance(ev, RoundEvent):
            stop.set()
    board, _ = race(pair, ["lookup", "draft", "tree"], stop=stop, on_event=stop_in_draft, max_new=64)
    cut = board.row("draft")
    assert cut.stop_reason == "stopped" and cut.tokens_per_s is not None and not cut.ranked
    assert board.row("lookup").ranked and board.runs["tree"].error == "stopped before it ran"
    assert board.done() == 1  # lookup's race: not the cut run, not the unrun one
    assert [r.key for r in board.rows()][:2] == [r.key for r in board.rows() if r.ranked]
    assert board.runs["draft"].plain_summary.stop_reason == "stopped"  # plain beside it stopped too
    html = table_html(board)
    assert "stopped after" in html and "not ranked" in html
    assert "1 of 3 runs done: stopped by you" in progress_html(board, "stopped by you")
    assert "draft" not in " ".join(bar_chart(board).data[0].y).lower().replace("plain", "")
    assert "not ranked" in table(board)


def test_bad_method_names():
    from specviz.errors import RequestError
    assert parse_keys("draft, lookup,draft") == ["draft", "lookup"]
    with pytest.raises(RequestError, match="Unknown method 'nope'"):
        parse_keys("draft,nope")
    with pytest.raises(RequestError, match="at least one"):
        parse_keys([])


def test_bundle_round_trip(greedy, tmp_path):
    from specviz.ui import replay as replay_ui
    board, _ = greedy
    path = save_bundle(board, tmp_path / "race.json")
    back = load_bundle(path)
    assert [r.to_dict() for r in back.rows()] == [r.to_dict() for r in board.rows()]
    assert back.meta["kind"] == "race-methods" and back.keys == board.keys
    for k in KEYS:  # each method unpacks to an ordinary trace that the replay path renders
        tr = back.trace(k)
        assert tr.summaries()["speculative"].to_dict() == board.runs[k].summary.to_dict()
        assert tr.summaries()["baseline"].to_dict() == board.runs[k].plain_summary.to_dict()
        view = replay_ui.final_view(tr)
        # the panes' speedup is against the plain run they show, raced beside it: the row's
        assert view.finished and view.stats()["speedup"] == pytest.approx(back.row(k).speedup)
        assert view.identical()["identical"]
    with pytest.raises(ValueError, match="race bundle"):
        load_trace(path)  # a bundle is not a single run's trace, and says so
    with pytest.raises(ValueError, match="not a SpecViz race bundle"):
        load_bundle(json.dumps({"version": 1, "kind": "race-methods", "meta": {}, "keys": ["x"]}))


def cli(capsys, *args):
    code = main(["race-methods", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table_bundle_and_errors(capsys, pair_dirs, tmp_path):
    t, d = pair_dirs
    out_file = tmp_path / "race.json"
    code, out, err = cli(capsys, "--target", t, "--draft", d, "--prompt", PROMPT, "--methods", "draft,lookup",
                         "--max-new-tokens", "10", "--warmup", "1", "--out", str(out_file))
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("#"))
    assert lines[head].split()[:4] == ["#", "method", "γ", "tok/s"]
    body = lines[head + 1: head + 4]
    assert len(body) == 3 and all("identical" in b or "reference" in b for b in body)
    assert any("plain decoding (baseline)" in b for b in body)
    assert "[1/2] draft model beside plain decoding" in err and "saved the race" in err
    board = load_bundle(out_file)
    assert set(board.runs) == {"draft", "lookup"}
    code, out, _ = cli(capsys, "--from", str(out_file), "--json")
    rows = json.loads(out)
    assert code == 0 and [r["key"] for r in rows] == [r.key for r in board.rows()]
    code, _, err = cli(capsys, "--target", t, "--draft", d, "--prompt", "x", "--methods", "draft,nope")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: Unknown method 'nope'")
    code, _, err = cli(capsys, "--from", str(tmp_path / "missing.json"))
    assert code == 2 and err.startswith("error:")
    code, _, err = cli(capsys, "--target", t, "--draft", d, "--prompt", "x", "--max-new-tokens", "0")
    assert code == 2 and "Max new tokens" in err


def test_table_and_chart_render(greedy):
    from specviz.ui.leaderboard_render import bar_chart, pick_choices, table_html
    board, _ = greedy
    html = table_html(board)
    assert html.count("<tr data-key=") == 1 + len(KEYS) and "✓ identical" in html
    fig = bar_chart(board)
    # the ranked quantity, in the table's order (issue 71: the bars were tokens/s)
    assert list(fig.data[0].x) == [r.speedup for r in board.rows()][::-1]
    # the race reads no earlier runs: a suffix-style row would say it copied from its own text only
    assert all(r.key not in ("suffix", "hybrid") for r in board.rows())
    assert [k for _, k in pick_choices(board)] == [r.key for r in board.rows() if r.key != PLAIN]
    half = replace(board, runs=dict(board.runs), keys=list(board.keys))
    half.runs["rest"] = replace(board.runs["rest"], events=[], error="")
    assert "waiting" in table_html(half)


def test_the_method_selector_follows_the_race(greedy):
    """While a race streams, a starting run clears the selector (it had named the last run while
    the panes showed the next), a finished one names itself, a round leaves it."""
    from specviz.ui.leaderboard import _picked
    board, _ = greedy
    assert _picked(board, "tree", START) == ""
    assert _picked(board, "tree", END) == "tree"
    assert _picked(board, "tree", "speculative") is None and _picked(board, PLAIN, END) is None


# ------------------------------------------------------------ × plain of the same moments (issues 51, 59)

def _plain(tps: float, n: int = 32, cpu: float | None = None) -> RunSummary:
    s = RunSummary("baseline", "plain", list(range(n)), "", n, n / tps, 0.1, n, "max_new_tokens")
    if cpu is not None:
        s.extra["cpu_s"] = cpu
    return s


def _lookup(tps: float = 5.9, cpu: float | None = None, n: int = 32, forwards: int = 32) -> RunSummary:
    s = RunSummary("speculative", "lookup", list(range(n)), "", n, n / tps, 0.1, forwards,
                   "max_new_tokens", rounds=forwards, drafted=0)
    if cpu is not None:
        s.extra["cpu_s"] = cpu
    return s


def _board(plain: RunSummary | None, spec: RunSummary, old: RunSummary | None = None):
    """A race of lookup alone: raced beside `plain`; or (`old`) a bundle recorded before
    2026-11-28, its one plain run timed before every method."""
    from specviz.run.leaderboard import Board, Entry, MethodRun
    board = Board({"settings": {"temperature": 0.0, "max_new_tokens": 32, "gamma": 3}}, ["lookup"])
    board.runs["lookup"] = MethodRun(Entry("lookup", "lookup"), {"gamma": 3}, [spec],
                                     plain=[plain] if plain is not None else [])
    board.baseline = [old] if old is not None else [plain]
    return board


def test_a_tau_one_method_above_plain_is_flagged_and_ranked_below_it():
    from specviz.cli.leaderboard import table
    from specviz.ui.leaderboard_render import table_html
    board = _board(_plain(4.27, cpu=14.0), _lookup(5.9, cpu=10.1))  # lookup's 1.38× is noise
    row = board.row("lookup")
    assert row.tau == 1.0 and row.speedup == pytest.approx(5.9 / 4.27) and row.speedup > 1
    assert row.flag.startswith("τ 1.00: no more tokens per target forward than plain decoding")
    assert "disturbed machine" not in row.flag  # by CPU time too: 1.39×
    assert [r.key for r in board.rows()] == [PLAIN, "lookup"] and row.ranked
    html = table_html(board)
    assert "⚠ τ 1.00" in html and "1.38× ⚠" in html and "raced beside it" in html
    assert "same moments" in html and "by CPU time 1.39×" in html
    assert "⚠ τ 1.00" in table(board)
    assert "plain then" in table(board) and row.plain_then == "4.27"


def test_the_chart_draws_the_ranked_quantity_and_flagged_rows_as_flagged():
    """Issue 71: REST's row was flagged ("0.89× by CPU time") but its bar was drawn green, longer than
    plain's, with no flag; and the bars were tokens/s while the rows are ranked by × plain."""
    from specviz.ui.leaderboard_render import HATCHED, bar_chart
    board = _board(_plain(4.4, cpu=10.0), _lookup(5.9, cpu=10.0))  # flagged: τ 1.00, a disturbed machine
    rows = board.rows()
    flagged = board.row("lookup")
    assert flagged.flag and flagged.speedup > 1
    bar = bar_chart(board).data[0]
    assert list(bar.x) == [r.speedup for r in rows][::-1]  # plain at 1.00, the flagged row's ratio
    i = next(k for k, y in enumerate(bar.y) if flagged.label in y)
    assert bar.y[i].startswith("⚠ ") and bar.marker.color[i] == HATCHED and bar.marker.pattern.shape[i] == "/"
    assert "⚠" in bar.text[i] and "disturbed machine" in bar.customdata[i] and "τ 1.00" in bar.customdata[i]
    p = 1 - i  # plain's bar: grey, no hatching, no flag
    assert bar.x[p] == 1.0 and not bar.y[p].startswith("⚠") and bar.marker.pattern.shape[p] == ""
    clean = _board(_plain(5.2, n=32, cpu=10.0), _lookup(5.9, n=32, forwards=16, cpu=9.0))  # τ 2: no flag
    row = clean.row("lookup")
    assert not row.flag
    bar = bar_chart(clean).data[0]
    assert HATCHED not in list(bar.marker.color) and set(bar.marker.pattern.shape) == {""}
    assert not any("⚠" in y for y in bar.y)


def test_a_race_row_says_what_it_copied_from_earlier_runs():
    """Issue 71: the race showed the hybrid at 1.83× with no word about the memory. Its row says how
    much it copied from earlier runs (a flag, drawn flagged), or that it copied from its own text only."""
    from specviz.engine.events import Outcome
    from specviz.run.leaderboard import Board, Entry, MethodRun
    from specviz.ui.leaderboard_render import HATCHED, bar_chart, memory_note, table_html

    def board_of(where):
        toks = [TokenEvent(7, "a", Outcome.ACCEPTED, 0.1, 0, k + 1) for k in range(3)]
        r = RoundEvent(index=0, gamma=3, draft_ids=[7] * 3, q=[1.0] * 3, p=[0.9] * 3, u=[0.1] * 3,
                       overlap=[0.9] * 3, n_accepted=3, appended_id=9, resampled=False, t_start=0.0, t_draft=0.0,
                       t_verify=0.02, t_end=0.1, draft_forwards=0, tokens=toks,
                       info={"drafter": "suffix", "source": {"where": where, "label": "x", "start": 0, "end": 3}})
        spec = RunSummary("speculative", "suffix", list(range(16)), "", 16, 16 / 8.0, 0.1, 8, "max_new_tokens",
                          rounds=8, drafted=12)
        b = Board({"settings": {"temperature": 0.5, "max_new_tokens": 16, "gamma": 3}}, ["suffix"])  # no check
        b.runs["suffix"] = MethodRun(Entry("suffix", "suffix"), {"gamma": 3}, [r, spec], plain=[_plain(4.0, n=16)])
        b.baseline = b.runs["suffix"].plain
        return b
    own = board_of("prompt")
    row = own.row("suffix")
    assert memory_note(own, row) == ("copied from this run's prompt and output only: the race reads no earlier "
                                     "runs", 0)
    assert "❝ copied from this run&#x27;s prompt and output only" in table_html(own)
    bar = bar_chart(own).data[0]
    assert not any("⚠" in y for y in bar.y) and HATCHED not in list(bar.marker.color)
    mem = board_of("memory")
    row = mem.row("suffix")
    assert memory_note(mem, row) == ("3 of 16 tokens copied from earlier runs", 3)
    html = table_html(mem)
    assert "❝ 3 of 16 tokens copied from earlier runs" in html and f"{row.speedup:.2f}× ⚠" in html
    bar = bar_chart(mem).data[0]
    i = [k for k, y in enumerate(bar.y) if "⚠" in y]
    assert len(i) == 1 and bar.marker.color[i[0]] == HATCHED and bar.marker.pattern.shape[i[0]] == "/"
    assert "3 of 16 tokens copied" in bar.customdata[i[0]]


def test_cpu_and_wall_ratios_apart_say_the_machine_was_disturbed():
    # wall: 1.34× plain; CPU time: 1.00× (a hog took the cores during plain's steps more than lookup's)
    board = _board(_plain(4.4, cpu=10.0), _lookup(5.9, cpu=10.0))
    row = board.row("lookup")
    assert row.cpu_speedup == pytest.approx(1.0) and row.speedup == pytest.approx(5.9 / 4.4)
    assert "disturbed machine: 1.34× by wall time but 1.00× by CPU time, more than 15% apart" in row.flag
    near = _board(_plain(5.2, cpu=10.0), _lookup(5.9, cpu=10.0)).row("lookup")  # 1.13×: within 15 %
    assert "disturbed machine" not in near.flag
    unmeasured = _board(_plain(4.4), _lookup(5.9)).row("lookup")  # no CPU time recorded: no claim
    assert unmeasured.cpu_speedup is None and "disturbed machine" not in unmeasured.flag


def test_an_old_bundle_never_ranks_a_method_above_plain():
    """Issue 59: the race shipped before 2026-11-28 timed plain once, before every method, and ranked
    prompt lookup (τ 1.21, 1.17×) above plain; its rows now say so, and rank below plain."""
    from specviz.ui.leaderboard_render import table_html
    board = _board(None, _lookup(11.7, n=64, forwards=53), old=_plain(10.0, n=64))
    assert not board.paired
    row = board.row("lookup")
    assert row.speedup == pytest.approx(1.17) and row.tau > 1.2 and not row.paired
    assert "recorded before 2026-11-28" in row.flag and "τ 1.21: not ranked above plain" in row.flag
    assert [r.key for r in board.rows()] == [PLAIN, "lookup"]
    assert "timed before every method" in row.plain_how
    assert "not ratios of the same moments" in table_html(board)


def test_the_race_table_says_when_the_machine_is_busy():
    from specviz.ui.leaderboard_render import table_html
    board = _board(_plain(4.27), _lookup(5.9))
    assert "This machine is busy" not in table_html(board)
    html = table_html(board, "other programs use 1.9 of this machine's 2 cores")
    assert "This machine is busy</b> (other programs use 1.9 of this machine&#x27;s 2 cores)" in html
    board.note_busy("lookup", "other programs use 1.9 of this machine's 2 cores")
    assert "busy machine (other programs use 1.9" in board.row("lookup").flag


# ------------------------------------------------------------ a drifting load (issue 59)

def _simulated(monkeypatch, cost):
    """The race's clocks read a simulated machine: each engine step of `side` adds
    cost(side, wall) = (wall seconds, CPU seconds). Deterministic: the real machine's load does not
    enter. Returns the machine (its .wall may be set)."""
    from types import SimpleNamespace

    from specviz.engine import rounds
    from specviz.run import race as race_mod
    sim = SimpleNamespace(wall=0.0, cpu=0.0)
    monkeypatch.setattr(rounds, "time", SimpleNamespace(perf_counter=lambda: sim.wall,
                                                        process_time=lambda: sim.cpu))
    real = race_mod.run_events

    def slowed(pair, req, side, ids, **kw):
        for ev in real(pair, req, side, ids, **kw):
            wall, cpu = cost(side, sim.wall)
            sim.wall += wall
            sim.cpu += cpu
            yield ev
    monkeypatch.setattr(race_mod, "run_events", slowed)
    return sim


def _drifting(monkeypatch, period: float, only: str | None = None):
    """Every engine step costs 20 ms of CPU, and while a load that switches every `period` s of the
    simulated machine's time is on, it takes 40 ms more of wall time (another program holding the
    core). `only`: the load meets that side alone (what timing plain apart from a method meets)."""
    def cost(side, wall):
        on = int(wall / period) % 2 == 0 and only in (None, side)
        return 0.02 + (0.04 if on else 0.0), 0.02
    return _simulated(monkeypatch, cost)


def test_a_drifting_load_leaves_a_tau_one_method_near_plain(pair, monkeypatch):
    """Issue 59: a CPU loop 3 s on, 3 s off beside the race printed a method that accepted nothing at
    1.34× and 0.46× plain. Raced step by step beside plain, both sides meet the load alike."""
    _drifting(monkeypatch, 1.2)  # a phase of ~40 steps, as 3 s of a CPU loop is for ~0.1 s steps
    board, _ = race(pair, ["lookup"], max_new=16)
    assert board.runs["lookup"].summary.elapsed > 16 * 0.02  # the simulated clock timed it
    row = board.row("lookup")
    assert row.tau < 1.2, row  # the tiny pair's prompt lookup finds (almost) nothing
    assert 0.85 <= row.speedup <= 1.15, row
    assert "disturbed machine" not in row.flag


def test_a_load_that_meets_one_side_only_is_flagged(pair, monkeypatch):
    _drifting(monkeypatch, 1e9, only="baseline")  # always on, for plain's steps only
    board, _ = race(pair, ["lookup"], max_new=16)
    row = board.row("lookup")
    assert row.speedup > 1.5 and row.cpu_speedup < 1.3, row
    assert "disturbed machine" in row.flag


def test_the_shipped_race_ranks_no_tau_one_method_above_plain():
    """The race shipped in assets/races was recorded again on 2026-11-28 under the new rule (each
    method raced beside plain, step by step): every row is paired, and no row without more tokens per
    forward than plain (τ 1.00) ranks above it. A bundle of the old rule: test_an_old_bundle_*."""
    from specviz.ui.leaderboard import shipped
    for name, board in shipped().items():
        rows = board.rows()
        above = rows[:[r.key for r in rows].index(PLAIN)]
        assert all(r.tau > 1.0 for r in above), (name, [(r.key, r.tau) for r in above])
        assert board.paired and all(r.paired for r in rows if r.key != PLAIN and not r.error), name


def _load_from(monkeypatch, start: float, step: dict[str, float]):
    """Each side's step has its own cost (`step`, seconds); from `start` s of the simulated
    machine's wall time on, a load makes every step 3 times as long."""
    return _simulated(monkeypatch, lambda side, wall: (step[side] * (3 if wall >= start else 1), step[side]))


def test_both_sides_end_together_so_a_late_load_meets_both(pair, monkeypatch):
    """Stepped by its clock, the faster side ended first and plain ran its last part alone: a load
    that came then slowed plain only (the draft's ratio read 2.58x beside a loop, 2.04x quiet).
    Paced by tokens out, both sides meet the load alike and the ratio holds."""
    step = {"baseline": 0.02, "speculative": 0.01}  # the method: twice plain's speed, quiet
    _load_from(monkeypatch, float("inf"), step)
    quiet, _ = race(pair, ["lookup"], max_new=16)
    assert quiet.row("lookup").speedup == pytest.approx(2.0, rel=0.1)
    whole = quiet.runs["lookup"].summary.elapsed + quiet.runs["lookup"].plain_summary.elapsed
    sim = _load_from(monkeypatch, 0.0, step)  # the load comes two thirds into the race's wall time
    sim.wall = -2 / 3 * whole
    board, _ = race(pair, ["lookup"], max_new=16)
    r = board.row("lookup")  # stepped by the clock: 3.0x (plain alone in the load)
    assert r.speedup == pytest.approx(2.0, rel=0.15), r


def test_a_starting_race_shows_an_empty_baseline_pane(pair):
    """Seen in the browser (2026-11-28): as the second race started, its baseline pane showed the
    first race's whole plain run, and the new race's plain tokens were appended after it."""
    from specviz.ui.leaderboard import pane_stream
    req = make_request(PROMPT, gamma=3, max_new_tokens=8, temperature=0.0, seed=3)
    board = new_board(pair, req, ["draft", "lookup"])
    panes = None
    for k, side, ev in race_methods(pair, req, encode_prompt(pair.tokenizer, req), board):
        if side == START:
            panes = pane_stream(board, k, live=True)
            if k == "lookup":  # the first race's plain run is the board's reference by now
                assert board.baseline and panes.base_html == panes.spec_html  # the prompt alone, both
        elif side != END:
            panes.add(side, ev)
    fresh = pane_stream(board, "lookup")  # the finished race, built again from its own events
    assert panes.base_html == fresh.base_html
