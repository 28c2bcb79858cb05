"""Plotly figures of a run, computed from RunView (i.e. from events only).

Transparent backgrounds, grey grid and a mid-grey font so the charts read in
light and dark mode alike; series colours from the Okabe-Ito palette.
"""
from __future__ import annotations

import plotly.graph_objects as go

from ..engine.events import OUTCOME_COLOURS, Outcome
from .draft_source import FREE_DRAFTS, chart_hover, from_text
from .state import HOLD_ROUNDS, PREDICT_FROM, RunView

GREEN = OUTCOME_COLOURS[Outcome.ACCEPTED]
ORANGE = OUTCOME_COLOURS[Outcome.BONUS]
BLUE = OUTCOME_COLOURS[Outcome.RESAMPLED]
VERMILLION = OUTCOME_COLOURS[Outcome.REJECTED]
SKY = "#56B4E9"
PURPLE = "#CC79A7"
GRID = "rgba(128,128,128,0.25)"
FONT = "#8c8c8c"
# Okabe-Ito, colour-blind safe: one colour per line of a many-line chart (bench, draft sizes)
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]


MODEBAR_REMOVED = ["zoom", "pan", "select", "lasso", "zoomin", "zoomout", "autoscale", "resetscale"]


def _layout(fig: go.Figure, title: str, xaxis: str, yaxis: str, **kw) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
        height=316, margin=dict(l=48, r=34, t=40, b=56),
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
        font=dict(color=FONT, size=12),
        # under the plot: above it the legend wrapped onto the title (issue 21); the toolbar
        # stands upright at the right edge instead of over the title
        # below the axis title: at -0.2 the time split's legend sat on "round" (2026-11-27)
        legend=dict(orientation="h", yanchor="top", y=-0.28, xanchor="left", x=0.0,
                    bgcolor="rgba(0,0,0,0)", font=dict(size=11)),
        # the download button only: each chart's eight more buttons were eight Tab stops, some 45 on
        # the live tab before the inspector (axe audit, 2026-11-28); drag still zooms, a double
        # click still resets
        modebar=dict(orientation="v", bgcolor="rgba(0,0,0,0)", remove=MODEBAR_REMOVED),
        hovermode="x unified", **kw)
    fig.update_xaxes(title_text=xaxis, gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    fig.update_yaxes(title_text=yaxis, gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    return fig


def empty(fig: go.Figure, text: str) -> go.Figure:
    """No data: the reason in the middle, no axes (a visitor read empty axes as a broken chart)."""
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(color=FONT, size=13))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _no_rounds(view: RunView, waiting: str = "waiting for the first round…") -> str:
    """An empty chart's caption: a failed run's message is in the run info line alone (issue 71), so
    its charts say only that no round came, not that one is on its way."""
    return "no rounds" if view.error else waiting


def alpha_chart(view: RunView) -> go.Figure:
    rounds = view.spec.rounds
    fig = go.Figure()
    # accepted ÷ drafted, named as the chip names it: not α̂ (expected acceptance, Σ min(p, q)), which
    # a visitor saw at 0.955 beside this chart's 0.886 under the one title "α" (issue 51)
    _layout(fig, "Accepted ÷ drafted per round", "round", "accepted ÷ drafted", yaxis_range=[0, 1.05])
    if not rounds:
        return empty(fig, _no_rounds(view))
    x = [r.index + 1 for r in rounds]
    # a round that drafted nothing has no share: no bar, and no "so far" point before any draft (a hybrid
    # run's line began at 0 when its round 1 drafted nothing, 2026-11-28)
    per = [r.n_accepted / r.gamma if r.gamma else None for r in rounds]
    cum = [r.total_accepted / r.total_drafted if r.total_drafted else None for r in rounds]
    fig.add_bar(x=x, y=per, name="this round", marker_color=GREEN, opacity=0.55,
                customdata=[f"{r.n_accepted}/{r.gamma}" for r in rounds],
                hovertemplate="%{customdata} accepted<extra>this round</extra>")
    fig.add_scatter(x=x, y=cum, name="so far", mode="lines+markers", line=dict(color=BLUE, width=2.5),
                    marker=dict(size=5), hovertemplate="%{y:.3f}<extra>accepted ÷ drafted so far</extra>")
    return fig


def steady_points(view: RunView) -> list:
    """The speedup series without round 1's point (issue 71: the chart began at a 6.43× spike; that
    round also read the prompt, as the box says); none while fewer than HOLD_ROUNDS rounds ran."""
    pts = view.speedup_series
    return pts[1:] if len(view.spec.rounds) >= HOLD_ROUNDS else []


def speedup_chart(view: RunView) -> go.Figure:
    pts = steady_points(view)
    fig = go.Figure()
    clock = "seconds (virtual clock)" if view.mode == "fair" else "seconds"
    title = "Speedup over time: measured" + (
        " (no chain prediction for a tree)" if view.is_tree else
        " (no prediction for copied drafts)" if view.method in FREE_DRAFTS else " vs predicted")
    _layout(fig, title, f"{clock} · round 1 left out: it also reads the prompt", "× baseline")
    if not pts:
        why = (_no_rounds(view, "waiting for both sides…") if not view.speedup_series else
               f"too short: fewer than {HOLD_ROUNDS} rounds" if view.finished else
               f"from round {HOLD_ROUNDS} on")
        return empty(fig, f"{why} (round 1 also reads the prompt)" if view.speedup_series else why)
    t = [p[0] for p in pts]
    fig.update_yaxes(range=[0, speedup_top(pts)])
    fig.add_hline(y=1.0, line=dict(color=FONT, width=1, dash="dot"))
    fig.add_scatter(x=t, y=[p[1] for p in pts], name="measured", mode="lines+markers",
                    line=dict(color=BLUE, width=2.5), marker=dict(size=5), connectgaps=False,
                    hovertemplate="%{y:.2f}×<extra>measured</extra>")
    if any(p[2] is not None for p in pts):  # none for a token tree: no legend entry without a line
        # from round PREDICT_FROM on: a visitor asked why the predicted lines began after the measured
        fig.add_scatter(x=t, y=[p[2] for p in pts], name=f"Leviathan prediction (measured α̂, c; from round "
                        f"{PREDICT_FROM})",
                        mode="lines", line=dict(color=ORANGE, width=2.5, dash="dash"), connectgaps=False,
                        hovertemplate="%{y:.2f}×<extra>predicted</extra>")
    if any(len(p) > 3 and p[3] is not None for p in pts):
        fig.add_scatter(x=t, y=[p[3] if len(p) > 3 else None for p in pts],
                        name="with the measured verify cost v", mode="lines", connectgaps=False,
                        line=dict(color=VERMILLION, width=2, dash="dot"),
                        hovertemplate="%{y:.2f}×<extra>predicted with v</extra>")
    return fig


def speedup_top(pts) -> float:
    """The speedup axis' top: the measured points and the predictions' last values (the box's), with
    room above; an early prediction beyond it runs off the top rather than squeezing the run's curve
    (issue 59: predictions of ~6.5× in the first rounds stretched the axis of a 1.5× run)."""
    last = [next((p[i] for p in reversed(pts) if len(p) > i and p[i] is not None), None) for i in (2, 3)]
    seen = [p[1] for p in pts if p[1] is not None] + [x for x in last if x is not None]
    return 1.15 * max([1.0, *seen])


def time_split_chart(view: RunView) -> go.Figure:
    rounds = view.spec.rounds
    fig = go.Figure()
    _layout(fig, "Time per round: draft vs verify", "round", "seconds", barmode="stack")
    if not rounds:
        return empty(fig, _no_rounds(view))
    x = [r.index + 1 for r in rounds]
    fig.add_bar(x=x, y=[r.t_draft for r in rounds], name="draft (proposing the guesses)", marker_color=SKY,
                customdata=[_drafter(r.info) for r in rounds],
                hovertemplate="%{y:.3f} s%{customdata}<extra>draft</extra>")
    fig.add_bar(x=x, y=[0.0 if r.prompt_tokens else r.t_verify for r in rounds],
                name="verify (1 target pass)",
                marker_color=PURPLE, hovertemplate="%{y:.3f} s<extra>verify</extra>")
    if any(r.prompt_tokens for r in rounds):  # round 1's target pass also reads the prompt
        fig.add_bar(x=x, y=[r.t_verify if r.prompt_tokens else 0.0 for r in rounds],
                    name="verify + reading the prompt", marker_color=PURPLE, marker_pattern_shape="/",
                    hovertemplate="%{y:.3f} s<extra>verify + prompt</extra>")
    copied_markers(fig, rounds, [r.t_draft + r.t_verify for r in rounds])
    return fig


def _drafter(info) -> str:
    """Which drafter ran a suffix/hybrid round and what the hybrid priced it at, for the draft bar."""
    who = {"suffix": "suffix tree (no model)", "model": "draft model", "none": "no draft (a plain step)"}
    if not isinstance(info, dict) or info.get("drafter") not in who:
        return ""
    cost = info.get("cost_steps")
    return f" · {who[info['drafter']]}" + (f", priced {cost:.2f} plain steps" if cost is not None else "")


def copied_markers(fig: go.Figure, rounds, ys: list[float]) -> None:
    """A ❝ diamond over each round whose draft was copied from text (a suffix tree, no draft
    model; ui/draft_source.py), its source on hover. Nothing when no round was."""
    picked = [(r.index + 1, y, chart_hover(r.info)) for r, y in zip(rounds, ys, strict=True)
              if from_text(r.info)]
    if not picked:
        return
    x, y, why = zip(*picked, strict=True)
    fig.add_scatter(x=x, y=y, name="❝ copied from text (no draft model)", mode="markers",
                    marker=dict(symbol="diamond", size=9, color=BLUE, line=dict(width=1, color=FONT)),
                    customdata=list(why), hovertemplate="%{customdata}<extra>❝</extra>")


def position_chart(view: RunView) -> go.Figure:
    """Per draft position i: how often the i-th guess was accepted, out of all rounds
    that drafted it (bars: accepted ÷ drafted, the chips' name), and out of the rounds where it
    was tested, i.e. all earlier guesses were accepted (line: accepted ÷ tested). One name per
    measure on every chart (issue 59: "kept ÷ drafted", "kept ÷ tested" and "rate" here)."""
    rounds = view.spec.rounds
    fig = go.Figure()
    _layout(fig, "Acceptance by draft position", "draft position (1..γ)", "accepted ÷ drafted (or ÷ tested)",
            yaxis_range=[0, 1.05])
    if not rounds:
        return empty(fig, _no_rounds(view))
    g = max(r.gamma for r in rounds)
    drafted = [0] * g
    tested = [0] * g
    accepted = [0] * g
    for r in rounds:
        for i in range(r.gamma):
            drafted[i] += 1
            if i < len(r.u):  # one uniform per tested position
                tested[i] += 1
            if i < r.n_accepted:
                accepted[i] += 1
    x = list(range(1, g + 1))
    per_drafted = list(zip(accepted, drafted, strict=True))
    per_tested = list(zip(accepted, tested, strict=True))
    fig.add_bar(x=x, y=[k / d if d else None for k, d in per_drafted], name="accepted ÷ drafted",
                marker_color=GREEN, opacity=0.75, customdata=[f"{k}/{d}" for k, d in per_drafted],
                hovertemplate="%{customdata}<extra>accepted ÷ drafted</extra>")
    if any(tested):  # a token tree's rounds record no per-position tests: no empty legend entry
        fig.add_scatter(x=x, y=[k / t if t else None for k, t in per_tested], name="accepted ÷ tested",
                        mode="lines+markers", line=dict(color=BLUE, width=2), marker=dict(size=6),
                        customdata=[f"{k}/{t}" for k, t in per_tested],
                        hovertemplate="%{customdata}<extra>accepted ÷ tested</extra>")
    fig.update_xaxes(dtick=1)
    return fig


def all_charts(view: RunView) -> list[go.Figure]:
    return [alpha_chart(view), speedup_chart(view), time_split_chart(view), position_chart(view)]
