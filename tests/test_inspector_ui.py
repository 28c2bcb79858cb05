"""The p/q inspector's page side: click target attributes, panel and figure (pure functions)."""
import re

from specviz.engine.events import Outcome, RoundEvent, TokenEvent
from specviz.ui import inspector, render


def _round(resampled=True):
    # γ 3; drafts 11, 12, 13; the first accepted, the second rejected, 20 resampled
    toks = [TokenEvent(11, "a", Outcome.ACCEPTED, 1.0, 0, 1, p=0.5, q=0.4, u=0.3),
            TokenEvent(12, "\n", Outcome.REJECTED, 1.0, 0, 2, p=0.1, q=0.6, u=0.8),
            TokenEvent(20, "<b>", Outcome.RESAMPLED, 1.0, 0, 0, p=0.3)]
    row = {"ids": [11, 12, 20], "t": ["a", "\n", "<b>"], "p": [0.5, 0.1, 0.3], "q": [0.4, 0.6, 0.0]}
    return RoundEvent(index=0, gamma=3, draft_ids=[11, 12, 13], q=[0.4, 0.6, 0.5], p=[0.5, 0.1, 0.2],
                      u=[0.3, 0.8], overlap=[0.9, 0.5, 0.6], n_accepted=1, appended_id=20,
                      resampled=resampled,
                      t_start=0.0, t_draft=0.1, t_verify=0.2, t_end=1.0, draft_forwards=3, tokens=toks,
                      dists=[row, row, row, {"ids": [20], "t": ["<b>"], "p": [1.0]}],
                      residual={"pos": 1, "ids": [20, 11], "t": ["<b>", "a"], "r": [0.75, 0.25]})


def test_spans_carry_round_and_row():
    html = render.round_html(_round())
    assert re.findall(r'data-r="(\d+)" data-i="(\d+)" data-o="(\w+)"', html) == [
        ("0", "0", "accepted"), ("0", "1", "rejected"), ("0", "1", "resampled")]


def test_rejected_click_shows_three_distributions():
    html, fig = inspector.select("0:1:rejected", [_round()])
    names = [t.name for t in fig.data]
    assert names == ["p (target)", "q (draft)", "residual norm(max(0, p − q))"]
    assert list(fig.data[0].x)[-1] == inspector.REST
    # rest of the vocabulary: 1 − Σ listed
    assert fig.data[2].y[-1] == 0.0 and abs(fig.data[0].y[-1] - 0.1) < 1e-9
    assert "&lt;b&gt;" in "".join(fig.data[0].x) and "<b>" not in "".join(fig.data[0].x)  # labels escaped
    assert "u = <b>0.8000</b>" in html and "min(1, p/q) = <b>0.1667</b>" in html and "rejected" in html
    assert "residual" in html and "sv-insp-gauge" in html


def test_bonus_row_has_p_only_and_bad_clicks_are_ignored():
    _, fig = inspector.select("0:3", [_round(resampled=False)])
    assert [t.name for t in fig.data] == ["p (target)"]
    for bad in ["", "x:y", "-1:0", "0:9", "5:0", "<script>"]:
        html, fig = inspector.select(bad, [_round()])
        assert fig is None and "Click any token" in html


def test_greedy_rejection_tags_the_targets_pick():
    """Issue 71: at temperature 0 the bar of the target's top token said "▲resampled"; nothing is drawn
    there, the target's argmax is taken."""
    from dataclasses import replace
    rnd = _round()
    raw = [dict(d, raw=True) for d in rnd.dists]
    html, fig = inspector.select("0:1:resampled", [replace(rnd, dists=raw, u=[])])
    assert "(the target&#x27;s pick (greedy))" in html and "(resampled)" not in html
    labels = list(fig.data[0].x)
    assert any(x.endswith("#20 ▲target's pick (greedy)") for x in labels), labels
    assert not any("resampled" in x for x in labels), labels
    _, fig = inspector.select("0:1:resampled", [rnd])  # sampled: resampled from the residual
    assert any(x.endswith("#20 ▲resampled") for x in fig.data[0].x)


def test_old_trace_without_distributions():
    r = _round()
    r.dists, r.residual = [], None
    html, fig = inspector.select("0:1", [r])
    assert "recorded before" in html and len(fig.data) == 0


def test_click_names_the_clicked_token_and_replay_registry():
    html, _ = inspector.select("0:1:resampled", [_round()])
    assert "(resampled)" in html
    html, _ = inspector.select("0:1:rejected", [_round()])
    assert "(rejected)" in html
    tr = type("T", (), {"events": [("baseline", object()), ("speculative", _round())]})()
    inspector.put_trace("session-x", tr)
    assert inspector.select("0:1:rejected", inspector.LATEST.get("session-x"))[1] is not None


def test_a_round_without_distributions_says_why():
    """A token-tree round keeps node p/q in the tree view, not top-k rows: the inspector says so
    (it said "recorded before the inspector kept the distributions" for a live tree run)."""
    from dataclasses import replace
    rnd = replace(_round(), dists=[], residual=None)
    assert "recorded before" in inspector.missing(rnd)
    tree = replace(rnd, tree={"tokens": [11], "parents": [-1]})
    assert "token-tree view" in inspector.missing(tree)
    fig = inspector.figure(tree, 0)
    assert "token-tree view" in str(fig.layout.annotations[0].text)
    assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False  # no empty axes
