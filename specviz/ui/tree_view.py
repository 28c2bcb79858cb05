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
from .charts import FONT, _layout, empty
from .escape import esc

GREEN = OUTCOME_COLOURS[Outcome.ACCEPTED]
REJECTED_DIM = "rgba(213,94,0,0.6)"  # the rejected-token vermillion, dimmed
DIM = "rgba(140,140,140,0.45)"
# node labels beside their node, not above it: above, each label sat on the sibling one row up (rows
# 21 px apart at 8 nodes, headless Chromium 1440 px wide), 11 px mid-grey and hard to read (issue 71).
# In FONT, so the page's per-theme grey reaches them (ui/access.py: 6.3:1 on white)
LABEL = dict(size=14, color=FONT)
ROW_PX = 26  # the figure grows with its rows, so 14 px labels one row apart do not touch


def _show(text: str) -> str:
    """Visible whitespace, short labels, escaped (plotly reads a little HTML in text: "<b>" was bold)."""
    s = text.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·")
    return esc(s if len(s) <= 10 else s[:9] + "…")


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
        return REJECTED_DIM, 11, "tested, rejected"
    return DIM, 9, "not reached"


def _edges(xs, ys, pairs):
    """One line trace's coordinates for many edges (None breaks the line)."""
    x, y = [], []
    for a, b in pairs:
        x += [xs[a], xs[b], None]
        y += [ys[a], ys[b], None]
    return x, y


def round_traces(rnd) -> list[go.Scatter]:
    """The traces of one round's tree: edges, path, root, nodes, appended token."""
    tree = rnd.tree
    parents, depth = tree["parents"], tree["depth"]
    texts = tree.get("texts") or [str(t) for t in tree["tokens"]]
    last = tree["path"][-1] if tree["path"] else -1
    appended = tree.get("appended", -1) >= 0
    # the appended token gets its own row, as one more child of the path's end
    ys = tree_layout(parents + ([last] if appended else []))
    xs = [0] + list(depth) + ([(depth[last] if last >= 0 else 0) + 1] if appended else [])
    path, tested = set(tree["path"]), set(tree.get("tested", []))
    dim = _edges(xs, ys, [(par + 1, i + 1) for i, par in enumerate(parents) if i not in path])
    on = _edges(xs, ys, [(par + 1, i + 1) for i, par in enumerate(parents) if i in path])
    style = [_node_style(i, path, tested) for i in range(len(parents))]
    hover = [f"{_show(texts[i])}  (id {tree['tokens'][i]})<br>q = {tree['q'][i]:.3f}, "
             f"p = {tree['p'][i]:.3f}<br>depth {depth[i]}, {style[i][2]}" for i in range(len(parents))]
    out = [
        go.Scatter(x=dim[0], y=dim[1], mode="lines", hoverinfo="skip", line=dict(color=DIM, width=1.2)),
        go.Scatter(x=on[0], y=on[1], mode="lines", hoverinfo="skip", line=dict(color=GREEN, width=4)),
        go.Scatter(x=[0], y=[ys[0]], mode="markers+text", text=["root"], textposition="middle left",
                   marker=dict(color=FONT, size=12, symbol="square"), hovertext=["last committed token"],
                   hoverinfo="text"),
        go.Scatter(x=list(depth), y=ys[1:len(parents) + 1], mode="markers+text",
                   # the accepted path's labels bold, as its line is
                   text=[f"<b>{_show(t)}</b>" if i in path else _show(t) for i, t in enumerate(texts)],
                   textposition="middle right", hovertext=hover, hoverinfo="text", textfont=LABEL,
                   cliponaxis=False,  # edge labels were cut
                   marker=dict(color=[s[0] for s in style], size=[s[1] for s in style], line=dict(width=0))),
    ]
    if appended:
        out += _appended(rnd, tree, xs, ys, last)
    return out


def tree_figure(rnd, title: str | None = None) -> go.Figure:
    """Figure for one RoundEvent (or None); an explanatory empty figure when
    the round has no tree (chain methods)."""
    return rounds_figure([rnd] if rnd is not None and getattr(rnd, "tree", None) else [], title)


def rounds_figure(rounds: list, title: str | None = None, max_rounds: int = 40) -> go.Figure:
    """The trees of the last `max_rounds` rounds with a slider to pick one
    (client-side: plotly toggles which round's traces are visible); the latest
    round is shown first."""
    rounds = [r for r in rounds if getattr(r, "tree", None)][-max_rounds:]
    fig = go.Figure()
    _layout(fig, title or "Token tree", "depth (0 = last committed token)", "")
    fig.update_layout(height=380, hovermode="closest", showlegend=False, margin=dict(t=64))
    if not rounds:
        return empty(fig, "no token tree: pick the token-tree method")
    rows = max(max(tree_layout(r.tree["parents"])) + 2 for r in rounds)  # its leaves and the appended token
    fig.update_layout(height=max(380, min(1100, int(150 + ROW_PX * rows))))
    groups = [round_traces(r) for r in rounds]
    for k, traces in enumerate(groups):
        for tr in traces:
            tr.visible = k == len(groups) - 1
            fig.add_trace(tr)
    sizes = [len(g) for g in groups]
    steps = []
    for k, r in enumerate(rounds):
        vis = [j == k for j, n in enumerate(sizes) for _ in range(n)]
        steps.append(dict(method="update", label=str(r.index + 1),
                          args=[{"visible": vis}, {"title.text": _title(r, title)}]))
    fig.update_layout(title_text=_title(rounds[-1], title))
    if len(rounds) > 1:
        fig.update_layout(sliders=[dict(active=len(rounds) - 1, steps=steps, pad=dict(t=36), x=0.0, len=1.0,
                                        currentvalue=dict(prefix="round ", font=dict(size=11)),
                                        font=dict(size=9))], margin=dict(t=64, b=70))
    deepest = max(max(r.tree["depth"], default=0) for r in rounds)
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_xaxes(dtick=1, range=[-0.6, deepest + 1.6])
    return fig


def _title(r, title):
    tr = r.tree
    what = f"{len(tr['path'])} of {len(tr['tokens'])} drafted nodes accepted"
    # the labels are the nodes' tokens ("6", "8" read as bare numbers): say so, and where p and q are
    return (f"{title or 'Token tree'}, round {r.index + 1}: {what}"
            "<br><sup>each node is labelled with its token (· a space, ⏎ a new line); "
            "hover it for q and p</sup>")


def latest_tree_figure(view) -> go.Figure:
    """The trees of the run, latest round first (the page redraws it as rounds stream)."""
    rounds = [r for r in view.spec.rounds if getattr(r, "tree", None)]
    if rounds:
        return rounds_figure(rounds)
    fig = rounds_figure([])
    fig.update_layout(height=150)
    fig.layout.annotations = ()  # one caption, not rounds_figure's under this one
    waiting = getattr(view, "method", "") == "tree" and not view.spec.rounds
    # two lines: a phone clipped it as one
    return empty(fig, "waiting for the first round…" if waiting else
                  "token tree: shown for the token-tree method<br>(More settings → draft method)")


def _appended(rnd, tree, xs, ys, last) -> list[go.Scatter]:
    """The token the target added after the accepted path: a star one step deeper."""
    x0, y0, x1, y1 = xs[last + 1], ys[last + 1], xs[-1], ys[-1]
    resampled = bool(getattr(rnd, "resampled", False))
    colour = OUTCOME_COLOURS[Outcome.RESAMPLED if resampled else Outcome.BONUS]
    text = tree.get("appended_text") or str(tree["appended"])
    kind = "resampled after a rejection" if resampled else "bonus (path fully accepted)"
    return [
        go.Scatter(x=[x0, x1], y=[y0, y1], mode="lines", hoverinfo="skip",
                   line=dict(color=colour, width=2, dash="dot")),
        go.Scatter(x=[x1], y=[y1], mode="markers+text", text=[_show(text)], textposition="middle right",
                   textfont=LABEL, cliponaxis=False, marker=dict(color=colour, size=17, symbol="star"),
                   hovertext=[f"appended by the target: {_show(text)}<br>{kind}"], hoverinfo="text"),
    ]
