"""The "Draft size" tab: the committed result of the draft-size analysis
(docs/draft_size.json, made by `python -m specviz draft-size`), shown as
a heatmap and lines. Static: nothing is measured on the page."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

from .glossary import draft_weights, plain_weights

RESULT = Path(__file__).resolve().parents[2] / "docs" / "draft_size.json"


def load_result(path: Path = RESULT) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def public(command: str) -> str:
    """A command as visitors see it: no folder of the machine it ran on (/work/x/out.json -> out.json)."""
    return re.sub(r"(?<![\w.])(?:~|/)[^\s/]*(?:/[^\s/]+)*/(?=[^\s/]+)", "", command)


# what each row's drafter is, in the intro's words (a row of another method: its registered label)
KINDS = {"early-exit": "the target's own first L layers (early exit)",
         "layer-skip": "the target minus skipped layers (layer skip)", "draft": "a separate draft model",
         "lookup": "prompt lookup (model-free)", "rest": "retrieval from a datastore (REST, model-free)",
         "staged": "staged: prompt lookup, then the draft model"}


def _kind(size: dict) -> str:
    from ..engine.proposers import REGISTRY
    method = size.get("method")
    return KINDS.get(method) or (REGISTRY[method].label if method in REGISTRY else str(method))


def shown(data: dict) -> dict:
    """The result with each separate-draft row labelled by the precision the file records for the pair's
    draft (issue 71: the row said "draft model int8" under a header saying the draft was int4 g32; the
    bench's int8 step converts plain Linear layers only, and that draft's were 4-bit already), so the
    heatmap, lines, table and intro name what ran. Other rows as they are."""
    from ..engine.proposers import REGISTRY
    words = draft_weights(str(data.get("precision") or ""))

    def label(s: dict) -> str:
        method = s.get("method")
        if method == "draft" and words:
            return f"draft model, {words}"
        if s.get("label") == method and method in REGISTRY:  # a method's id: its label (issue 71)
            return REGISTRY[method].label
        return s.get("label", "")
    return dict(data, sizes=[dict(s, label=label(s)) for s in data.get("sizes", [])])


def int8_note(data: dict) -> str:
    """Why the command's `draft-int8` row is not int8, where the file says the draft was not 8-bit."""
    words = draft_weights(str(data.get("precision") or ""))
    named = any(str(s.get("name", "")).endswith("int8") for s in data.get("sizes", []))
    if not named or not words or words.startswith("8-bit"):
        return ""
    return (f"<p><small>The command's <code>draft-int8</code> size ran the pair's own draft, {words}: its "
            "int8 step converts plain Linear layers only, and this draft had none left. The row is named "
            "by what ran (docs/draft_size.md).</small></p>")


def intro_html(data: dict) -> str:
    """What the rows are (named from the rows themselves, issue 51: the intro promised early-exit
    and layer-skip rows the table did not have), and, first and large, the pair it measured."""
    esc = html.escape
    cmds = "".join(f"<li><code>{esc(public(i['command']))}</code> ({esc(i['date'])}, "
                   f"load {esc(str(i['load_before']))} → {esc(str(i['load_after']))})</li>"
                   for i in data.get("invocations", []))
    rows = "".join(f"<li><b>{esc(str(s.get('label', '')))}</b>: {esc(_kind(s))}</li>"
                   for s in data.get("sizes", []))
    dates = sorted({str(i.get("date", ""))[:10] for i in data.get("invocations", []) if i.get("date")})
    words = plain_weights(str(data.get("precision") or ""))
    measured = (f"<div class='sv-ds-measured' role='note'><b>Measured on:</b> "
                f"{esc(str(data.get('pair', '')))}, " + (f"<b>{esc(words)}</b> " if words else "")
                + f"({esc(str(data.get('precision', '')))}), on "
                f"<b>{esc(str(data.get('machine') or 'another machine'))}</b>"
                + (f", {esc(', '.join(dates))}" if dates else ", date not recorded") + ". Not measured on "
                "this page: that machine's timings and precision, not this one's, and not necessarily the "
                "pair the live tab runs (its status line names that one).</div>")
    return (measured + "<p>How acceptance (accepted ÷ drafted) and speedup change with γ and with where "
            "the drafts come from. "
            f"The rows:</p><ul>{rows}</ul><p>{data.get('prompts')} prompts × {data.get('max_new_tokens')} "
            "new tokens, greedy. ★ = measured best γ, ○ = the verify-cost-aware theory's best γ. The CPU was "
            f"shared with other jobs: load averages below.</p><ul>{cmds}</ul>" + int8_note(data))


def on_page(fig):
    """A figure drawn for the docs' PNG (fixed width, white) as the page's charts are: the box's
    width, transparent, grey text and grid (it filled 60 % of its box, white in dark mode)."""
    from .charts import FONT, GRID
    fig.update_layout(width=None, autosize=True, template="plotly", paper_bgcolor="rgba(0,0,0,0)",
                      plot_bgcolor="rgba(0,0,0,0)", font=dict(color=FONT))
    fig.update_xaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, zerolinecolor=GRID, linecolor=GRID)
    return fig


def build_tab(path: Path = RESULT):
    """The tab's layout (call inside a gr.Blocks)."""
    import gradio as gr

    from .draft_size_plot import CELL, heatmap, lines, table_md
    data = load_result(path)
    with gr.Tab("Draft size", id="draft-size", elem_id="sv-tab-draft-size"):
        if not data or not data.get("sizes"):
            gr.Markdown("No draft-size result committed yet: run `python -m specviz draft-size "
                        "--out docs/draft_size.json`.")
            return
        data = shown(data)
        gr.HTML(intro_html(data), elem_id="sv-ds-intro")
        gr.Plot(on_page(heatmap(data)), show_label=False, elem_id="sv-ds-heatmap")
        gr.Plot(on_page(lines(data)), show_label=False, elem_id="sv-ds-lines")
        gr.Markdown(f"<small>{CELL}; α̂: the expected acceptance, pooled over γ</small>\n\n{table_md(data)}")
