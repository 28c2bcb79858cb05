"""The bench's two charts, made once with plotly: plots.html (self-contained)
and PNG/SVG copies exported by kaleido with the system's Chromium."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..ui.charts import PALETTE

BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # kaleido 1.x drives an installed browser
SIZE = {"width": 680, "height": 420}
LINES = (("measured", "speedup", "solid"), ("measured, decode", "decode_speedup", "dot"),
         ("predicted", "predicted", "dash"))  # name, row key, dash of the speedup-vs-γ lines


def _plot_data(rows: list[dict]):
    tasks = [t for t in dict.fromkeys(r["task"] for r in rows) if t != "all"]
    sweep = {t: sorted((r for r in rows if r["task"] == t and r["family"] == "draft" and r["gamma"]),
                       key=lambda r: r["gamma"]) for t in tasks}
    alpha_rows = [r for r in rows
                  if r["task"] in tasks and r["engine"] == "specviz" and r["alpha"] is not None]
    return tasks, sweep, alpha_rows


def speedup_figure(rows: list[dict], title_suffix: str = ""):
    """Measured (all tokens and decode only) and predicted speedup vs γ of the draft sweep, per task."""
    import plotly.graph_objects as go
    tasks, sweep, _ = _plot_data(rows)
    fig = go.Figure()
    for i, task in enumerate(tasks):
        rs = sweep[task]
        if not rs:
            continue
        colour = PALETTE[i % len(PALETTE)]
        xs = [r["gamma"] for r in rs]
        for name, key, dash in LINES:
            fig.add_scatter(x=xs, y=[r[key] for r in rs], name=f"{task} {name}", mode="lines+markers",
                            line=dict(color=colour, dash=dash))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.update_layout(title=f"Speedup vs γ (draft model){title_suffix}",
                      xaxis_title="γ (draft tokens per round)",
                      yaxis_title="speedup vs plain (tokens/s ratio of medians)", yaxis_rangemode="tozero",
                      template="plotly_white")
    return fig


def alpha_figure(rows: list[dict], title_suffix: str = ""):
    """Acceptance rate α of every SpecViz method, grouped by task."""
    import plotly.graph_objects as go
    tasks, _, alpha_rows = _plot_data(rows)
    names = list(dict.fromkeys(r["label"].replace("SpecViz ", "") for r in alpha_rows))
    alpha = {(r["task"], r["label"].replace("SpecViz ", "")): r["alpha"] for r in alpha_rows}
    fig = go.Figure()
    for i, name in enumerate(names):
        fig.add_bar(x=tasks, y=[alpha.get((t, name)) for t in tasks], name=name,
                    marker_color=PALETTE[i % len(PALETTE)])
    fig.update_layout(title=f"Acceptance rate α by task{title_suffix}", yaxis_title="α (accepted / drafted)",
                      yaxis_range=[0, 1], barmode="group", template="plotly_white")
    return fig


def browser_path() -> str | None:
    """The browser kaleido should drive: $BROWSER_PATH, else the system's Chromium."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def export_images(figures: dict[str, object], out: Path) -> list[str]:
    """name.svg and name.png for every figure, in one browser session; returns notes."""
    try:
        import kaleido
    except ImportError:
        return ["kaleido not installed: PNG/SVG plots skipped (plots.html written)"]
    browser = browser_path()
    if browser is None:
        return ["no Chromium found for kaleido: PNG/SVG plots skipped (plots.html written)"]
    jobs = [{"fig": fig, "path": str(out / f"{name}.{fmt}"), "opts": {"format": fmt, **SIZE}}
            for name, fig in figures.items() for fmt in ("svg", "png")]
    try:
        kaleido.write_fig_from_object_sync(jobs, kopts={"path": browser})
    except Exception as e:  # noqa: BLE001 - a missing chart must not lose the measurements
        return [f"PNG/SVG export failed ({type(e).__name__}: {e}); plots.html written"]
    return []


def write_plots(out: Path, rows: list[dict], title_suffix: str = "") -> list[str]:
    """plots.html, speedup_vs_gamma.svg/.png and alpha_by_task.svg/.png; returns notes."""
    import plotly.io as pio
    figures = {"speedup_vs_gamma": speedup_figure(rows, title_suffix),
               "alpha_by_task": alpha_figure(rows, title_suffix)}
    body = "".join(pio.to_html(fig, include_plotlyjs=i == 0, full_html=False)
                   for i, fig in enumerate(figures.values()))
    (out / "plots.html").write_text("<!doctype html><html><head><meta charset='utf-8'>"
                                    f"<title>SpecViz bench</title></head><body>{body}</body></html>")
    return export_images(figures, out)
