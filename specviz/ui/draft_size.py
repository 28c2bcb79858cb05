"""The "Draft size" tab: the committed result of the draft-size analysis
(docs/draft_size.json, made by `python -m specviz draft-size`), shown as
a heatmap and lines. Static: nothing is measured on the page."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

RESULT = Path(__file__).resolve().parents[2] / "docs" / "draft_size.json"


def load_result(path: Path = RESULT) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def public(command: str) -> str:
    """A command as visitors see it: no folder of the machine it ran on (/work/x/out.json -> out.json)."""
    return re.sub(r"(?<![\w.])(?:~|/)[^\s/]*(?:/[^\s/]+)*/(?=[^\s/]+)", "", command)


def intro_html(data: dict) -> str:
    cmds = "".join(f"<li><code>{html.escape(public(i['command']))}</code> ({html.escape(i['date'])}, "
                   f"load {html.escape(str(i['load_before']))} → {html.escape(str(i['load_after']))})</li>"
                   for i in data.get("invocations", []))
    return ("<p>How acceptance α and speedup change with γ and with the draft's cost: the target's own "
            "first L layers (early exit), the target minus skipped layers, a separate draft model, and "
            "model-free drafts. Measured on "
            f"{html.escape(str(data.get('pair', '')))} ({html.escape(str(data.get('precision', '')))}), "
            f"{html.escape(str(data.get('machine', '')))}, {data.get('prompts')} prompts × "
            f"{data.get('max_new_tokens')} new tokens, greedy. ★ = measured best γ, ○ = the "
            "verify-cost-aware theory's best γ. The CPU was shared with other jobs: load averages below."
            f"</p><ul>{cmds}</ul>")


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

    from .draft_size_plot import heatmap, lines, table_md
    data = load_result(path)
    with gr.Tab("Draft size", id="draft-size", elem_id="sv-tab-draft-size"):
        if not data or not data.get("sizes"):
            gr.Markdown("No draft-size result committed yet: run `python -m specviz draft-size "
                        "--out docs/draft_size.json`.")
            return
        gr.HTML(intro_html(data))
        gr.Plot(on_page(heatmap(data)), show_label=False, elem_id="sv-ds-heatmap")
        gr.Plot(on_page(lines(data)), show_label=False, elem_id="sv-ds-lines")
        gr.Markdown(table_md(data))
