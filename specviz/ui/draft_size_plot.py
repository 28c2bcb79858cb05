"""Figures of the draft-size analysis (plotly only, no gradio): a heatmap of
measured speedup over draft size × γ, and speedup-vs-γ lines with the theory
dashed; both mark the measured optimum (★) and the theory's optimum (○). Acceptance goes by the
live tab's names: accepted ÷ drafted per cell, α̂ (expected acceptance) pooled per size (issue 59:
the cells said "α 0.80" beside an "α̂" column)."""
from __future__ import annotations

from .charts import PALETTE


def _cell(s: dict, r: dict) -> str:
    marks = ("★" if r["gamma"] == s["measured_best"] else "") \
        + ("○" if r["gamma"] == s["theory_best"] else "")
    alpha = "n/a" if r["alpha"] is None else f"{r['alpha']:.2f}"
    return f"{r['speedup']:.2f}× {marks}<br>{alpha}"


# what a cell holds, said once beside the table and in the heatmap's title
CELL = "each γ cell: measured speedup vs plain, then accepted ÷ drafted"


def _grid(data: dict):
    gammas = data["gammas"]
    z, text = [], []
    for s in data["sizes"]:
        by_g = {r["gamma"]: r for r in s["rows"]}
        z.append([by_g[g]["speedup"] if g in by_g else None for g in gammas])
        text.append([_cell(s, by_g[g]) if g in by_g else "" for g in gammas])
    return gammas, [s["label"] for s in data["sizes"]], z, text


def heatmap(data: dict):
    import plotly.graph_objects as go
    gammas, labels, z, text = _grid(data)
    fig = go.Figure(go.Heatmap(x=[str(g) for g in gammas], y=labels, z=z, text=text,
                               texttemplate="%{text}", colorscale="RdBu", zmid=1.0,
                               colorbar=dict(title="speedup")))
    fig.update_layout(title="Measured speedup vs plain by draft size and γ, then accepted ÷ drafted<br>"
                            "<sup>★ measured best, ○ theory best</sup>",
                      xaxis_title="γ (draft tokens per round)", template="plotly_white",
                      height=140 + 40 * len(labels), width=820, yaxis_autorange="reversed",
                      margin=dict(l=170))
    return fig


def lines(data: dict):
    import plotly.graph_objects as go
    fig = go.Figure()
    for i, s in enumerate(data["sizes"]):
        colour = PALETTE[i % len(PALETTE)]
        xs = [r["gamma"] for r in s["rows"]]
        fig.add_scatter(x=xs, y=[r["speedup"] for r in s["rows"]], name=s["label"], mode="lines+markers",
                        line=dict(color=colour), legendgroup=s["name"])
        fig.add_scatter(x=xs, y=[r["theory"] for r in s["rows"]], name=f"{s['label']} theory",
                        mode="lines", line=dict(color=colour, dash="dash"), legendgroup=s["name"],
                        showlegend=False)
        best = next(r for r in s["rows"] if r["gamma"] == s["measured_best"])
        theo = next(r for r in s["rows"] if r["gamma"] == s["theory_best"])
        fig.add_scatter(x=[best["gamma"]], y=[best["speedup"]], mode="markers", showlegend=False,
                        marker=dict(symbol="star", size=14, color=colour), legendgroup=s["name"])
        fig.add_scatter(x=[theo["gamma"]], y=[theo["theory"]], mode="markers", showlegend=False,
                        marker=dict(symbol="circle-open", size=14, color=colour, line=dict(width=2)),
                        legendgroup=s["name"])
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.update_layout(title="Speedup vs γ per draft size (solid measured, dashed theory)",
                      xaxis_title="γ", yaxis_title="speedup vs plain", yaxis_rangemode="tozero",
                      xaxis_tickvals=data["gammas"],  # the γ measured (whole numbers), not 2.5
                      template="plotly_white", width=760, height=460)
    return fig


def table_md(data: dict) -> str:
    """Markdown table: one row per size, speedup and accepted ÷ drafted per γ (CELL), pooled α̂ and c,
    both optima."""
    head = ("| draft | " + " | ".join(f"γ={g}" for g in data["gammas"])
            + " | α̂ | c | best γ measured / theory |")
    lines_ = [head, "|" + "---|" * (len(data["gammas"]) + 4)]
    for s in data["sizes"]:
        by_g = {r["gamma"]: r for r in s["rows"]}
        cells = [_cell(s, by_g[g]).replace("<br>", " · ") if g in by_g else ""
                 for g in data["gammas"]]
        tail = f" | {s['alpha_hat']:.2f} | {s['c']:.2f} | {s['measured_best']} / {s['theory_best']} |"
        lines_.append(f"| {s['label']} | " + " | ".join(cells) + tail)
    return "\n".join(lines_)


def best_md(data: dict, ref: str = "draft-int8") -> str:
    """Per size at its measured best γ: accepted ÷ drafted, τ, c, tokens/s, speedup vs plain and vs `ref`."""
    best = {s["name"]: next(r for r in s["rows"] if r["gamma"] == s["measured_best"]) for s in data["sizes"]}
    ref_tps = best[ref]["tps"] if ref in best else None
    out = ["| draft | best γ | accepted ÷ drafted | τ | c | tokens/s | vs plain | vs " + ref + " |",
           "|---|---|---|---|---|---|---|---|"]
    for s in data["sizes"]:
        r = best[s["name"]]
        f = lambda v, fmt="{:.2f}": "n/a" if v is None else fmt.format(v)  # noqa: E731
        vs = f(r["tps"] / ref_tps, "{:.2f}×") if ref_tps else "n/a"
        out.append(f"| {s['label']} | {r['gamma']} | {f(r['alpha'])} | {f(r['tau'])} | {f(r['c'])} | "
                   f"{f(r['tps'])} | {f(r['speedup'], '{:.2f}×')} | {vs} |")
    return "\n".join(out)
