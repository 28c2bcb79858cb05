"""Theory explorer: the Leviathan et al. (2023) analysis as curves, with the
visitor's own measured run placed on them.

E[tokens per round] = (1 - α^{γ+1}) / (1 - α)   (one target pass per round)
predicted speedup   = E / (γc + 1)             (γ draft steps cost γc target steps)

The figure functions are pure (numbers in, plotly figure out) and unit-tested;
`build_tab()` lays out the gradio tab. Every theory number comes from
specviz.engine.metrics, every measured number from a run's events (RunView.stats).
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from ..engine.theory import MAX_GAMMA, best_gamma, expected_tokens, speedup, v_at
from ..format import number
from .charts import BLUE, FONT, GREEN, GRID, ORANGE, VERMILLION, _layout
from .draft_source import FREE_DRAFTS
from .render import esc

ALPHA_END = 0.99  # the page's α slider and curves stop here (theory.ALPHA_MAX clamps auto γ)
ALPHAS = [round(i / 100, 2) for i in range(0, 100)]  # 0.00 … 0.99
GAMMAS = list(range(1, MAX_GAMMA + 1))
DEFAULTS = dict(alpha=0.7, gamma=4, c=0.2)
HOLLOW = dict(size=12, color="rgba(0,0,0,0)", line=dict(color=BLUE, width=2.5))  # the measured point
STAR = dict(symbol="star", size=16, color=ORANGE, line=dict(color=FONT, width=1))  # the best γ


@dataclass
class Measured:
    """Where a run sits on the theory: its α̂, c, requested γ, measured speedup."""

    alpha_hat: float
    c: float
    gamma: int
    speedup: float | None  # measured tokens/s ratio (None: no baseline)
    predicted: float | None  # Leviathan at (α̂, γ, c)
    tau: float | None = None
    verify_cost: float | None = None
    method: str = "draft"
    source: str = "your last run"  # or "replay: <label>"
    v_curve: list | None = None  # v(k), k = 0..16, in plain steps (metrics.verify_curve)
    v_basis: str = ""
    gamma_mean: float | None = None  # tokens drafted per round: the γ `predicted` was computed at

    @classmethod
    def from_stats(cls, stats: dict, gamma: int, method: str = "draft", source: str = "your last run"):
        """From RunView.stats(); None if the run has no α̂ or c yet."""
        a, c = stats.get("alpha_hat"), stats.get("c")
        if a is None or c is None:
            return None
        return cls(float(a), float(c), int(gamma), stats.get("speedup"), stats.get("predicted"),
                   stats.get("tau"), stats.get("verify_cost"), method, source, stats.get("v_curve"),
                   stats.get("v_basis") or "", stats.get("gamma_mean"))

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict | None):
        return cls(**d) if d else None


def _clamp(alpha: float, gamma: int, c: float) -> tuple[float, int, float]:
    alpha = min(max(float(alpha or 0.0), 0.0), ALPHA_END)
    gamma = min(max(int(round(float(gamma or 1))), 1), MAX_GAMMA)
    c = min(max(float(c or 0.0), 0.0), 1.0)
    return alpha, gamma, c


V_MODES = ["v = 1 (Leviathan)", "measured v curve"]


def speed(alpha: float, gamma: int, c: float, curve=None) -> float:
    """Predicted speedup with v(γ) from `curve` (measured), or v = 1 without one."""
    return speedup(alpha, gamma, c, v_at(curve, gamma) if curve else 1.0)


def break_even_alpha(gamma: int, c: float, curve=None) -> float | None:
    """Smallest α (on a 0.001 grid) where the predicted speedup reaches 1×."""
    if c == 0 and not curve:
        return 0.0
    for i in range(0, 1000):
        a = i / 1000
        if speed(a, gamma, c, curve) >= 1.0:
            return a
    return None


# E[tokens per round] is the speedup a round would give if drafting cost nothing (speedup = E / (v + γc)):
# one scale for both, so the gap between the two lines is what the round's cost takes. On an axis of its
# own, autoscaled from zero, the E line lay exactly under the speedup line over α, where the two are
# proportional (issue 71), and on the γ chart at c = 0 the equal curves were drawn apart.
TOKENS_NAME = "E[tokens per round]"


def _same_line_note(fig: go.Figure, c: float, curve) -> None:
    """At c = 0 and v = 1 the speedup is E itself: the two lines are one, and the chart says so."""
    if c == 0 and not curve:
        fig.add_annotation(text="c = 0: the speedup equals E[tokens per round] (one line)", showarrow=False,
                           xref="paper", yref="paper", x=0.01, y=0.99, xanchor="left", yanchor="top",
                           font=dict(color=FONT, size=11))


def _style(fig: go.Figure, left: str, right: str) -> go.Figure:
    fig.update_layout(
        height=350, hovermode="x unified",
        yaxis2=dict(title=dict(text=right, font=dict(color=GREEN)), overlaying="y", side="right",
                    matches="y", showgrid=False, zeroline=False, linecolor=GRID,
                    tickfont=dict(color=GREEN)),
        legend=dict(orientation="h", yanchor="top", y=-0.3, xanchor="left", x=0.0),
        margin=dict(l=52, r=52, t=46, b=110))
    fig.layout.yaxis.rangemode = "tozero"
    fig.layout.yaxis.title = dict(text=left, font=dict(color=BLUE))
    return fig


def gamma_figure(alpha: float, gamma: int, c: float, measured: Measured | None = None,
                 curve=None) -> go.Figure:
    """Predicted speedup and E[tokens per round] over γ = 1…16 at (α, c);
    the optimal γ, the chosen γ and the measured run marked."""
    alpha, gamma, c = _clamp(alpha, gamma, c)
    fig = go.Figure()
    _layout(fig, f"Over γ, at α = {alpha:.2f}, c = {c:.2f}", "γ (draft tokens per round)", "")
    speeds = [speed(alpha, g, c, curve) for g in GAMMAS]
    tokens = [expected_tokens(alpha, g) for g in GAMMAS]
    best = best_gamma(alpha, c, curve)
    fig.add_hline(y=1.0, line=dict(color=FONT, width=1, dash="dot"))
    fig.add_scatter(x=GAMMAS, y=speeds, name="predicted speedup", mode="lines+markers",
                    line=dict(color=BLUE, width=2.5), marker=dict(size=5),
                    hovertemplate="%{y:.2f}×<extra>predicted speedup</extra>")
    # drawn over the speedup line, dashed: both seen where they are equal (c = 0)
    fig.add_scatter(x=GAMMAS, y=tokens, name=TOKENS_NAME, yaxis="y2", mode="lines",
                    line=dict(color=GREEN, width=2, dash="dash"),
                    hovertemplate="%{y:.2f} tokens<extra>E[tokens/round]</extra>")
    fig.add_scatter(x=[gamma], y=[speed(alpha, gamma, c, curve)], name=f"chosen γ = {gamma}",
                    mode="markers", marker=HOLLOW,
                    hovertemplate="%{y:.2f}×<extra>chosen γ</extra>")
    fig.add_scatter(x=[best], y=[speed(alpha, best, c, curve)], name=f"optimal γ = {best}",
                    mode="markers", marker=STAR,
                    hovertemplate="%{y:.2f}×<extra>optimal γ</extra>")
    fig.add_vline(x=best, line=dict(color=ORANGE, width=1, dash="dot"))
    if measured is not None:
        mg = min(max(measured.gamma, 1), MAX_GAMMA)
        fig.add_scatter(x=GAMMAS, y=[speed(measured.alpha_hat, g, measured.c, curve) for g in GAMMAS],
                        name=f"theory at the run's α̂ {measured.alpha_hat:.2f}, c {measured.c:.2f}",
                        mode="lines", line=dict(color=VERMILLION, width=1.5, dash="dot"),
                        hovertemplate="%{y:.2f}×<extra>theory at the run's α̂, c</extra>")
        if measured.speedup is not None:
            fig.add_scatter(x=[mg], y=[measured.speedup], name=f"measured: {measured.speedup:.2f}× at γ {mg}",
                            mode="markers", marker=dict(symbol="diamond", size=13, color=VERMILLION,
                                                        line=dict(color="white", width=1)),
                            hovertemplate="%{y:.2f}×<extra>measured</extra>")
    fig.update_xaxes(dtick=1 if MAX_GAMMA <= 16 else 2, range=[0.5, MAX_GAMMA + 0.5])
    _same_line_note(fig, c, curve)
    return _style(fig, "predicted speedup (×)", "E[tokens per round]")


def alpha_figure(alpha: float, gamma: int, c: float, measured: Measured | None = None,
                 curve=None) -> go.Figure:
    """Predicted speedup and E[tokens per round] over α = 0…0.99 at (γ, c);
    the chosen α, the break-even α and the measured run marked."""
    alpha, gamma, c = _clamp(alpha, gamma, c)
    fig = go.Figure()
    _layout(fig, f"Over α, at γ = {gamma}, c = {c:.2f}", "α (expected acceptance, a run's α̂)", "")
    fig.add_hline(y=1.0, line=dict(color=FONT, width=1, dash="dot"))
    fig.add_scatter(x=ALPHAS, y=[speed(a, gamma, c, curve) for a in ALPHAS], name="predicted speedup",
                    mode="lines", line=dict(color=BLUE, width=2.5),
                    hovertemplate="%{y:.2f}×<extra>predicted speedup</extra>")
    fig.add_scatter(x=ALPHAS, y=[expected_tokens(a, gamma) for a in ALPHAS], yaxis="y2",
                    name=TOKENS_NAME, mode="lines", line=dict(color=GREEN, width=2, dash="dash"),
                    hovertemplate="%{y:.2f} tokens<extra>E[tokens/round]</extra>")
    fig.add_scatter(x=[alpha], y=[speed(alpha, gamma, c, curve)], name=f"chosen α = {alpha:.2f}",
                    mode="markers", marker=HOLLOW,
                    hovertemplate="%{y:.2f}×<extra>chosen α</extra>")
    even = break_even_alpha(gamma, c, curve)
    if even is not None and even > 0:
        fig.add_vline(x=even, line=dict(color=FONT, width=1, dash="dot"),
                      annotation=dict(text=f"break-even α {even:.2f}", font=dict(color=FONT, size=11),
                                      yanchor="top"), annotation_position="top left")
    if measured is not None:
        mg = min(max(measured.gamma, 1), MAX_GAMMA)
        fig.add_scatter(x=ALPHAS, y=[speed(a, mg, measured.c, curve) for a in ALPHAS],
                        name=f"theory at the run's γ {mg}, c {measured.c:.2f}", mode="lines",
                        line=dict(color=VERMILLION, width=1.5, dash="dot"),
                        hovertemplate="%{y:.2f}×<extra>theory at the run's γ, c</extra>")
        if measured.speedup is not None:
            fig.add_scatter(x=[min(measured.alpha_hat, ALPHA_END)], y=[measured.speedup],
                            name=f"measured: {measured.speedup:.2f}× at α̂ {measured.alpha_hat:.2f}",
                            mode="markers", marker=dict(symbol="diamond", size=13, color=VERMILLION,
                                                        line=dict(color="white", width=1)),
                            hovertemplate="%{y:.2f}×<extra>measured</extra>")
    fig.update_xaxes(range=[0, 1.0], dtick=0.1)
    _same_line_note(fig, c, curve)
    return _style(fig, "predicted speedup (×)", "E[tokens per round]")


def run_curve(measured, vmode) -> list | None:
    """The measured v curve when the visitor picked it and a run has one."""
    m = Measured.from_dict(measured) if isinstance(measured, dict) or measured is None else measured
    return m.v_curve if (m is not None and vmode == V_MODES[1]) else None


NOT_CHAIN = ("tree", *FREE_DRAFTS)  # no chain-formula point on the theory charts


def figures(alpha, gamma, c, measured: dict | Measured | None = None, vmode: str = V_MODES[0]):
    m = Measured.from_dict(measured) if isinstance(measured, dict) or measured is None else measured
    curve = run_curve(m, vmode)
    placed = None if m is None or m.method in NOT_CHAIN else m  # the chain formula describes neither
    return gamma_figure(alpha, gamma, c, placed, curve), alpha_figure(alpha, gamma, c, placed, curve)


def numbers_html(alpha: float, gamma: int, c: float, curve=None) -> str:
    """The theory at the sliders' values, in words and numbers (v(γ) from `curve` when given)."""
    alpha, gamma, c = _clamp(alpha, gamma, c)
    e = expected_tokens(alpha, gamma)
    v = v_at(curve, gamma) if curve else 1.0
    s = speed(alpha, gamma, c, curve)
    best = best_gamma(alpha, c, curve)
    even = break_even_alpha(gamma, c, curve)
    cls = " sv-good" if s >= 1 else " sv-bad"
    even_txt = ("speculation pays off at any α" if even == 0 else
                "speculation never pays off (below α = 1)" if even is None else
                f"speculation pays off from α ≈ {even:.2f}")
    verify = ("one target pass" if not curve else
              f"one verify pass of γ + 1 tokens, v(γ) = <b>{v:.2f}</b> plain target steps (measured)")
    return (
        "<div class='sv-stats sv-theory-numbers'>"
        f"<div class='sv-speedup{cls}'><span class='sv-speedup-num'>{s:.2f}×</span>"
        "<span class='sv-speedup-label'>predicted speedup</span>"
        f"<span class='sv-speedup-sub'>at α {alpha:.2f}, γ {gamma}, c {c:.2f}, v {v:.2f}</span></div>"
        "<div class='sv-theory-text'>"
        f"Each round the draft proposes <b>γ = {gamma}</b> tokens and the target checks them in one pass: "
        f"on average <b>{e:.2f}</b> tokens come out of that pass (at most γ + 1 = {gamma + 1}). "
        f"The round costs {verify} plus γ·c = <b>{gamma * c:.2f}</b> target passes of drafting, "
        f"so the predicted speedup is {e:.2f} ÷ {v + gamma * c:.2f} = <b>{s:.2f}×</b>. "
        f"The best γ here is <b>{best}</b> ({speed(alpha, best, c, curve):.2f}×). "
        f"At γ {gamma} and c {c:.2f}, {even_txt}."
        "</div></div>")


def nothing_drafted_html(source: str) -> str:
    return (f"<div class='sv-runinfo sv-theory-measured'><span><b>{esc(source)}</b> drafted no tokens at all "
            "(prompt lookup found no repeated text to copy), so it has no α to place on the charts: every "
            "round was a plain target step.</span></div>")


def measured_html(m: dict | Measured | None, vmode: str = "") -> str:
    m = Measured.from_dict(m) if isinstance(m, dict) or m is None else m
    if m is None:
        return ("<div class='sv-runinfo sv-theory-measured'><span class='sv-mode'>"
                "Run the live demo (or a replay) "
                "and its measured point appears on both charts as a ◆.</span></div>")
    if m.method in FREE_DRAFTS:
        which = " in its copied rounds" if m.method.startswith("hybrid") else ""
        return (f"<div class='sv-runinfo sv-theory-measured'><span><b>{esc(m.source)}</b> drafted from "
                f"text (a suffix tree: no draft model, c = 0{which}): measured "
                f"<b>{number(m.speedup, '{:.2f}×')}</b> at τ {number(m.tau, '{:.2f}')} tokens per round. "
                "The chain formula prices a draft model's γ·c each round, so its point is not placed on "
                "these charts; the round chart's ❝ marks say which rounds were copied.</span></div>")
    if m.method in NOT_CHAIN:
        return (f"<div class='sv-runinfo sv-theory-measured'><span><b>{esc(m.source)}</b> was a token tree: "
                f"measured <b>{number(m.speedup, '{:.2f}×')}</b> at α̂ {m.alpha_hat:.3f}, c {m.c:.3f}. The "
                "chain formula here does not describe a tree, so its point is not placed on these charts."
                "</span></div>")
    gap = ""
    if m.verify_cost is not None and m.verify_cost > 1.15 and vmode == V_MODES[1]:
        gap = (f" One verification pass cost <b>{m.verify_cost:.2f}</b> plain target steps there; the curves "
               "here use that measured v curve, so what gap is left comes from α̂, c and timing noise.")
    elif m.verify_cost is not None and m.verify_cost > 1.15:
        gap = (f" One verification pass cost <b>{m.verify_cost:.2f}</b> plain target steps there, while the "
               "theory assumes 1: that is most of the gap between measured and predicted.")
    return (
        f"<div class='sv-runinfo sv-theory-measured'><span><b>◆ {esc(m.source)}</b>: α̂ {m.alpha_hat:.3f}, "
        f"c {m.c:.3f}, γ {m.gamma}, τ {number(m.tau, '{:.2f}')} tokens per round: measured "
        f"<b>{number(m.speedup, '{:.2f}×')}</b>, predicted {number(m.predicted, '{:.2f}×')} by Leviathan "
        f"(v = 1) at the γ it drafted, {number(m.gamma_mean, '{:.2f}')} a round.{gap}"
        "</span></div>")


FORMULA = (
    "<div class='sv-explainer'><b>The theory</b> (Leviathan et al., 2023). If each drafted token is accepted "
    "with probability <b>α</b>, independently, a round of <b>γ</b> guesses yields "
    "<b>E = (1 − α<sup>γ+1</sup>) / (1 − α)</b> tokens for one target pass. A draft step costs <b>c</b> "
    "target steps, so the round costs γc + 1 and the predicted speedup is <b>E / (γc + 1)</b>. On the "
    "charts, on one scale, the dashed E line is the speedup drafts that cost nothing would give, and the gap "
    "down to the speedup line is what drafting costs. "
    "Longer drafts pay off only when α is high and c small; the ★ marks the γ that maximises the speedup. "
    "Prompt lookup has c ≈ 0. The theory also assumes that verifying γ + 1 tokens costs one plain step, "
    "which holds on a GPU with spare compute but rarely on a CPU.</div>")


@dataclass
class TheoryTab:
    """The theory explorer's components."""

    alpha: object  # gr.Slider
    gamma: object  # gr.Slider
    c: object  # gr.Slider
    numbers: object  # gr.HTML
    measured_html: object  # gr.HTML
    use_run: object  # gr.Button
    fig_gamma: object  # gr.Plot
    fig_alpha: object  # gr.Plot
    measured: object  # gr.State: the last run's Measured as a dict
    vmode: object = None  # gr.Radio: v = 1 or the measured v curve

    def measured_outputs(self) -> list:
        """Components a finished run or replay updates (see measured_updates)."""
        return [self.measured, self.fig_gamma, self.fig_alpha, self.measured_html, self.use_run]


def build_tab() -> TheoryTab:
    """The theory explorer's layout (call inside a gr.Blocks)."""
    import gradio as gr

    g0, a0 = figures(DEFAULTS["alpha"], DEFAULTS["gamma"], DEFAULTS["c"])
    with gr.Tab("Theory explorer", id="theory", elem_id="sv-tab-theory"):
        gr.HTML(FORMULA)
        with gr.Row():
            alpha = gr.Slider(0.0, ALPHA_END, value=DEFAULTS["alpha"], step=0.01,
                              label="α (expected acceptance)", info="Chance that the target keeps a drafted "
                              "token (a run measures it as α̂)", elem_id="sv-th-alpha")
            gamma = gr.Slider(1, MAX_GAMMA, value=DEFAULTS["gamma"], step=1, label="γ (draft length)",
                              info="Guesses per round", elem_id="sv-th-gamma")
            c = gr.Slider(0.0, 1.0, value=DEFAULTS["c"], step=0.01, label="c (draft cost)",
                          info="One draft step ÷ one target step", elem_id="sv-th-c")
        vmode = gr.Radio(V_MODES, value=V_MODES[0], label="Verify cost v(γ)", interactive=True,
                         info="v = 1: Leviathan et al.'s assumption. Measured: the v(k) curve of your "
                              "last run or replay (calibrated at load when the pair has it)",
                         elem_id="sv-th-vmode")
        numbers = gr.HTML(numbers_html(**DEFAULTS), elem_id="sv-th-numbers")
        with gr.Row():
            measured_box = gr.HTML(measured_html(None), elem_id="sv-th-measured")
            use_run = gr.Button("Set the sliders to the run's α̂, γ, c", size="sm", interactive=False,
                                scale=0, min_width=280, elem_id="sv-th-use-run")
        with gr.Row():
            fig_gamma = gr.Plot(g0, show_label=False, elem_id="sv-th-gamma-chart")
            fig_alpha = gr.Plot(a0, show_label=False, elem_id="sv-th-alpha-chart")
        measured = gr.State(None)
    return TheoryTab(alpha, gamma, c, numbers, measured_box, use_run, fig_gamma, fig_alpha, measured, vmode)


def update(alpha, gamma, c, measured, vmode=V_MODES[0]):
    """Slider, v mode or measured-point change: both figures and the numbers."""
    fg, fa = figures(alpha, gamma, c, measured, vmode)
    m = Measured.from_dict(measured) if isinstance(measured, dict) or measured is None else measured
    text = measured_html(m, vmode) if m is not None else gr_skip()
    return fg, fa, numbers_html(alpha, gamma, c, run_curve(measured, vmode)), text


def gr_skip():
    import gradio as gr
    return gr.skip()


def use_run(measured):
    """The use-my-run button: the sliders to the run's α̂, γ, c."""
    import gradio as gr

    m = Measured.from_dict(measured)
    if m is None:
        return gr.skip(), gr.skip(), gr.skip()
    return min(round(m.alpha_hat, 2), ALPHA_END), m.gamma, min(round(m.c, 2), 1.0)


def wire(tab: TheoryTab) -> None:
    """Hook the tab's own events (sliders, the use-my-run button)."""
    sliders = [tab.alpha, tab.gamma, tab.c]
    outs = [tab.fig_gamma, tab.fig_alpha, tab.numbers, tab.measured_html]
    for slider in [*sliders, tab.vmode]:
        slider.change(update, [*sliders, tab.measured, tab.vmode], outs, api_visibility="private",
                      show_progress="hidden", queue=False, trigger_mode="always_last")
    tab.use_run.click(use_run, tab.measured, sliders, api_visibility="private", show_progress="hidden",
                      queue=False)


def measured_updates(m: Measured | None, alpha, gamma, c, vmode=V_MODES[0]) -> list:
    import gradio as gr

    if m is None:
        return [gr.skip()] * 5
    fg, fa = figures(alpha, gamma, c, m, vmode)
    return [m.to_dict(), fg, fa, measured_html(m, vmode), gr.Button(interactive=m.method not in NOT_CHAIN)]
