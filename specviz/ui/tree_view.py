"""The token tree of one speculative round, as a plotly figure, drawn only from
the round's event (RoundEvent.tree), so it replays from traces.

Depth runs left to right from the root (the last committed token); siblings
stack vertically in draw order. The accepted path is green and bold, nodes
the target tested and refused are vermillion, untested branches are dimmed,
and the token the target appended after the path is a star (orange: bonus,
blue: resampled after a rejection).
"""
from __future__ import annotations

import plotly.graph_objects as go

from ..engine.events import OUTCOME_COLOURS, Outcome
from .charts import FONT, _empty, _layout

GREEN = OUTCOME_COLOURS[Outcome.ACCEPTED]
VERMILLION = OUTCOME_COLOURS[Outcome.REJECTED]
DIM = "rgba(140,140,140,0.45)"


def _show(text: str) -> str:
    """Visible whitespace, short labels."""
    s = text.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·")
    return s if len(s) <= 10 else s[:9] + "…"


def tree_layout(parents: list[int]) -> list[float]:
    """y of each node: leaves take consecutive rows in draw order, a parent
    sits at the mean of its children. Returns y for the root first, then nodes."""
    kids: dict[int, list[int]] = {i: [] for i in range(-1, len(parents))}
    for i, par in enumerate(parents):
        kids[par].append(i)
    y: dict[int, float] = {}
    row = [0]

    def place(u):
        if not kids[u]:
            y[u] = float(row[0])
            row[0] += 1
            return
        for c in kids[u]:
            place(c)
        y[u] = sum(y[c] for c in kids[u]) / len(kids[u])

    place(-1)
    return [y[-1]] + [y[i] for i in range(len(parents))]


def _node_style(i: int, path: set[int], tested: set[int]):
    if i in path:
        return GREEN, 15, "accepted"
    if i in tested:
        return "rgba(213,94,0,0.6)", 11, "tested, rejected"  # vermillion, dimmed
    return DIM, 9, "not reached"


def tree_figure(rnd, title: str | None = None) -> go.Figure:
    """Figure for one RoundEvent (or None); an explanatory empty figure when
    the round has no tree (chain methods)."""
    fig = go.Figure()
    label = title or (f"Token tree, round {rnd.index + 1}" if rnd is not None else "Token tree")
    _layout(fig, label, "depth (0 = last committed token)", "")
    fig.update_layout(height=340, hovermode="closest", showlegend=False)
    tree = getattr(rnd, "tree", None) if rnd is not None else None
    if not tree:
        return _empty(fig, "no token tree: pick the token-tree method")
    parents, depth = tree["parents"], tree["depth"]
    texts = tree.get("texts") or [str(t) for t in tree["tokens"]]
    last = tree["path"][-1] if tree["path"] else -1
    # the appended token gets its own row, as one more child of the path's end
    ys = tree_layout(parents + ([last] if tree.get("appended", -1) >= 0 else []))
    path, tested = set(tree["path"]), set(tree.get("tested", []))
    for i, par in enumerate(parents):  # edges first, so nodes sit on top
        on = i in path
        fig.add_scatter(x=[0 if par < 0 else depth[par], depth[i]], y=[ys[par + 1], ys[i + 1]],
                        mode="lines", hoverinfo="skip",
                        line=dict(color=GREEN if on else DIM, width=4 if on else 1.2))
    style = [_node_style(i, path, tested) for i in range(len(parents))]
    hover = [f"{_show(texts[i])!s}  (id {tree['tokens'][i]})<br>q = {tree['q'][i]:.3f}, "
             f"p = {tree['p'][i]:.3f}<br>depth {depth[i]}, {style[i][2]}" for i in range(len(parents))]
    fig.add_scatter(x=[0], y=[ys[0]], mode="markers+text", text=["root"], textposition="middle left",
                    marker=dict(color=FONT, size=12, symbol="square"), hovertext=["last committed token"],
                    hoverinfo="text")
    fig.add_scatter(x=depth, y=ys[1:], mode="markers+text", text=[_show(t) for t in texts],
                    textposition="top center", hovertext=hover, hoverinfo="text",
                    marker=dict(color=[s[0] for s in style], size=[s[1] for s in style],
                                line=dict(width=0)), textfont=dict(size=11))
    _appended(fig, rnd, tree, ys)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_xaxes(dtick=1, range=[-0.6, max(depth, default=0) + 1.6])
    return fig


def latest_tree_figure(view) -> go.Figure:
    """The tree of the run's latest round (the page shows it as rounds stream)."""
    rounds = [r for r in view.spec.rounds if getattr(r, "tree", None)]
    if rounds:
        return tree_figure(rounds[-1])
    fig = tree_figure(None)
    fig.update_layout(height=150)
    waiting = getattr(view, "method", "") == "tree" and not view.spec.rounds
    return _empty(fig, "waiting for the first round…" if waiting else
                  "token tree: shown for the token-tree method (More settings → draft method)")


def _appended(fig, rnd, tree, ys):
    """The token the target added after the accepted path: a star one step deeper."""
    if tree.get("appended", -1) < 0:
        return
    last = tree["path"][-1] if tree["path"] else -1
    x0 = 0 if last < 0 else tree["depth"][last]
    y0, y1 = ys[last + 1], ys[-1]
    resampled = bool(getattr(rnd, "resampled", False))
    colour = OUTCOME_COLOURS[Outcome.RESAMPLED if resampled else Outcome.BONUS]
    text = tree.get("appended_text") or str(tree["appended"])
    fig.add_scatter(x=[x0, x0 + 1], y=[y0, y1], mode="lines", hoverinfo="skip",
                    line=dict(color=colour, width=2, dash="dot"))
    kind = "resampled after a rejection" if resampled else "bonus (path fully accepted)"
    fig.add_scatter(x=[x0 + 1], y=[y1], mode="markers+text", text=[_show(text)],
                    textposition="bottom center", marker=dict(color=colour, size=17, symbol="star"),
                    hovertext=[f"appended by the target: {_show(text)}<br>{kind}"], hoverinfo="text")
