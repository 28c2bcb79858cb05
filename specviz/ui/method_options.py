"""The page's "Method settings": the controls built from each method's declared
options (MethodSpec.options, engine/proposer.py), and the options dict a
run sends to make_request (MethodSpec.check_options validates it).

rest's `datastore` is CLI-only on purpose (Option.page=False): a visitor must not
pick a file path on the server.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from ..engine.proposer import FLAG, TEXT, Option, blank
from ..engine.proposers import REGISTRY, method_names, method_spec
from .trained import KINDS as TRAINED_KINDS
from .trained import TRAINED_ONLY  # noqa: F401 (re-exported: callers read it here)
from .trained import note_html as trained_note

NO_SETTINGS = "This method has no settings beyond γ."

# every registered method (engine/proposers/): draft-model methods first, then by their menu order
METHOD_CHOICES = [(f"{method_spec(m).label}: {method_spec(m).description}", m)
                  for m in sorted(method_names(), key=lambda m: not method_spec(m).needs_draft)]
# offered once the loaded pair's target has their file (ui/trained.py found, handlers.method_choices)


def method_choices(trained=()) -> list[tuple[str, str]]:
    """The methods a visitor can run now: of the trained ones (Medusa heads, EAGLE) only those in
    `trained`, the ones the loaded pair has a file for (a visitor cannot train one)."""
    return [c for c in METHOD_CHOICES if c[1] not in TRAINED_ONLY or c[1] in trained]


@dataclass(frozen=True)
class PageOption:
    method: str
    option: Option

    @property
    def key(self) -> str:
        return self.option.name


# every page control, methods in menu order: the run handler's extra inputs, in this order
OPTIONS = tuple(PageOption(m, o) for m in method_names() for o in REGISTRY[m].options if o.page)
KEYS = tuple(o.key for o in OPTIONS)


def specs_for(method: str | None) -> tuple[Option, ...]:
    return REGISTRY[method].options if method in REGISTRY else ()


def as_mapping(values) -> dict:
    """The page's method controls (positional, in KEYS order) as one {option: value} mapping."""
    values = list(values)
    if len(values) != len(KEYS):
        raise TypeError(f"expected {len(KEYS)} method settings ({', '.join(KEYS)}), got {len(values)}")
    return dict(zip(KEYS, values, strict=True))


def collect(method: str | None, values: dict) -> dict:
    """The options of `method` from the controls' values: blanks are left out so
    the method's defaults apply (MethodSpec.check_options types and checks the
    rest); the other methods' (hidden) controls are ignored."""
    out = {}
    for opt in specs_for(method):
        value = values.get(opt.name)
        if not blank(value) and opt.page:
            out[opt.name] = value.strip() if isinstance(value, str) else value
    return out


def _compact(value) -> str:
    if isinstance(value, (list, tuple)):
        return "-".join(map(str, value)) if value and all(type(v) is int for v in value) else str(value)
    return str(value)


def options_text(method: str | None, options: dict | None) -> str:
    """The settings a run used, for its header: 'shape 4-2-2-1 · budget 44' ('' when none)."""
    if not isinstance(options, dict):  # an uploaded trace may hold anything
        return ""
    parts = []
    for opt in specs_for(method):
        value = options.get(opt.name)
        if not opt.short or value is None or value == "" or value == []:
            continue
        ints = isinstance(value, (list, tuple)) and all(type(v) is int for v in value)
        parts.append(f"{opt.short} {opt.show(value) if opt.show and ints else _compact(value)}")
    return " · ".join(parts)


# early-exit through a trained exit (an adapter from layer L to the last state, heads exit): said instead
TRAINED_EXIT = ("a trained exit: an adapter learned to read the target's last state from layer L "
                "(docs/trained_drafts.md gives its held-out acceptance)")
# a blank option in a run header: what the method used instead
BLANK = {"exit_layer": "calibrated", "skip_layers": "calibrated", "tree_shape": "dynamic",
         "tree_budget": "auto"}
# why a self-drafting method accepts little here, said in its run header (issue 51: early exit
# accepted 0 of 226 drafts and nothing on the page said why)
WHY = {"early-exit": "an untrained exit: this target never learned to predict from its first L layers, so "
                     "its drafts pass less often than a trained exit's (fewer layers: cheaper, fewer pass)",
       "layer-skip": "untrained: this target never learned to run with layers skipped, so its drafts pass "
                     "less often than a trained draft's, and a draft step still costs most of a full step"}


def _fixed_setup(method: str | None) -> str:
    """The setup a method has no option for: prompt lookup's n-gram sizes."""
    if method == "lookup":
        from ..engine.proposers.lookup import PromptLookupProposer as L
        return f"n-grams of {L.max_ngram} down to {L.min_ngram} tokens"
    return ""


def setup_text(method: str | None, options: dict | None) -> str:
    """A run header's setup: every option the method has, a blank one named for what it used
    ("L calibrated", "budget auto"), its fixed setup, and for a self-drafting method why it accepts
    little on a pair trained for neither: 'L 12 · an untrained exit: …'."""
    opts = dict(options) if isinstance(options, dict) else {}
    parts = []
    for opt in specs_for(method):
        if opt.short and opt.page and opts.get(opt.name) in (None, "", []):
            if opt.default not in (None, "", []):
                opts[opt.name] = opt.default
            else:
                opts.pop(opt.name, None)
                parts.append(f"{opt.short} {BLANK.get(opt.name, 'default')}")
    why = TRAINED_EXIT if method == "early-exit" and opts.get("trained") else WHY.get(method, "")
    parts = [p for p in (options_text(method, opts), *parts, _fixed_setup(method), why) if p]
    return " · ".join(parts)


def note_html(method: str | None, pair=None) -> str:
    """The method's note; a trained method's says what its file's report says for `pair`'s target,
    or how to train one (ui/trained.py). Then, for every method, when it tends to lose, in plain words
    (MethodSpec.loses_when; issue 71: a losing method gave no reason, before or after its run)."""
    spec = REGISTRY.get(method) if method else None
    note = spec.note if spec is not None else ""
    extra = trained_note(method, pair) if method in TRAINED_KINDS else ""
    first = note or ("" if _shown(method) else NO_SETTINGS)
    loses = (f"<span class='sv-mode sv-loses'>{escape(spec.loses_when)}</span>"
             if spec is not None and spec.loses_when else "")
    head = f"<span class='sv-mode'>{first}{extra}</span>" if first or extra else ""
    return head + (" " if head and loses else "") + loses


def _shown(method: str | None) -> bool:
    return any(o.page for o in specs_for(method))


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
        return [c for c, o in zip(self.inputs, OPTIONS, strict=True) if o.option.type != TEXT]


def _control(spec: PageOption, visible: bool):
    import gradio as gr  # as ui/panes.py: this module's table and text stay importable without gradio
    opt = spec.option
    common = dict(label=opt.label, info=opt.help, visible=visible, elem_id=f"sv-opt{opt.flag[1:]}")
    if opt.slider:
        return gr.Slider(opt.lo, opt.hi, value=opt.default, step=1, **common)
    if opt.type == FLAG:  # on or off: a checkbox at its default (early-exit's trained exit)
        return gr.Checkbox(value=bool(opt.default), **common)
    if opt.type != TEXT:
        # a text box, not gr.Number: Number(None, minimum=1) showed 0 in the browser and refused
        # every run with "Value 0 is less than minimum value 1" (a blank must mean "the default")
        return gr.Textbox("", placeholder=opt.placeholder or "blank: the default", max_lines=1, **common)
    return gr.Textbox("", placeholder=opt.placeholder, max_lines=1, **common)


def build(method: str = "draft") -> Controls:
    """The "Method settings" group, inside the caller's layout, set up for `method`."""
    import gradio as gr
    with gr.Group(elem_classes=["sv-method-settings"]):  # an id: Gradio gave it to two nested divs
        gr.HTML("<div class='sv-pane-title'>Method settings</div>")
        note = gr.HTML(note_html(method))  # every method: at least when it tends to lose
        with gr.Row():
            inputs = [_control(o, o.method == method) for o in OPTIONS]
    return Controls(note, inputs)


def on_method(method, pair=None):
    """Show the selected method's controls only, and its note (for `pair`'s target) above them."""
    import gradio as gr
    return (gr.update(value=note_html(method, pair), visible=True),
            *(gr.update(visible=o.method == method) for o in OPTIONS))
