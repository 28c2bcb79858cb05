"""HTML for the page: token panes, legend, numbers, badges, status.

Pure functions of events (no gradio here), so they are unit-tested directly.
Every piece of model or user text goes through `esc()`: HTML-escaped, and
lone surrogates (which a byte-level tokenizer can produce mid-character, and
which JSON encoders refuse) replaced by U+FFFD.

Colours come from events.OUTCOME_COLOURS (Okabe-Ito, colour-blind safe); each
outcome also has a non-colour cue (see CSS below), and text keeps the theme's
own colour, so panes read well in light and dark mode.
"""
from __future__ import annotations

import html  # noqa: F401 - the tests compare with render.html.escape
import re

from ..engine.events import OUTCOME_COLOURS, OUTCOME_LABELS, Outcome, RoundEvent, TokenEvent
from ..engine.proposer import REGISTRY, round_note
from ..format import number
from . import access, draft_source, glossary
from .escape import esc  # noqa: F401 - the page's one escape, imported from here by most of ui/
from .method_options import setup_text
from .speedup_box import stats_html  # noqa: F401 - the speedup box, rendered by the panes and replays

SPEC_OUTCOMES = (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RESAMPLED, Outcome.BONUS)
LEGEND_ORDER = SPEC_OUTCOMES + (Outcome.TARGET,)

# the non-colour cue of each outcome, said in words in the legend too
OUTCOME_CUES = {
    Outcome.TARGET: "thin underline per token",
    Outcome.ACCEPTED: "tinted, no line",
    Outcome.REJECTED: "struck through",
    Outcome.RESAMPLED: "underlined",
    Outcome.BONUS: "bold with a line above",
}

# darker variants for line colours in light mode, where the palette's own orange and vermillion lines
# were 1.8:1 and 2.4:1 against their tints (WCAG asks 3:1 of a cue; ui/access.py), same hue family
_LIGHT_LINES = {
    Outcome.REJECTED: "#a04000",  # 3.6:1 on its tint
    Outcome.BONUS: "#8a6000",  # 4.5:1
    Outcome.TARGET: "#8a8a8a",  # the thin underline, 3.3:1 on the pane (was rgba(153,153,153,.55), 1.7:1)
}
# lighter variants for line colours on dark backgrounds (same hue family)
_DARK_LINES = {
    Outcome.ACCEPTED: "#3fd3a6",
    Outcome.REJECTED: "#ff8a4c",
    Outcome.RESAMPLED: "#56B4E9",  # Okabe-Ito sky blue
    Outcome.BONUS: "#f5c242",
}


def toast_text(text) -> str:
    """Text for gr.Error / gr.Warning / gr.Info: gradio renders toast messages as
    HTML (sanitised, but an <img> or a link still appears), and they often quote
    what a visitor typed. Escapes < > & only, so API callers, who get the same
    string, still read plain quotes; lone surrogates become U+FFFD as in esc()."""
    return esc(text).replace("&#x27;", "'").replace("&quot;", '"')


def rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r}, {g}, {b}, {alpha})"


def css_class(outcome: Outcome) -> str:
    return f"sv-{outcome.value}"


PLAIN_STEP = "a plain step: nothing was drafted this round, so the target wrote its own next token"


def tooltip(tok: TokenEvent, plain_step: bool = False) -> str:
    """Hover text: what happened, p(x), q(x), u and the acceptance probability."""
    lines = [PLAIN_STEP if plain_step else OUTCOME_LABELS[tok.outcome]]
    if tok.round >= 0:
        where = f"round {tok.round + 1}"
        if tok.position:
            where += f", draft position {tok.position}"
        lines.append(where)
    lines.append(f"token id {tok.token_id}: {tok.text!r}")
    if tok.round >= 0 and tok.p is None and tok.q is None and tok.u is None:  # vLLM: engine step only
        lines.append("p(x), q(x) and the accept test are not exposed by this engine (vLLM)")
    elif tok.outcome in (Outcome.ACCEPTED, Outcome.REJECTED) and tok.gap is not None:  # greedy: no u
        lines.append("greedy: kept only if it is the target's top token (no random draw)")
        lines.append("kept: the target's top token" if tok.outcome is Outcome.ACCEPTED else
                     "rejected: the target's top token is another")
    elif tok.outcome in (Outcome.ACCEPTED, Outcome.REJECTED):
        p, q = tok.p, tok.q
        accept = min(1.0, p / q) if (p is not None and q) else None
        lines.append(f"p(x) = {number(p, '{:.4f}')}   q(x) = {number(q, '{:.4f}')}")
        lines.append(f"u = {number(tok.u, '{:.4f}')}   min(1, p/q) = {number(accept, '{:.4f}')}")
        verdict = "u ≤ min(1, p/q): kept" if tok.outcome is Outcome.ACCEPTED else "u > min(1, p/q): rejected"
        lines.append(verdict)
    elif tok.outcome is Outcome.RESAMPLED:
        lines.append(f"p(x) = {number(tok.p, '{:.4f}')}   drawn from norm(max(0, p − q))")
    elif tok.outcome is Outcome.BONUS:
        why = "nothing to test" if plain_step else "all drafts were accepted"
        lines.append(f"p(x) = {number(tok.p, '{:.4f}')}   drawn from p: {why}")
    else:
        lines.append(f"p(x) = {number(tok.p, '{:.4f}')}")
    lines.append(f"t = {tok.t:.3f} s")
    return "\n".join(lines)


NL_SYMBOL = "↵"
SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>")  # <|im_end|>, <|endoftext|>, </s>: markers, not text


def token_span(tok: TokenEvent, where: tuple[int, int] | None = None, note: str = "",
               plain_step: bool = False) -> str:
    """`note`: the round's method-specific story (which n-gram won, ...), added to the tooltip.
    `plain_step`: a round that drafted nothing, whose one token looks like the baseline's (a
    suffix-tree pane of such rounds was mostly bold "bonus" tokens at α̂ 0.31, 2026-11-28)."""
    text = tok.text
    look = Outcome.TARGET if plain_step and tok.outcome is Outcome.BONUS else tok.outcome
    classes = ["sv-tok", css_class(look)]
    if text == "":
        classes.append("sv-empty")  # part of a multi-byte character still being built
    elif tok.outcome is Outcome.REJECTED:
        # not part of the output: a real line break here would shift the pane's
        # layout away from the baseline's, so show the newline as a symbol
        text = text.replace("\r\n", "\n").replace("\n", NL_SYMBOL)
    elif text.strip("\n") == "":
        classes.append("sv-nl")  # newline-only token: CSS shows a faint ↵ (not copied)
    elif text.strip() == "":
        classes.append("sv-ws")  # indentation: no per-token underline (it read as underscores)
    elif SPECIAL.fullmatch(text):
        classes.append("sv-special")  # a marker: a visitor read "<|im_end|>" as output text
        note = "\n".join(filter(None, ["a special token, not text (an end-of-turn token ends a run)", note]))
    tip = tooltip(tok, plain_step) + (f"\n{note}" if note else "")
    # where = (round index, row): the inspector's click target (ui/inspector.py)
    data = (f' data-r="{int(where[0])}" data-i="{int(where[1])}" data-o="{tok.outcome.value}"'
            if where is not None else "")
    # a rejected draft is a deletion: a screen reader does not read it as output (ui/access.py)
    inner = f"<del>{esc(text)}</del>" if tok.outcome is Outcome.REJECTED else esc(text)
    return f'<span class="{" ".join(classes)}"{data} title="{esc(tip)}">{inner}</span>'


def prompt_span(prompt: str, chat: bool = False, limit: int = 400) -> str:
    if not prompt:
        return ""
    shown = prompt if len(prompt) <= limit else "…" + prompt[-limit:]
    sep = "\n\n" if chat else ""
    lines = "".join(f'<span class="sv-pl">{esc(x)}</span>' for x in shown.splitlines(keepends=True))  # hover
    return f'<span class="sv-prompt" title="prompt">{lines}{sep}</span>'


def baseline_html(tokens: list[TokenEvent]) -> str:
    """Baseline tokens; append-only as the run grows (gradio then sends only the tail)."""
    return "".join(token_span(t) for t in tokens)


def round_html(r: RoundEvent, method: str | None = None) -> str:
    info = getattr(r, "info", None) or {}
    note = round_note(info, method)
    # a drafted token's row is its position; an appended one sits after the accepted drafts
    plain = not r.gamma and not r.draft_ids
    inner = "".join(token_span(t, (r.index, t.position - 1 if t.position > 0 else r.n_accepted), note, plain)
                    for t in r.tokens)
    src = draft_source.round_data(info)  # a draft copied from text: where from (ui/draft_source.py)
    return f'<span class="{draft_source.round_class(info)}" data-round="{r.index + 1}"{src}>{inner}</span>'


def speculative_html(rounds: list[RoundEvent], method: str | None = None) -> str:
    return "".join(round_html(r, method) for r in rounds)


def legend_html() -> str:
    items = []
    for o in LEGEND_ORDER:
        sample = "token" if o is not Outcome.TARGET else "plain"
        items.append(
            f'<span class="sv-legend-item" role="listitem" data-outcome="{o.value}">'
            f'<span class="sv-tok {css_class(o)}">{sample}</span> '
            f'<span class="sv-legend-text"><b>{esc(o.value)}</b>: {esc(OUTCOME_LABELS[o])} '
            f'<i>({esc(OUTCOME_CUES[o])})</i></span></span>')
    return ('<div class="sv-legend" role="list" aria-label="legend">' + "".join(items)
            + '<span class="sv-legend-item" role="listitem"><span class="sv-round-demo"></span> '
              '<span class="sv-legend-text">thin bar: a new verification round</span></span>'
            + '<span class="sv-legend-item sv-hint" role="listitem">'
              'hover a token for what decided it (when sampling: p(x), q(x), u, min(1, p/q)); '
              'click or tap it (or Tab to the pane, arrow keys, Enter) for the p/q inspector</span>'
            + draft_source.legend_item() + "</div>")


EXPLAINER = (
    "<b>How to read this.</b> Speculative decoding makes a big <i>target</i> model faster without changing "
    "what it writes: a small <i>draft</i> model guesses the next <b>γ</b> tokens, "
    "and the target checks all γ guesses in <b>one</b> forward pass. "
    "Each guess is kept with probability min(1, p/q) (p: target, q: draft); the first refused guess is "
    "<span class='sv-tok sv-rejected'>struck through</span> and replaced by a token "
    "<span class='sv-tok sv-resampled'>resampled</span> from the target, and when all γ guesses pass the "
    "target adds a <span class='sv-tok sv-bonus'>bonus</span> token for free. "
    "Accepted guesses are <span class='sv-tok sv-accepted'>tinted green</span>. "
    "<b>α̂</b> is the expected acceptance (the chance a guess passes, from p and q), "
    "<b>accepted ÷ drafted</b> the share kept (guesses after a rejection are never tested), "
    "<b>τ</b> the tokens gained per target pass, <b>c</b> the cost of one draft step relative to one "
    "target step and <b>v</b> the cost of one verify pass; "
    "the speedup follows from α̂, γ, c and v (Leviathan et al., 2023 assume v = 1). "
    "The left pane is plain decoding of the same target, for comparison."
)


# the run line's words for where the guesses came from; any other method: its registered label
GUESSES_FROM = {"lookup": "prompt lookup (no draft model)", "adaptive": "draft model with adaptive γ",
                "suffix": "text already written (suffix tree)", "hybrid": "copied text or the draft model",
                "heads": "trained Medusa heads on the target's states (no draft model)",
                "eagle": "a trained EAGLE head on the target's states (no draft model)",
                "eagle-tree": "a trained EAGLE head's token tree on the target's states (no draft model)"}


def guesses_from(method: str) -> str:
    """The run line's name of a method: never its internal id (issue 71: "rest", "suffix-tree")."""
    return GUESSES_FROM.get(method) or (REGISTRY[method].label if method in REGISTRY else str(method))


def run_info_html(snap: dict) -> str:
    """Badge (greedy: identical or not), which execution mode ran, stop reasons."""
    parts = []
    if snap.get("error"):
        parts.append(message_html(snap["error"]))
    badge = snap.get("identical")
    if badge is not None:
        if badge["identical"]:
            parts.append("<span class='sv-badge sv-badge-ok'>✓ identical outputs: greedy speculative "
                         "decoding reproduced the target's own text token for token</span>")
        elif badge.get("verdict") == "near-tie":
            parts.append(
                f"<span class='sv-badge sv-badge-info'>≈ outputs differ from token {badge['first_diff'] + 1} "
                f"at a numerical near-tie: the target's top two logits there are {badge['gap']:.3g} apart "
                f"(≤ {badge['threshold']:g}, a few rounding steps of its precision), and a (γ+1)-token "
                "forward pass rounds differently from a one-token one</span>")
        else:
            first = badge.get("first_diff")
            gap = badge.get("gap")
            why = (f"the target's top-2 logit gap there is {gap:.3g}, above the near-tie threshold "
                   f"{badge['threshold']:g}: not a rounding effect" if gap is not None else
                   "no logit gap recorded to tell a near-tie from a bug")
            parts.append(
                "<span class='sv-badge sv-badge-diff'>≠ outputs differ"
                + (f" from token {first + 1}" if first is not None else "") + f" ({esc(why)})</span>")
    elif snap.get("finished") and not snap.get("greedy"):
        parts.append("<span class='sv-badge sv-badge-info'>sampled run (temperature &gt; 0): the two "
                     "texts differ by chance, but both follow the target's distribution</span>")
    mode = snap.get("mode")
    if mode == "fair":
        parts.append("<span class='sv-mode'>mode: <b>fair</b>, each side timed alone on its own virtual "
                     "clock; both shown on one shared clock</span>")
    elif mode == "parallel":
        parts.append("<span class='sv-mode'>mode: <b>parallel</b>, both sides ran at once and shared the "
                     "hardware, so timings include contention</span>")
    method = snap.get("method")
    if method and method != "draft":
        settings = setup_text(method, snap.get("options"))  # "L 12 · an untrained exit: …" (issue 51)
        parts.append(f"<span class='sv-mode'>guesses from: <b>{esc(guesses_from(method))}</b>"
                     + (f" · {esc(settings)}" if settings else "") + "</span>")
    if snap.get("note"):
        parts.append(f"<span class='sv-mode'>{esc(snap['note'])}</span>")
    return "<div class='sv-runinfo'>" + " ".join(parts) + "</div>"


def status_html(status: dict, extra: str = "") -> str:
    """Model loading status: progress while loading, error text, or the ready pair
    (`extra`: a line under it, e.g. the background calibration's state)."""
    def box(kind: str, role: str, dot: str, body: str) -> str:
        return (f"<div class='sv-status sv-status-{kind}' role='{role}'>"
                f"<span class='sv-dot sv-dot-{dot}'></span>{body}</div>")

    if status.get("loading"):
        pct = max(0.0, min(1.0, status.get("frac") or 0.0))
        return box("loading", "status", "busy",
                   f"<b>Loading models…</b> {esc(status.get('message') or '')}"
                   f"<div class='sv-bar'><div style='width:{pct * 100:.0f}%'></div></div>")
    err = status.get("error")
    if err and not status.get("ready"):
        return box("error", "alert", "bad", f"<b>Models could not be loaded.</b> {esc(err)}")
    ready = glossary.pair_html(status)  # plain words; the precision detail behind a disclosure
    if extra:
        ready += "<br>" + extra
    if err:
        return box("error", "alert", "bad", f"{esc(err)}<br>Still using: {ready}")
    return box("ready", "status", "ok", ready)


def message_html(text: str, kind: str = "error") -> str:
    dot = "busy" if kind == "loading" else kind  # loading: the pulsing dot of the models' load
    return (f"<div class='sv-status sv-status-{kind}' role='alert'><span class='sv-dot sv-dot-{dot}'></span>"
            f"{esc(text)}</div>")


def _outcome_css() -> str:
    out = []
    for o, colour in OUTCOME_COLOURS.items():
        cls = css_class(o)
        light = _LIGHT_LINES.get(o, colour)
        if o is Outcome.TARGET:  # an underline of its own: no tint, no text decoration
            out.append(f".{cls} {{ box-shadow: inset 0 -1px 0 {light}; }}")
            out.append(f".dark .{cls} {{ box-shadow: inset 0 -1px 0 {rgba(colour, 0.85)}; }}")  # 4.6:1
            continue
        out.append(f".{cls} {{ background: {rgba(colour, 0.24)}; text-decoration-color: {light}; }}")
        out.append(f".dark .{cls} {{ background: {rgba(colour, 0.34)}; "
                   f"text-decoration-color: {_DARK_LINES[o]}; }}")
    return "\n".join(out)


CSS = """
.prose.sv-pane { font-family: var(--font-mono, ui-monospace, SFMono-Regular, Menlo, Consolas, monospace);
  font-size: 13.5px; line-height: 1.75; white-space: pre-wrap; overflow-wrap: anywhere;
  min-height: 14em; max-height: 30em; overflow-y: auto; padding: 10px 12px !important;
  border: 1px solid var(--border-color-primary); border-radius: var(--radius-lg, 8px);
  background: var(--background-fill-secondary); }
.sv-pane-title { font-weight: 600; margin: 0 0 4px 2px; font-size: var(--text-md, 14px); line-height: 1.4; }
/* the title's block keeps its height: grown as the pane's twin, a short pane sat ~60 px lower */
.sv-pane-col > .block:first-child { flex-grow: 0 !important; }
.sv-prompt { opacity: .7; }  /* .5 was 3.0:1 in light mode (WCAG AA asks 4.5:1; ui/access.py) */
.sv-placeholder { opacity: .7; font-style: italic; font-family: var(--font, sans-serif); }
.sv-tok { border-radius: 3px; padding: 1px 0; color: inherit;
  text-decoration-thickness: 2px; text-decoration-skip-ink: none; }
.sv-rejected { text-decoration-line: line-through; opacity: .8; }
.sv-resampled { text-decoration-line: underline; text-underline-offset: 3px; }
.sv-bonus { font-weight: 700; text-decoration-line: overline; }
.sv-nl::before { content: "↵"; opacity: .45; }
.sv-special { font-size: .78em; opacity: .7; border: 1px dashed rgba(128,128,128,.7); padding: 0 3px; }
.sv-round + .sv-round { border-left: 1.5px solid rgba(128,128,128,.55); margin-left: 1px; padding-left: 1px; }
.sv-legend { display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 13px; align-items: center; }
.sv-legend-item { white-space: nowrap; }
.sv-legend-item .sv-tok { font-family: var(--font-mono, monospace); padding: 1px 4px; }
.sv-legend-text i { opacity: .7; }
.sv-hint { opacity: .7; font-style: italic; }
.sv-round-demo { display: inline-block; width: 0; height: 1.1em; vertical-align: middle;
  border-left: 1.5px solid rgba(128,128,128,.55); margin: 0 4px; }
.sv-stats { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
.sv-speedup { display: flex; flex-direction: column; align-items: center; justify-content: center;
  padding: 8px 16px; border-radius: 10px; border: 1px solid var(--border-color-primary); min-width: 9em;
  max-width: 26em; }
.sv-speedup-num { font-size: 2em; font-weight: 700; font-variant-numeric: tabular-nums; }
.sv-speedup-label { font-size: 12px; opacity: .8; }
.sv-speedup-copied { font-size: .45em; font-weight: 600; white-space: normal; }
.sv-speedup-alt { font-size: 13px; font-weight: 600; font-variant-numeric: tabular-nums; }
.sv-speedup-sub { font-size: 11.5px; opacity: .7; max-width: 24em; text-align: center; }
/* why a run lost, by its numbers (ui/why_lost.py): full contrast, it is the point of the line */
.sv-speedup-why { font-size: 12px; max-width: 24em; text-align: center; margin-top: 5px; }
.sv-loses { display: block; margin-top: 4px; }
/* a badge of several lines in the box: a pill's round ends pressed on its text (2026-11-28) */
.sv-speedup .sv-badge { border-radius: 10px; padding: 5px 12px; margin-top: 6px; text-align: center;
  max-width: 26em; }
.sv-speedup-mem { font-size: 12px; max-width: 22em; text-align: center; margin-top: 5px; padding: 2px 6px;
  border-radius: 6px; }
.sv-mem-copied { outline: 1.5px dashed #0072B2; outline-offset: -1px; }
.dark .sv-mem-copied { outline-color: #56B4E9; }
.sv-good { background: rgba(0,158,115,.14); }
.sv-bad { background: rgba(213,94,0,.12); }
.sv-table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
.sv-table th, .sv-table td { padding: 2px 10px; text-align: right;
  border-bottom: 1px solid var(--border-color-primary); }
.sv-table th[scope=row] { text-align: left; font-weight: 500; opacity: .85; }
.sv-chips { display: flex; flex-wrap: wrap; gap: 6px; flex: 1 1 15em; min-width: 15em; max-width: 26em; }
.sv-chip { padding: 2px 8px; border-radius: 999px; border: 1px solid var(--border-color-primary);
  font-size: 13px; font-variant-numeric: tabular-nums; cursor: help; }
.sv-runinfo { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; font-size: 13px;
              min-height: 1.5em; }
#sv-runinfo { scroll-margin-top: 8px; }  /* scrolled to on Run (ui/runqueue.py) */
.sv-badge { padding: 3px 10px; border-radius: 999px; font-weight: 600; }
.sv-badge-ok { background: rgba(0,158,115,.18); border: 1px solid #009E73; }
.sv-badge-diff { background: rgba(213,94,0,.15); border: 1px solid #D55E00; }
.sv-badge-info { background: rgba(0,114,178,.14); border: 1px solid #0072B2; font-weight: 500; }
.sv-mode { opacity: .8; }
.sv-status { padding: 6px 10px; border-radius: 8px; font-size: 13.5px;
             border: 1px solid var(--border-color-primary); }
.sv-status-error { background: rgba(213,94,0,.13); border-color: #D55E00; }
.sv-status-warning { background: rgba(230,159,0,.15); border-color: #E69F00; }
.sv-status-loading { background: rgba(0,114,178,.10); }
.sv-dot { display: inline-block; width: .65em; height: .65em; border-radius: 50%; margin-right: .45em;
  vertical-align: baseline; background: #999; }
.sv-dot-ok { background: #009E73; }
.sv-dot-bad, .sv-dot-error { background: #D55E00; border-radius: 2px; transform: rotate(45deg); }
.sv-dot-warning { background: #E69F00; }
.sv-dot-info { background: #0072B2; }
.sv-dot-busy { background: #0072B2; animation: sv-pulse 1s ease-in-out infinite alternate; }
@keyframes sv-pulse { from { opacity: .3; } to { opacity: 1; } }
.sv-bar { height: 6px; border-radius: 3px; background: rgba(128,128,128,.25); margin-top: 6px;
          overflow: hidden; }
.sv-bar > div { height: 100%; background: #0072B2; transition: width .3s; }
.sv-explainer { font-size: 14px; line-height: 1.55; }
.sv-explainer .sv-tok { padding: 1px 3px; }
.sv-replay-banner { padding: 8px 12px; margin-bottom: 6px; border-radius: 8px; font-size: 14px;
  background: rgba(204,121,167,.16); border: 1.5px dashed #CC79A7; }
.sv-live-banner { padding: 6px 12px; margin-bottom: 6px; border-radius: 8px; font-size: 13px;
  background: rgba(0,114,178,.08); border: 1px dashed #0072B2; }
.sv-theory-numbers { flex-wrap: nowrap; align-items: center; }
.sv-theory-text { font-size: 14px; line-height: 1.55; max-width: 60em; }
.sv-theory-measured { font-size: 14px; }
/* the p/q inspector (ui/inspector.py) */
#sv-speculative .sv-tok[data-r] { cursor: pointer; }
.sv-picked { outline: 2px solid #CC79A7; outline-offset: 1px; }
.sv-insp { font-size: 13.5px; line-height: 1.6; }
.sv-insp code { white-space: pre; }  /* a token of three spaces showed as one */
.sv-insp-gauge { position: relative; height: 12px; max-width: 28em; margin: 4px 0 0;
  border-radius: 3px; background: rgba(213,94,0,.25); }
.sv-insp-accept { position: absolute; left: 0; top: 0; bottom: 0; background: rgba(0,158,115,.55);
  border-radius: 3px 0 0 3px; }
.sv-insp-u { position: absolute; top: -3px; bottom: -3px; width: 3px; margin-left: -1px;
  background: currentColor; }
.sv-insp-scale { display: flex; justify-content: space-between; max-width: 28em; font-size: 11px;
  opacity: .7; }
.sv-vcurve { display: inline-flex; align-items: center; gap: 6px; border-radius: 8px; }
.sv-vcurve svg { display: block; }
"""


def page_css() -> str:
    from .stage import CSS as STAGE_CSS
    return CSS + "\n" + _outcome_css() + access.CSS + STAGE_CSS + draft_source.CSS
