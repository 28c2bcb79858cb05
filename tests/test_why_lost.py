"""Issue 71 item 5: why a method loses, in plain words, before and after its run. The cause sentence is
picked by the measured numbers, never by the method's name (unit tests on the pure function with
made-up stats); staged counts what prompt lookup contributed, through its rounds' events; every method
has a note saying when it tends to lose; the run line and the race rows name methods by their labels,
never by internal ids."""
import html
from types import SimpleNamespace

import pytest

from specviz.engine.proposers import REGISTRY
from specviz.ui import method_options as mo
from specviz.ui import render
from specviz.ui.speedup_box import why_html
from specviz.ui.why_lost import cause, cause_of, staged_share, staged_text

# ------------------------------------------------------------------ the cause, by the numbers


def test_a_costly_verify_is_named_with_its_figures():
    # lookahead-like: no draft model, a verify pass of ~24 rows at 5.1 plain steps, 1.3 tokens a round
    s = cause(0.33, 1.3, 5.1, 0.0, 1.4, alpha=0.2, alpha_hat=0.3, rows=24)
    assert s.startswith("Why it lost: a costly check")
    assert "cost 5.10 plain steps and kept 1.30 tokens" in s and "24 tokens at once" in s


def test_drafts_that_rarely_pass_are_named_with_their_share():
    # REST-like: free drafts, a cheap verify, 6 % kept
    s = cause(0.80, 1.18, 1.3, 0.0, 5.0, alpha=0.06, alpha_hat=0.2)
    assert "rarely pass" in s and "6% of its drafted tokens were kept" in s and "α̂ 0.20" in s
    assert "1.18 tokens for 1.30 plain steps" in s


def test_a_costly_draft_is_named_even_when_its_drafts_pass_often():
    # layer-skip-like (the case): α̂ 0.935, but each draft step costs a full target step
    s = cause(0.70, 3.5, 1.3, 1.0, 4.0, alpha=0.8, alpha_hat=0.935, draft_steps=4.0)
    assert "its draft costs about as much as a target step" in s
    assert "One draft step cost 1.00 plain steps, 4.00 a round with the check's 1.30, for 3.50 tokens" in s
    assert "rarely pass" not in s
    half = cause(0.9, 2.0, 1.1, 0.5, 4.0, draft_steps=4.0)
    assert "its draft costs 50% of a target step" in half


def test_the_same_method_gets_the_cause_its_numbers_give():
    """Chosen by the numbers: the one method (say the draft model) loses by its cost on one run and by
    its acceptance on another."""
    slow = cause(0.8, 4.0, 1.2, 0.9, 4.0, alpha=0.75)
    wrong = cause(0.8, 1.1, 1.2, 0.05, 4.0, alpha=0.03)
    assert "draft costs" in slow and "rarely pass" in wrong


def test_rounds_that_gained_point_outside_them():
    s = cause(0.9, 4.0, 1.3, 0.1, 4.0, draft_steps=4.0)  # 4 tokens for 1.7 steps: 2.35× by its rounds
    assert "not its rounds" in s and "2.35× by its rounds" in s and "reading the prompt" in s


def test_gained_little_and_gained_enough():
    assert cause(1.05, 1.18, 1.3, 0.0, 5.0, alpha=0.06).startswith("Why it gained little")
    assert cause(1.5, 1.18, 1.3, 0.0, 5.0) == ""  # a real gain: no sentence
    assert cause(0.5, None, 1.3, 0.0, 5.0) == "" and cause(0.5, 1.2, None, 0.0, 5.0) == ""
    assert cause(0.5, 1.2, 1.3, None, 5.0) == ""  # no draft step timed yet: c unknown, nothing said
    assert cause(None, 1.2, 1.3, 0.0, 5.0) == ""


def test_a_tree_is_priced_by_its_depth_not_its_nodes():
    st = dict(speedup=0.8, tau=3.5, verify_cost=2.8, c=0.3, gamma_mean=12.0, alpha=0.2, draft_steps=4.0)
    # as a chain, 12 drafts a round would make acceptance the cause; a depth-4 tree keeps at most 5
    assert "rarely pass" in cause_of(st)
    assert "costly check" in cause_of(st, tree=True, gamma=4)


# ------------------------------------------------------------------ staged: lookup's part


def _round(gamma, n_accepted, info):
    return SimpleNamespace(gamma=gamma, n_accepted=n_accepted, info=info)


def test_staged_share_counts_lookups_drafts_and_what_the_target_accepted():
    rounds = [_round(5, 3, dict(lookup_guessed=4, lookup_kept=3, draft_forwards_saved=2, lookup_at=[0, 1, 4])),
              _round(5, 5, dict(lookup_guessed=0, lookup_kept=0, draft_forwards_saved=0, lookup_at=[])),
              _round(0, 0, {})]  # a round of another kind: not counted
    sh = staged_share(rounds)
    assert sh == dict(drafted=10, accepted=8, guessed=4, saved=2, lookup=3, lookup_accepted=2)
    text = staged_text(sh, greedy=True)
    assert "3 of 10 drafted tokens were its guesses" in text and "(2 accepted by the target)" in text
    assert "the other 7 (6 accepted)" in text and "2 draft forwards saved" in text
    assert "chain is the draft model's own" in text
    none = staged_text(staged_share([_round(4, 2, dict(lookup_guessed=3, lookup_kept=0,
                                                        draft_forwards_saved=0, lookup_at=[]))]))
    assert "Prompt lookup's part: none" in none and "all 4 drafted tokens were the draft model's own" in none
    assert staged_share([_round(4, 2, {})]) is None and staged_text(None) == ""


def test_an_older_recording_says_what_it_did_not_record():
    """The shipped race's staged rounds predate lookup_at: lookup's drafts counted, its accepted not."""
    from specviz.ui import leaderboard as lb
    from specviz.ui.leaderboard_render import row_why, table_html
    board = next(iter(lb.shipped().values()), None)
    if board is None or "staged" not in board.runs:
        pytest.skip("no shipped race with staged")
    row = next(r for r in board.rows() if r.key == "staged")
    why = row_why(board, row)
    assert "drafted tokens were its guesses" in why and "not recorded in this recording" in why
    table = table_html(board)
    assert "Why it lost: a costly check" in table  # lookahead's row, by its v
    for key in REGISTRY:  # rows named by labels, never by internal ids
        assert f">{key}</th>" not in table


def test_staged_records_which_drafts_were_lookups(tok, target, draft):
    from helpers import run

    from specviz.engine.decoding import speculative
    from specviz.engine.proposers import PromptLookupProposer
    from specviz.engine.proposers.staged import StagedProposer
    from specviz.engine.sampling import SamplingParams
    ids = tok.encode("def quicksort(arr): arr arr arr")
    prop = StagedProposer(target, lookup=PromptLookupProposer(target.config.vocab_size))
    rounds, spec = run(speculative(target, prop, tok, ids, 30, 4, SamplingParams(temperature=0)))
    for r in rounds:
        at = r.info["lookup_at"]
        assert at == sorted(set(at)) and all(0 <= p < r.gamma for p in at)
        assert len(at) <= r.info["lookup_kept"]
    sh = staged_share(rounds)
    assert sh["drafted"] == spec.drafted and sh["accepted"] == spec.accepted
    assert sh["lookup"] > 0 and 0 <= sh["lookup_accepted"] <= min(sh["lookup"], sh["accepted"])
    # the draft is the target itself here: every draft passes, lookup's too
    assert sh["lookup_accepted"] == sh["lookup"]


# ------------------------------------------------------------------ the page: box, note, run line


def test_the_box_says_why_once_the_run_is_finished():
    stats = dict(speedup=0.33, tau=1.3, verify_cost=5.1, c=0.0, gamma_mean=1.4, verify_rows=24)
    snap = dict(finished=True, stats=stats, method="lookahead")
    assert "costly check" in why_html(snap, 0.33)
    assert why_html(dict(snap, finished=False), 0.33) == ""  # not while it runs
    assert why_html(snap, None) == ""  # no headline, no reason for it
    staged = dict(snap, stats=dict(stats, speedup=1.6), staged=dict(drafted=10, accepted=8, guessed=4,
                                                                     saved=2, lookup=3, lookup_accepted=2))
    said = html.unescape(why_html(staged, 1.6))
    assert "Prompt lookup's part" in said and "costly" not in said


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_every_method_says_when_it_tends_to_lose(method):
    spec = REGISTRY[method]
    assert spec.loses_when.startswith("When it tends to lose")
    assert spec.loses_when in html.unescape(mo.note_html(method))


@pytest.mark.parametrize("method", sorted(REGISTRY))
def test_the_run_line_names_every_method_by_its_label(method):
    line = render.run_info_html(dict(method=method, options={}, mode="fair"))
    if method != "draft":  # the draft model is the default: the line names no method
        assert "guesses from" in line
    assert f"<b>{method}</b>" not in line  # never the internal id ("rest", "suffix-tree")
    assert render.guesses_from(method) != method
