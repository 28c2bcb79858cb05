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
from specviz.run.leaderboard import END, PLAIN, RETIME, START, new_board, parse_keys, race_methods
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
    base = board.base_summary
    assert [r.key for r in rows if r.key != PLAIN] and rows[0].tokens_per_s is not None
    assert {r.key for r in rows} == {PLAIN, *KEYS}
    spd = [r.speedup if r.tau >= 1.005 or r.speedup <= 1 else 1.0 for r in rows]
    assert spd == sorted(spd, reverse=True)  # by × plain, a τ 1.00 run never above plain
    plain = next(r for r in rows if r.key == PLAIN)
    assert plain.tokens_per_s == base.tokens_per_s and plain.speedup == 1.0 and plain.identical == "reference"
    timings = board.meta["plain_timings"]
    assert len(timings) == 1 + len(KEYS) and [t["after"] for t in timings] == ["", *KEYS]
    for r in rows:
        if r.key == PLAIN:
            continue
        s = board.runs[r.key].summary
        before, after = board._bracket(r.key)  # plain timed just before and just after it
        assert before.tokens_per_s == timings[KEYS.index(r.key)]["tokens_per_s"]
        assert after.tokens_per_s == timings[KEYS.index(r.key) + 1]["tokens_per_s"]
        st = run_stats(s, before, trace_costs(board.trace(r.key)))
        assert (r.tokens_per_s, r.tau, r.alpha_hat, r.c, r.v) == \
            (s.tokens_per_s, st.tau, st.alpha_hat, st.c, st.verify_cost)
        ref = (before.tokens_per_s + after.tokens_per_s) / 2  # a same-minute ratio, said in the row
        assert r.speedup == pytest.approx(s.tokens_per_s / ref) and r.plain_tokens_per_s == pytest.approx(ref)
        assert r.plain_how.startswith(f"÷ {ref:.2f} tok/s: the mean of plain timed just before")
        assert r.n_tokens == s.n_tokens == 16 and not r.error
        assert r.gamma == ("auto" if r.key == "auto" else "3")
        # greedy on fp32: every method reproduces plain decoding token for token
        assert r.identical == "identical", (r.key, r.detail)
        assert s.token_ids == base.token_ids
    assert board.runs["auto"].summary.gamma_policy and not board.runs["draft"].summary.gamma_policy
    assert board.runs["lookup"].summary.method == "lookup" and board.runs["tree"].summary.method == "tree"


def test_runs_are_one_at_a_time_baseline_first(greedy):
    board, stream = greedy
    marks = [(k, s) for k, s, _ in stream if s in (START, END)]
    # plain timed again after each method (issue 51): only its markers, its events not recorded
    assert marks == [(PLAIN, START), (PLAIN, END)] + [
        m for k in KEYS for m in ((k, START), (k, END), (RETIME, START), (RETIME, END))]
    current = None
    for k, side, _ev in stream:  # every event lies between its own run's START and END
        if side == START:
            current = k
        elif side == END:
            current = None
        else:
            assert k == current != RETIME and side == ("baseline" if k == PLAIN else "speculative")
    assert all(isinstance(e, (TokenEvent, RunSummary)) for e in board.baseline)
    assert all(isinstance(e, (RoundEvent, RunSummary)) for r in board.runs.values() for e in r.events)


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

    def stop_after_baseline(key, side, ev):
        if key == PLAIN and side == END:
            stop.set()
    board, stream = race(pair, ["draft", "lookup"], stop=stop, on_event=stop_after_baseline)
    assert board.base_summary is not None
    assert [board.runs[k].error for k in ("draft", "lookup")] == ["stopped before it ran"] * 2
    assert [r.key for r in board.rows() if r.tokens_per_s is not None] == [PLAIN]


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
    assert board.done() == 2  # the baseline and lookup: not the cut run, not the unrun one
    assert [r.key for r in board.rows()][:2] == [r.key for r in board.rows() if r.ranked]
    html = table_html(board)
    assert "stopped after" in html and "not ranked" in html
    assert "2 of 4 runs done: stopped by you" in progress_html(board, "stopped by you")
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
        assert tr.summaries()["baseline"].to_dict() == board.base_summary.to_dict()
        view = replay_ui.final_view(tr)
        # the panes' speedup is against the plain run they show (the first); the table's a same-minute one
        assert view.finished and view.stats()["speedup"] == pytest.approx(
            board.runs[k].summary.tokens_per_s / board.base_summary.tokens_per_s)
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
    assert "[1/3] plain decoding" in err and "saved the race" in err
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
    assert list(fig.data[0].x) == [r.tokens_per_s for r in board.rows()][::-1]
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


# ------------------------------------------------------------ same-minute × plain (issue 51)

def _plain(tps: float, n: int = 32) -> RunSummary:
    return RunSummary("baseline", "plain", list(range(n)), "", n, n / tps, 0.1, n, "max_new_tokens")


def _busy_board(before: float, after: float | None, lookup_tps: float = 5.9):
    """Issue 51's race in small: prompt lookup accepted nothing (τ 1.00), plain timed around it."""
    from specviz.run.leaderboard import Board, Entry, MethodRun, _timing
    board = Board({"settings": {"temperature": 0.0, "max_new_tokens": 32, "gamma": 3}}, ["lookup"])
    board.baseline = [_plain(before)]
    board.meta["plain_timings"] = [_timing(_plain(before), "")]
    if after is not None:
        board.meta["plain_timings"].append(_timing(_plain(after), "lookup"))
    board.meta["plain_brackets"] = {"lookup": [0, 1 if after is not None else None]}
    spec = RunSummary("speculative", "lookup", list(range(32)), "", 32, 32 / lookup_tps, 0.1, 32,
                      "max_new_tokens", rounds=32, drafted=0)
    board.runs["lookup"] = MethodRun(Entry("lookup", "lookup"), {"gamma": 3}, [spec])
    return board


def test_a_busy_baseline_no_longer_makes_a_method_that_accepted_nothing_fast():
    # plain at 4.27 tok/s on a busy minute, 19 after it: lookup's 5.9 tok/s is 0.51× of the same minutes
    row = _busy_board(4.27, 19.0).row("lookup")
    assert row.speedup == pytest.approx(5.9 / ((4.27 + 19.0) / 2)) and not row.flag
    assert "just before (4.27) and just after (19.00)" in row.plain_how


def test_a_tau_one_method_above_plain_is_flagged_and_ranked_below_it():
    from specviz.cli.leaderboard import table
    from specviz.ui.leaderboard_render import table_html
    board = _busy_board(4.27, 4.3)  # both brackets busy: lookup's 1.38× is noise
    row = board.row("lookup")
    assert row.tau == 1.0 and row.speedup == pytest.approx(5.9 / 4.285) and row.speedup > 1
    assert row.flag.startswith("τ 1.00: no more tokens per target forward than plain decoding")
    assert [r.key for r in board.rows()] == [PLAIN, "lookup"] and row.ranked
    html = table_html(board)
    assert "⚠ τ 1.00" in html and "1.38× ⚠" in html and "same-minute" in html
    assert "⚠ τ 1.00" in table(board)
    assert "plain then" in table(board) and row.plain_then == "4.29"  # (4.27 + 4.3) / 2, shown
    one = _busy_board(4.27, None)  # no plain after it (cut): the one before, said so
    assert one.row("lookup").plain_how.endswith("none after") and one.row("lookup").flag


def test_the_race_table_says_when_the_machine_is_busy():
    from specviz.ui.leaderboard_render import table_html
    board = _busy_board(4.27, 19.0)
    assert "This machine is busy" not in table_html(board)
    html = table_html(board, "other programs use 1.9 of this machine's 2 cores")
    assert "This machine is busy</b> (other programs use 1.9 of this machine&#x27;s 2 cores)" in html
    board.last = "lookup"
    board.note_busy(RETIME, "other programs use 1.9 of this machine's 2 cores")  # its plain run after
    assert board.row("lookup").flag.startswith("busy machine (other programs use 1.9")
