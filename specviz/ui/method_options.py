"""The page's "Method settings": one table of per-method controls (the CLI's
METHOD_FLAGS, specviz/cli.py), the controls built from it, and the options dict
a run sends to make_request (each method's MethodSpec.check_options validates it).

rest's `datastore` is CLI-only on purpose: a visitor must not pick a file path
on the server.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engine.proposers.lookahead import DEFAULT_GUESSES, DEFAULT_WINDOW, MAX_GUESSES, MAX_WINDOW
from ..engine.proposers.tree import DEFAULT_BUDGET, MAX_NODES
from ..errors import RequestError

TEXT, INT, SLIDER = "text", "int", "slider"  # INT: a whole number typed in a box, blank = the default
NO_SETTINGS = "This method has no settings beyond γ."
NOTES = {"rest": "The datastore is the server's, set by its --datastore flag; the page cannot pick files.",
         "heads": "The heads are trained once on the server (python -m specviz.heads train); "
                  "γ above their number K proposes K tokens."}


@dataclass(frozen=True)
class OptionSpec:
    key: str  # the RunRequest.options key, as the CLI flag (--tree-shape = tree_shape)
    method: str
    label: str
    kind: str
    info: str  # the tooltip: what it does, and its default
    short: str  # in the run header: "token tree · shape 4-2-2-1"
    default: int | None = None  # sliders only; blank boxes leave the default to the method
    lo: int = 1
    hi: int | None = None
    placeholder: str = ""


OPTIONS = (
    OptionSpec("tree_shape", "tree", "Tree shape", TEXT, short="shape", placeholder="e.g. 4-2-2-1",
               info="Children per depth, e.g. 4-2-2-1: 4 guesses for the next token, 2 after each, … "
                    "Blank (default): a dynamic tree that grows its most likely nodes."),
    OptionSpec("tree_budget", "tree", "Tree budget (nodes)", INT, short="budget", hi=MAX_NODES,
               info=f"Most draft nodes per tree (1-{MAX_NODES}); the target checks them all in one pass. "
                    f"Blank: {DEFAULT_BUDGET} for a dynamic tree, the whole shape for a static one."),
    OptionSpec("window", "lookahead", "Lookahead window W", SLIDER, short="W", default=DEFAULT_WINDOW,
               hi=MAX_WINDOW, info=f"Jacobi positions guessed ahead each forward, collecting n-grams "
                                   f"(default {DEFAULT_WINDOW}); more costs more per forward on a CPU."),
    OptionSpec("guesses", "lookahead", "Guesses G", SLIDER, short="G", default=DEFAULT_GUESSES,
               hi=MAX_GUESSES, info=f"n-gram guesses from the pool verified in the same forward "
                                    f"(default {DEFAULT_GUESSES}). γ sets the n-gram length (N = γ+1)."),
    OptionSpec("exit_layer", "early-exit", "Exit layer L", INT, short="L",
               info="Draft with the target's first L layers (1 up to the target's layer count). "
                    "Blank (default): the calibrated layer, measured once per pair and cached."),
    OptionSpec("skip_layers", "layer-skip", "Skip layers", TEXT, short="skip", placeholder="e.g. 4,6-9",
               info="Layers the draft pass skips, numbered from 0, e.g. 4,6-9. "
                    "Blank (default): the calibrated skip set, measured once per pair and cached."),
)
KEYS = tuple(o.key for o in OPTIONS)  # the run handler's extra inputs, in this order


def specs_for(method: str | None) -> tuple[OptionSpec, ...]:
    return tuple(o for o in OPTIONS if o.method == method)


def _whole(spec: OptionSpec, value):
    if isinstance(value, bool):
        raise RequestError(f"{spec.label} must be a whole number, got {value!r}.")
    if isinstance(value, float):
        if not value.is_integer():
            raise RequestError(f"{spec.label} must be a whole number, got {value!r}.")
        return int(value)
    return value  # an int, or an API caller's string: check_options names what is wrong


def collect(method: str | None, values: dict) -> dict:
    """The options of `method` from the controls' values: blanks are left out so
    the method's defaults apply, number boxes give ints; the other methods'
    (hidden) controls are ignored."""
    out = {}
    for spec in specs_for(method):
        value = values.get(spec.key)
        if isinstance(value, str):
            value = value.strip()
        if value is None or value == "":
            continue
        out[spec.key] = value if spec.kind == TEXT else _whole(spec, value)
    return out


def _compact(value) -> str:
    if isinstance(value, (list, tuple)):
        return "-".join(map(str, value)) if value and all(type(v) is int for v in value) else str(value)
    return str(value)


def _ranges(ids) -> str:
    """(4, 6, 7, 8, 9) -> '4,6-9'."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def options_text(method: str | None, options: dict | None) -> str:
    """The settings a run used, for its header: 'shape 4-2-2-1 · budget 44' ('' when none)."""
    if not isinstance(options, dict):  # an uploaded trace may hold anything
        return ""
    parts = []
    for spec in specs_for(method):
        value = options.get(spec.key)
        if value is None or value == "" or value == []:
            continue
        ints = isinstance(value, (list, tuple)) and all(type(v) is int for v in value)
        if spec.key == "skip_layers" and ints:
            parts.append(f"{spec.short} {_ranges(value)}")
        else:
            parts.append(f"{spec.short} {_compact(value)}")
    return " · ".join(parts)


def note_html(method: str | None) -> str:
    return f"<span class='sv-mode'>{NOTES.get(method, NO_SETTINGS)}</span>"


@dataclass
class Controls:
    """The group's components: `inputs` follow KEYS (the run handler's order)."""

    note: object  # gr.HTML, shown for a method with no settings
    inputs: list = field(default_factory=list)

    @property
    def outputs(self) -> list:
        return [self.note, *self.inputs]

    @property
    def numbers(self) -> list:
        return [c for c, o in zip(self.inputs, OPTIONS, strict=True) if o.kind != TEXT]


def _control(spec: OptionSpec, visible: bool):
    import gradio as gr  # as ui/panes.py: this module's table and text stay importable without gradio
    common = dict(label=spec.label, info=spec.info, visible=visible,
                  elem_id=f"sv-opt-{spec.key.replace('_', '-')}")
    if spec.kind == SLIDER:
        return gr.Slider(spec.lo, spec.hi, value=spec.default, step=1, **common)
    if spec.kind == INT:
        # a text box, not gr.Number: Number(None, minimum=1) showed 0 in the browser and refused
        # every run with "Value 0 is less than minimum value 1" (a blank must mean "the default")
        return gr.Textbox("", placeholder=spec.placeholder or "blank: the default", max_lines=1, **common)
    return gr.Textbox("", placeholder=spec.placeholder, max_lines=1, **common)


def build(method: str = "draft") -> Controls:
    """The "Method settings" group, inside the caller's layout, set up for `method`."""
    import gradio as gr
    with gr.Group(elem_id="sv-method-settings"):
        gr.HTML("<div class='sv-pane-title'>Method settings</div>")
        note = gr.HTML(note_html(method), visible=not specs_for(method))
        with gr.Row():
            inputs = [_control(o, o.method == method) for o in OPTIONS]
    return Controls(note, inputs)


def on_method(method):
    """Show the selected method's controls only (a chain method: the note)."""
    import gradio as gr
    return (gr.update(value=note_html(method), visible=not specs_for(method)),
            *(gr.update(visible=o.method == method) for o in OPTIONS))
