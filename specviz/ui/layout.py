"""The page's components, top to bottom, with no behaviour: build_page() makes
them inside `gr.Blocks` and returns them as one Page; ui/blocks.py wires events."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import gradio as gr

from ..hosting.spaces import ZEROGPU_FIXED, on_zerogpu
from ..run.request import MAX_GAMMA, Limits
from . import busy, draft_size, inspector, method_options, render, theory
from . import leaderboard as board_ui
from . import replay as replay_ui
from .charts import all_charts
from .handlers import PairChoices
from .panes import IDLE_BASE, IDLE_SPEC
from .stage import keys_html
from .state import RunView
from .tree_view import latest_tree_figure

MODE_CHOICES = [
    ("fair: each side timed alone (honest speedup)", "fair"),
    ("parallel: both at once (shares the hardware)", "parallel"),
]
# the tagline beside the title, the keys and glossary under both (an opened glossary had pushed the
# tagline away from the title)
HEADER = ("<div class='sv-header'><div class='sv-title-row'><h1 style='margin:0'>SpecViz</h1>"
          "<p style='margin:2px 0 0 0;opacity:.8'>Speculative decoding, made visible and honestly "
          "measured: a small draft model guesses, the big target model verifies.</p></div>{help}</div>")


@dataclass
class Page:
    """Every component an event reads or writes."""

    status: gr.HTML
    timer: gr.Timer
    preset: gr.Dropdown
    prompt: gr.Textbox
    gamma: gr.Slider
    gamma_auto: gr.Checkbox
    max_new: gr.Slider
    temperature: gr.Slider
    seed: gr.Number
    mode: gr.Radio
    run_btn: gr.Button
    stop_btn: gr.Button
    top_p: gr.Slider
    top_k: gr.Slider
    chat: gr.Checkbox
    method: gr.Radio
    pair_pick: gr.Dropdown
    load_btn: gr.Button
    custom_row: gr.Row
    custom_target: gr.Textbox
    custom_draft: gr.Textbox
    replay: replay_ui.ReplayBox
    run_info: gr.HTML
    base_pane: gr.HTML
    spec_pane: gr.HTML
    stats: gr.HTML
    plots: list[gr.Plot]  # α, speedup, time, position, token tree
    theory: object  # theory.build_tab()'s components
    inspector: dict | None = None  # ui/inspector.py build()'s components
    method_options: method_options.Controls | None = None  # per-method settings (ui/method_options.py)
    next_preset: gr.Button | None = None  # the N key (ui/stage.py)
    busy_replay: gr.Button | None = None  # shown with the busy banner: replay a quiet machine's run
    board: object = None  # the "Race all methods" tab (ui/leaderboard.py)
    fresh_memory: gr.Checkbox | None = None  # suffix, hybrid: read no earlier run's output
    share_memory: gr.Checkbox | None = None  # suffix, hybrid: also read other visitors' preset runs (off)

    @property
    def run_inputs(self) -> list:
        extra = self.method_options.inputs if self.method_options is not None else []
        fresh = [b for b in (self.fresh_memory, self.share_memory) if b is not None]
        return [self.prompt, self.gamma, self.max_new, self.temperature, self.top_p, self.top_k, self.seed,
                self.chat, self.mode, self.method, self.gamma_auto, *extra, *fresh]

    @property
    def run_outputs(self) -> list:
        return [self.base_pane, self.spec_pane, self.stats, self.run_info, *self.plots]


def _prompt_column(presets: list[dict], ready: bool) -> dict:
    first = presets[0]
    with gr.Column(scale=3):
        preset = gr.Dropdown([p["name"] for p in presets], value=first["name"], label="Preset",
                             info="Example prompts (code, chat, grounded, edit): fills the prompt, γ, max "
                                  "tokens and chat template; the method stays as you chose it",
                             elem_id="sv-preset")
        prompt = gr.Textbox(first["prompt"], label="Prompt", lines=4, max_lines=14,
                            info="Text the model continues (or answers, with the chat template on)",
                            elem_id="sv-prompt")
        # Run right under the prompt (issue 51): the next Tab stop after it, and above the fold at
        # 1440x900 and on a phone (it was the 22nd stop, under the settings' three-stop sliders)
        with gr.Row(elem_id="sv-run-row"):
            run_btn = gr.Button("▶ Run" if ready else "loading models…", variant="primary",
                                interactive=ready, elem_id="sv-run", scale=2)
            stop_btn = gr.Button("■ Stop", variant="secondary", elem_id="sv-stop", scale=1)
            next_preset = gr.Button("Next preset (N)", variant="secondary", elem_id="sv-next-preset", scale=1)
        # for the methods that copy from earlier runs' outputs (suffix, hybrid): a fair comparison one
        # click from Run (issue 59: a preset run twice got faster by copying the first run's output)
        fresh_memory = gr.Checkbox(False, label="fresh memory: copy only from this run's prompt and output, "
                                   "not from earlier runs", elem_id="sv-fresh-memory", visible=False)
        # off by default (issue 71: a new session's first run of a preset copied 78 of 96 tokens from runs
        # other visitors had made of it, and headlined 3.40×); on, runs of a preset copy from everyone's
        share_memory = gr.Checkbox(False, label="share memory with other visitors' runs of this preset: copy "
                                   "from them too", elem_id="sv-share-memory", visible=False,
                                   info="The memory holds the outputs of earlier suffix and hybrid runs "
                                        "(and their tree modes), never prompts: by default only yours, "
                                        "from this browser session")
    return dict(preset=preset, prompt=prompt, next_preset=next_preset, run_btn=run_btn, stop_btn=stop_btn,
                fresh_memory=fresh_memory, share_memory=share_memory)


def _settings_column(first: dict, limits: Limits, default_mode: str) -> dict:
    with gr.Column(scale=2):
        with gr.Row():  # two sliders a row: three cut their end labels and scrolled sideways
            gamma = gr.Slider(1, MAX_GAMMA, value=first["gamma"], step=1, label="γ (draft length)",
                              info="Draft guesses per round", elem_id="sv-gamma", min_width=180)
            max_new = gr.Slider(1, limits.max_new_tokens,
                                value=min(first["max_new_tokens"], limits.max_new_tokens),
                                step=1, label="Max new tokens", info="Budget for each side",
                                elem_id="sv-max-new", min_width=180)
        with gr.Row():
            gamma_auto = gr.Checkbox(False, label="auto γ", elem_id="sv-gamma-auto",
                                     info="Each round, the γ with the most expected tokens/s from this "
                                          "machine's measured costs and the running α̂")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature",
                                    info="0 = greedy (identical outputs)", elem_id="sv-temperature")
            seed = gr.Number(0, precision=0, minimum=0, label="Seed", info="Same seed, same run")
        mode = gr.Radio(MODE_CHOICES, value=default_mode, label="Execution mode",
                        info="fair: each side gets the machine to itself on its own virtual clock. "
                             "parallel: both run at once and slow each other down.")
    return dict(gamma=gamma, gamma_auto=gamma_auto, max_new=max_new, temperature=temperature, seed=seed,
                mode=mode)


def _more_settings(first: dict) -> dict:
    with gr.Accordion("More settings: sampling, draft method", open=False, elem_id="sv-more"):
        with gr.Row():
            top_p = gr.Slider(0.01, 1.0, value=1.0, step=0.01, label="Top-p",
                              info="Keep the smallest set of tokens with this much probability (1 = off)",
                              elem_id="sv-top-p")
            top_k = gr.Slider(0, 1000, value=0, step=1, label="Top-k",
                              info="Keep only the k most likely tokens (0 = off)", elem_id="sv-top-k")
            chat = gr.Checkbox(first["chat_template"], label="Use the chat template",
                               info="Wrap the prompt as a user message (instruct models)")
        method = gr.Radio(method_options.method_choices(), value="draft", label="Where the guesses come from",
                          info="Every method is verified the same way, so the output law stays the target's",
                          elem_id="sv-method")
        opts = method_options.build("draft")  # tree shape, lookahead W and G, exit layer, skip set
    return dict(top_p=top_p, top_k=top_k, chat=chat, method=method, method_options=opts)


def _pair_section(choices: PairChoices, allow_local_paths: bool, fixed_pair: bool) -> dict:
    with gr.Accordion("Model pair", open=False, elem_id="sv-pair"):
        if fixed_pair:
            gr.Markdown("The pair is fixed on this server: every run uses the pair it started with."
                        + (f" {ZEROGPU_FIXED}" if on_zerogpu() else ""))
        else:
            gr.Markdown("The pair is shared by everyone using this server. Loading another one takes "
                        "a while; the current pair serves until the new one is ready.")
        with gr.Row():
            pair_pick = gr.Dropdown(choices.labels, value=choices.initial, label="Target + draft",
                                    info="Both models must share one tokenizer", scale=3,
                                    interactive=not fixed_pair)
            load_btn = gr.Button("Load pair" if not fixed_pair else "Load pair (fixed on this server)",
                                 scale=1, interactive=not fixed_pair)
        with gr.Row(visible=False) as custom_row:
            custom_target = gr.Textbox(label="Target model", placeholder="org/name on the Hugging Face Hub"
                                       + (" or a local folder" if allow_local_paths else ""),
                                       info="The big model whose output you want")
            custom_draft = gr.Textbox(label="Draft model", placeholder="org/name (same tokenizer)",
                                      info="A small model from the same family")
    return dict(pair_pick=pair_pick, load_btn=load_btn, custom_row=custom_row, custom_target=custom_target,
                custom_draft=custom_draft)


def _panes_and_charts(first: dict, default_mode: str) -> dict:
    run_info = gr.HTML("<div class='sv-runinfo'></div>", elem_id="sv-runinfo")
    with gr.Row(equal_height=True):
        with gr.Column(elem_classes=["sv-pane-col"]):
            gr.HTML("<h2 class='sv-pane-title' id='sv-baseline-title'>Baseline: the target alone, one token "
                    "per pass</h2>")
            base_pane = gr.HTML(IDLE_BASE, elem_classes=["sv-pane"], elem_id="sv-baseline", autoscroll=True)
        with gr.Column(elem_classes=["sv-pane-col"]):
            gr.HTML("<h2 class='sv-pane-title' id='sv-speculative-title'>Speculative: draft guesses, target "
                    "verifies</h2>")
            spec_pane = gr.HTML(IDLE_SPEC, elem_classes=["sv-pane"], elem_id="sv-speculative",
                                autoscroll=True, js_on_load=inspector.PANE_JS)  # token clicks: p/q inspector
    insp = inspector.build()  # click a token of the speculative pane: p, q, u, residual
    stats = gr.HTML(render.stats_html(RunView(first["gamma"], 0.0, default_mode).snapshot()),
                    elem_id="sv-stats")
    empty = all_charts(RunView(first["gamma"], 0.0, default_mode))
    ids = ("sv-chart-alpha", "sv-chart-speedup", "sv-chart-time", "sv-chart-position")
    plots = []
    for row in range(2):
        with gr.Row(elem_classes=["sv-chart-row"]):
            plots += [gr.Plot(empty[i], show_label=False, elem_id=ids[i]) for i in (2 * row, 2 * row + 1)]
    # the token tree of each round (tree methods; ui/tree_view.py), below the charts
    plots.append(gr.Plot(latest_tree_figure(RunView(first["gamma"], 0.0, default_mode)), show_label=False,
                         elem_id="sv-chart-tree"))
    return dict(run_info=run_info, base_pane=base_pane, spec_pane=spec_pane, stats=stats, plots=plots,
                inspector=insp)


def build_page(*, presets: list[dict], choices: PairChoices, limits: Limits, default_mode: str,
               status: dict, allow_local_paths: bool, fixed_pair: bool, stage: bool = False) -> Page:
    """The components, inside the caller's `with gr.Blocks()`."""
    first = presets[0]
    # the keys and the glossary beside the title, for every visitor (ui/stage.py, ui/glossary.py)
    gr.HTML(HEADER.format(help=keys_html(stage)), elem_id="sv-keys-block")
    with gr.Accordion("What am I looking at?", open=not stage, elem_id="sv-explainer"):
        gr.HTML(f"<div class='sv-explainer'>{render.EXPLAINER}</div>")
    parts = dict(status=gr.HTML(render.status_html(status), elem_id="sv-status"))
    parts["busy_replay"] = gr.Button(busy.OFFER_BUTTON, visible=False, size="sm", elem_id="sv-busy-replay")
    # two tabs: the live demo (the layout below, entered without re-indenting it) and
    # the theory explorer (ui/theory.py)
    live_tab = contextlib.ExitStack()
    live_tab.enter_context(gr.Tab("Live demo", id="live", elem_id="sv-tab-live"))
    with gr.Row(equal_height=False):
        parts |= _prompt_column(presets, status["ready"])
        parts |= _settings_column(first, limits, default_mode)
    parts |= _more_settings(first)
    parts |= _pair_section(choices, allow_local_paths, fixed_pair)
    parts["replay"] = replay_ui.build_section()  # replay recorded runs, download yours (ui/replay.py)
    gr.HTML(render.legend_html())
    parts |= _panes_and_charts(first, default_mode)
    live_tab.close()
    parts["board"] = board_ui.build_tab(first, limits)  # race all methods: the leaderboard
    parts["theory"] = theory.build_tab()
    draft_size.build_tab()  # the committed draft-size analysis (static, docs/draft_size.json)
    parts["timer"] = gr.Timer(0.5, active=status["loading"])
    return Page(**parts)
