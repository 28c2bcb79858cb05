"""The p/q inspector: click a token of the speculative pane and see what modified
rejection sampling did at that position.

Shows the top-k of the target's p and the draft's q as paired bars (the rest of
the vocabulary as one bar), the drawn u against min(1, p(x)/q(x)) and, for a
rejection, the residual norm(max(0, p - q)) the resampled token was drawn from.
Built only from RoundEvent.dists / .residual (engine/topk_view.py), so it works
the same live and in replay.

Click path: token spans carry data-r (round index) and data-i (row: the drafted
position, or the position after the accepted drafts for an appended token); the
pane's js_on_load (PANE_JS) sends them with its click event, and the server
answers from this session's latest run (LATEST).
"""
from __future__ import annotations

from collections import OrderedDict

import gradio as gr  # module level: the handler's gr.EventData / gr.Request annotations must resolve
import plotly.graph_objects as go

from ..engine.events import RoundEvent
from ..format import number
from ..machine import Lock
from .access import PANE_KEYS_JS
from .charts import BLUE, ORANGE, PURPLE, _layout, empty
from .draft_source import SOURCE_JS
from .render import esc

REST = "rest of the vocabulary"


class Latest:
    """Each browser session's latest rounds (live: the growing list; replay: the trace's)."""

    def __init__(self, keep: int = 64):
        self._lock = Lock()
        self._rounds: OrderedDict[str, list[RoundEvent]] = OrderedDict()
        self.keep = keep

    def put(self, key: str, rounds: list[RoundEvent]) -> None:
        with self._lock:
            self._rounds[key] = rounds
            self._rounds.move_to_end(key)
            while len(self._rounds) > self.keep:
                self._rounds.popitem(last=False)

    def get(self, key: str) -> list[RoundEvent] | None:
        with self._lock:
            return self._rounds.get(key)


LATEST = Latest()


def put_trace(key: str, tr) -> None:
    """A replay: its speculative rounds are all known up front."""
    LATEST.put(key, [e for s, e in tr.events if s == "speculative" and isinstance(e, RoundEvent)])


def parse(sel: str) -> tuple[int, int, str] | None:
    """"r:i[:outcome]" from the page; None when malformed (never trust it)."""
    parts = str(sel or "").split(":")
    try:
        r, i = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None
    return (r, i, parts[2] if len(parts) > 2 else "") if r >= 0 and i >= 0 else None


def find(rounds: list[RoundEvent], r: int, i: int, outcome: str = ""):
    """The round, the clicked row and the token clicked there (None if absent)."""
    rnd = next((x for x in rounds if x.index == r), None) if rounds else None
    if rnd is None or i > len(rnd.draft_ids):  # rows 0..γ
        return None
    toks = [t for t in rnd.tokens if (t.position - 1 if t.position > 0 else rnd.n_accepted) == i]
    # the appended token shares its row with the rejected draft: the outcome tells them apart
    picked = [t for t in toks if t.outcome.value == outcome] or toks[-1:]
    return rnd, i, (picked[0] if picked else None)


def _rows(rnd: RoundEvent, i: int):
    row = rnd.dists[i] if i < len(rnd.dists) else None
    res = rnd.residual if (rnd.residual and rnd.residual.get("pos") == i) else None
    return row, res


def _label(text: str, tid: int) -> str:
    shown = repr(str(text))[1:-1]
    shown = shown if len(shown) <= 14 else shown[:13] + "…"
    return esc(f"{shown} #{tid}")  # plotly reads a little HTML in labels: escape it


def missing(rnd: RoundEvent) -> str:
    """Why a round has no top-k distributions to show."""
    if rnd.tree:  # the tree engine keeps each node's p(x) and q(x), shown in the token-tree view
        return "a token-tree round: each node's p and q are in the token-tree view below"
    return "this run was recorded before the inspector kept the distributions"


def figure(rnd: RoundEvent, i: int) -> go.Figure:
    """Paired bars of p and q (and the residual at a rejection) over the kept ids + one rest bar."""
    fig = go.Figure()
    row, res = _rows(rnd, i)
    what = "raw softmax p and q (greedy)" if (row or {}).get("raw") else "target p, draft q"
    _layout(fig, f"Round {rnd.index + 1}, position {i + 1}: {what}", "token", "probability")
    if row is None:
        return empty(fig, missing(rnd))
    ids = list(row["ids"]) + [x for x in (res or {}).get("ids", []) if x not in row["ids"]]
    texts = dict(zip(row["ids"], row.get("t") or map(str, row["ids"]), strict=False))
    if res:
        texts.update(zip(res["ids"], res.get("t") or map(str, res["ids"]), strict=False))
    marks = {}
    if i < len(rnd.draft_ids):
        marks[rnd.draft_ids[i]] = "drafted"
    if i == rnd.n_accepted and rnd.appended_id >= 0:
        # greedy (raw softmax rows): nothing is resampled, the target's argmax is taken (issue 71)
        what = ("target's pick (greedy)" if row.get("raw") else "resampled") if rnd.resampled else "bonus"
        marks[rnd.appended_id] = f"{marks[rnd.appended_id]} {what}" if rnd.appended_id in marks else what
    labels = [_label(texts[x], x) + (f" ▲{marks[x]}" if x in marks else "") for x in ids] + [REST]

    def series(src_ids, vals):
        m = dict(zip(src_ids, vals, strict=True))
        ys = [m.get(x) for x in ids]
        return ys + [max(0.0, 1.0 - sum(vals))]

    fig.add_bar(x=labels, y=series(row["ids"], row["p"]), name="p (target)", marker_color=BLUE,
                hovertemplate="p = %{y:.4f}<extra>%{x}</extra>")
    if "q" in row:
        fig.add_bar(x=labels, y=series(row["ids"], row["q"]), name="q (draft)", marker_color=ORANGE,
                    hovertemplate="q = %{y:.4f}<extra>%{x}</extra>")
    if res:
        fig.add_bar(x=labels, y=series(res["ids"], res["r"]), name="residual norm(max(0, p − q))",
                    marker_color=PURPLE, hovertemplate="residual = %{y:.4f}<extra>%{x}</extra>")
    fig.update_layout(barmode="group", height=340, legend=dict(orientation="h", y=1.02, yanchor="bottom"),
                      margin=dict(l=52, r=20, t=70, b=100))
    fig.update_xaxes(tickangle=-40)
    return fig


def _gauge(u: float | None, ratio: float | None) -> str:
    """u drawn on [0, 1] against the accept region [0, min(1, p/q))."""
    if ratio is None:
        return ""
    mark = "" if u is None else f"<span class='sv-insp-u' style='left:{100 * u:.1f}%' title='u'></span>"
    return (f"<div class='sv-insp-gauge' role='img' aria-label='u against min(1, p/q)'>"
            f"<span class='sv-insp-accept' style='width:{100 * ratio:.1f}%'></span>{mark}</div>"
            "<div class='sv-insp-scale'><span>0</span><span>accept if u &lt; min(1, p/q)</span>"
            "<span>1</span></div>")


def panel_html(rnd: RoundEvent, i: int, tok) -> str:
    """The verdict at the clicked position, in numbers and words."""
    row, res = _rows(rnd, i)
    head = f"<b>Round {rnd.index + 1}, position {i + 1}</b>"
    if tok is not None:
        kind = tok.outcome.value
        if kind == "resampled" and any((d or {}).get("raw") for d in rnd.dists):  # greedy: nothing drawn
            kind = "the target's pick (greedy)"
        head += f" · clicked <code>{esc(repr(tok.text))}</code> ({esc(kind)})"
    lines = [head]
    if i < len(rnd.draft_ids) and (row or {}).get("raw"):
        lines.append(_greedy_line(rnd, i, row))
    elif i < len(rnd.draft_ids):
        x = rnd.draft_ids[i]
        p, q = rnd.p[i], rnd.q[i]
        u = rnd.u[i] if i < len(rnd.u) else None
        ratio = min(1.0, p / q) if q else 0.0
        tested = i <= rnd.n_accepted
        verdict = ("not tested: an earlier draft was rejected" if not tested else
                   "accepted (u < min(1, p/q))" if i < rnd.n_accepted else "rejected (u ≥ min(1, p/q))")
        lines.append(f"drafted token #{x}: p(x) = {number(p, '{:.4f}')}, q(x) = {number(q, '{:.4f}')}, "
                     f"min(1, p/q) = <b>{number(ratio, '{:.4f}')}</b>, u = <b>{number(u, '{:.4f}')}</b>: "
                     f"{verdict}")
        lines.append(_gauge(u if tested else None, ratio))
    if i == rnd.n_accepted and rnd.appended_id >= 0:
        if any((d or {}).get("raw") for d in rnd.dists):  # greedy: nothing is drawn
            how = ("the target's top token: at temperature 0 the residual norm(max(0, p − q)) of two "
                   "one-hot laws is one-hot on it" if rnd.resampled else
                   "the target's top token: every draft was accepted, the target adds one more")
        else:
            how = ("drawn from the residual norm(max(0, p − q)): only where the target wants more than "
                   "the draft offered" if rnd.resampled else
                   "drawn from p: every draft was accepted, the target adds one more")
        lines.append(f"appended token #{rnd.appended_id}: {how}")
    if row is None:
        lines.append(f"<i>No top-k distributions: {missing(rnd)}.</i>")
    elif res is None and i < len(rnd.draft_ids) and i == rnd.n_accepted and not row.get("raw"):
        lines.append("<i>No residual here.</i>")
    return "<div class='sv-insp'>" + "<br>".join(x for x in lines if x) + "</div>"


def _greedy_line(rnd: RoundEvent, i: int, row: dict) -> str:
    """Greedy: the test is deterministic (kept iff the draft's token is the target's top token);
    p and q shown are the models' raw softmax, so the bars say why the draft guessed as it did."""
    x = rnd.draft_ids[i]
    probs = dict(zip(row["ids"], row["p"], strict=False))
    qs = dict(zip(row["ids"], row.get("q") or [], strict=False))
    verdict = ("not tested: an earlier draft was rejected" if i > rnd.n_accepted else
               "accepted: it is the target's top token" if i < rnd.n_accepted else
               "rejected: the target's top token is another")
    return (f"drafted token #{x}: greedy, so no random u: {verdict}. Raw softmax at this position: "
            f"p(x) = {number(probs.get(x), '{:.4f}')}, q(x) = {number(qs.get(x), '{:.4f}')} "
            "(at temperature 0 both laws are one-hot: every bar would be 0 or 1).")


def empty_html() -> str:
    return ("<div class='sv-insp sv-placeholder'>Click any token in the speculative pane (accepted, "
            "rejected, resampled or bonus) to see p, q and the accept test at its position.</div>")


def cleared():
    """The panel as before any click (a new run or replay started)."""
    return empty_html(), gr.Plot(value=None, visible=False)


def select(sel: str, rounds: list[RoundEvent] | None):
    """(panel html, figure or None) for a click."""
    where = parse(sel)
    found = find(rounds or [], *where) if where else None
    if found is None:
        return empty_html(), None
    rnd, i, tok = found
    return panel_html(rnd, i, tok), figure(rnd, i)


# js_on_load of the speculative pane (a gr.HTML): one delegated listener on the pane,
# which survives the pane's content being replaced as the run streams
PANE_JS = """
element.addEventListener('click', (e) => {
  const t = e.target.closest('.sv-tok[data-r]');
  if (!t) return;
  element.querySelectorAll('.sv-picked').forEach(x => x.classList.remove('sv-picked'));
  t.classList.add('sv-picked');
  trigger('click', {r: Number(t.dataset.r), i: Number(t.dataset.i), o: String(t.dataset.o || '')});
});
""" + SOURCE_JS + PANE_KEYS_JS  # a copied draft's source on hover (ui/draft_source.py); keys (ui/access.py)


def build() -> dict:
    """The inspector's components (call inside the live tab)."""
    ui = {}
    with gr.Accordion("p/q inspector: click a token", open=True, elem_id="sv-inspector"):
        ui["html"] = gr.HTML(empty_html(), elem_id="sv-insp-html")
        ui["plot"] = gr.Plot(None, show_label=False, elem_id="sv-insp-plot", visible=False)
    return ui


def wire(pane, ui: dict, session_key) -> None:
    """Clicks on `pane` (the speculative gr.HTML, built with js_on_load=PANE_JS) open the panel."""

    def on_click(evt: gr.EventData, request: gr.Request = None):
        data = getattr(evt, "_data", None) or {}
        sel = f"{data.get('r')}:{data.get('i')}:{data.get('o')}" if isinstance(data, dict) else ""
        html, fig = select(sel, LATEST.get(session_key(request)))
        return html, (gr.Plot(fig, visible=True) if fig is not None else gr.Plot(visible=False))

    # queued: a non-queued call may come without the session hash that finds this visitor's run
    pane.click(on_click, None, [ui["html"], ui["plot"]], api_visibility="private", show_progress="hidden",
               concurrency_limit=4, concurrency_id="inspector")
