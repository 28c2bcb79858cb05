"""Words for a newcomer (issue 51): the model-pair line in plain words with its technical
detail behind a disclosure, and one glossary of every abbreviation the page uses, shown
under the keys help to every visitor. Each term also carries its meaning on hover (<abbr>)."""
from __future__ import annotations

import html
import re

esc = html.escape

# every abbreviation on the page, once: (term, meaning)
TERMS = (
    ("γ", "draft length: how many tokens the draft guesses per round (a tree's depth; lookahead's n-gram "
          "length)"),
    ("α, α̂", "α: the theory's acceptance rate, the chance that one drafted token passes the target's "
             "check (Leviathan et al.); α̂: the expected acceptance this run measured, from the target's and "
             "the draft's probabilities p and q"),
    ("accepted ÷ drafted", "the share of drafted tokens kept; tokens after a round's first rejection are "
                           "never checked and count as not kept"),
    ("accepted ÷ tested", "per draft position: the share accepted of the guesses the target tested there "
                          "(a guess after the round's first rejection is never tested)"),
    ("τ", "tokens gained per target forward pass (per verification round)"),
    ("c", "the cost of one draft step, as a fraction of one plain target step"),
    ("v", "the cost of one verification pass (γ+1 tokens at once), in plain target steps"),
    ("p, q", "the target's (p) and the draft's (q) probability of a token"),
    ("L, skip", "early exit's exit layer (the draft runs the target's first L layers); layer skip's skipped "
                "layers, numbered from 0"),
    ("W, G", "lookahead's window (columns of tokens guessed in parallel) and guesses (n-grams of γ+1 tokens "
             "from its pool, checked in the same pass)"),
    ("w4a8", "4-bit weights, 8-bit activations (likewise w8a8: 8-bit weights and activations)"),
    ("7-bit per-token activations", "w8a8's activations (the numbers passed from layer to layer) rounded to "
                                    "7-bit integers with one scale per token; w4a8's are 8-bit per-block "
                                    "activations: one scale per block of 256 numbers"),
    ("int4, int8", "weights stored as 4- or 8-bit integers with a scale, instead of floating point"),
    ("g32", "weights quantised in groups of 32 that share one scale"),
    ("bf16, fp32", "16-bit (bfloat16) and 32-bit floating point"),
    ("tok/s", "output tokens per second"),
    ("speedup", "the speculative side's tok/s ÷ the baseline's, each over its whole run, its prompt read "
                "included (a visitor waits for it too); the box shows the figure without the prompt read "
                "beside it"),
)
MEANING = {t: m for t, m in TERMS}


def abbr(term: str, shown: str | None = None) -> str:
    """The term with its meaning on hover."""
    return f"<abbr title='{esc(MEANING[term])}'>{esc(shown or term)}</abbr>"


def glossary_html(keys: str = "") -> str:
    """The glossary disclosure; `keys` (the keys line's HTML) heads it, for narrow screens, where the
    keys line itself is hidden (ui/stage.py CSS)."""
    rows = "".join(f"<dt>{esc(t)}</dt><dd>{esc(m)}</dd>" for t, m in TERMS)
    if keys:
        rows = f"<dt class='sv-glossary-keys'>Keys</dt><dd class='sv-glossary-keys'>{keys}</dd>" + rows
    # the term list and the pointer to the glossary (sv-gl-more) are left out on a phone (ui/stage.py CSS)
    return (f"<details class='sv-glossary' id='sv-glossary'><summary>Glossary{' and keys' if keys else ''}"
            f"<span class='sv-gl-more'>: γ, α̂, τ, c, v, w4a8…</span></summary><dl>{rows}</dl></details>")


def _bits(precision: str) -> str:
    """'int4 g32 weights, 8-bit per-block activations' -> '4-bit weights'; '' when unreadable."""
    p = precision.lower()
    m = re.search(r"\bw(\d+)a\d+\b", p) or re.search(r"\bint(\d+)\b", p) or re.search(r"\bq(\d+)", p)
    if m:
        return f"{m[1]}-bit weights"
    if "bfloat16" in p or "bf16" in p or "float16" in p or "fp16" in p:
        return "16-bit floating-point weights"
    if "float32" in p or "fp32" in p:
        return "full-precision (32-bit) weights"
    return ""


def plain_weights(precision: str) -> str:
    """A precision label in plain words: 'int4 g32 weights, 8-bit per-block activations' -> '4-bit
    weights'; 'target int8 weights, …, draft int4 g32 weights, …' -> 'target 8-bit, draft 4-bit weights'
    (one phrase when both sides agree); '' when unreadable."""
    p = str(precision or "")
    head, sep, draft = p.partition(", draft ")
    if sep and head.lower().startswith("target "):
        t, d = _bits(head), _bits(draft)
        if t == d or not d:
            return t
        if not t:
            return f"draft {d}"
        return f"target {t.removesuffix(' weights')}, draft {d}"
    return _bits(p)


def draft_weights(precision: str) -> str:
    """The draft model's weights in a pair's precision label, in plain words: 'target int8 weights, …,
    draft int4 g32 weights, …' -> '4-bit weights'; a label of one precision for both: that one."""
    head, sep, draft = str(precision or "").partition(", draft ")
    return _bits(draft if sep else head)


def recorded_date(meta: dict) -> str:
    """The day a recording was made ('2026-11-23'), from its own 'recorded' field; '' when it has none."""
    raw = str(meta.get("recorded") or "")
    return raw[:10] if re.match(r"\d{4}-\d{2}-\d{2}", raw) else raw


def recorded_on(meta: dict) -> str:
    """Where, in what precision and when a shipped or uploaded recording was made, in plain words, from
    its own metadata: 'recorded on AMD EPYC (2 cores), 8-bit weights, 2026-11-23'. A part the recording
    lacks is said to be missing, never guessed ('recorded on another machine'; issue 71: the busy banner
    offered a 2026-11-23 int8 run as "the true timings" beside a live 4-bit pair twice as fast)."""
    meta = meta if isinstance(meta, dict) else {}
    machine = str(meta.get("hardware") or meta.get("machine") or "")
    words = plain_weights(str(meta.get("precision") or ""))
    date = recorded_date(meta)
    return (f"recorded on {machine or 'another machine'}"
            + (f", {words}" if words else ", precision not recorded")
            + (f", {date}" if date else ", date not recorded"))


def plain_precision(precision: str, note: str, device: str, calibration: str = "") -> str:
    """'4-bit weights, measured fastest on this CPU' (the note's timings are that measurement).
    `calibration` (the pair's: untimed, noisy, …) has the last word, so this line and the background
    calibration's line below it (ui/busy.py calib_html) say the same (issue 59: "measured fastest on
    this CPU" above "a safe default, not timed yet")."""
    where = "this GPU" if device.lower().startswith(("cuda", "gpu")) else "this CPU"
    bits = _bits(precision) or "its precision"
    timed = ("ms/step" in note or " vs " in note) and calibration != "untimed"
    if timed and calibration == "noisy":
        return f"{bits}, timed on {where} while it was busy"
    if timed:
        return f"{bits}, measured fastest on {where}"
    return f"{bits} (not timed on {where}: a safe default)" if note or precision else ""


def short_label(label: str) -> str:
    """A local folder by its last name ("…/target"), Hub ids ("Qwen/Qwen2.5-Coder-1.5B") as they are.
    Why: a phone's pair line wrapped /tmp/.../target over three lines and pushed Run below an
    800 px screen (CI, 2026-11-28: Run ended at y 812); the full label stays in the tooltip."""
    parts = []
    for part in label.split(" + "):
        bits = [b for b in part.split("/") if b]
        parts.append(f"…/{bits[-1]}" if len(bits) > 2 else part)
    return " + ".join(parts)


def pair_html(status: dict) -> str:
    """The ready status: 'Model pair: X on cpu · 4-bit weights, measured fastest on this CPU',
    the precision and timings that say so behind a disclosure."""
    device = str(status.get("device") or "")
    precision, note = str(status.get("precision") or ""), str(status.get("precision_note") or "")
    plain = plain_precision(precision, note, device, str(status.get("calibration") or ""))
    label = str(status.get("label") or "")
    line = (f"Model pair: <b title='{esc(label)}'>{esc(short_label(label))}</b> on {esc(device)}"
            + (f" · {esc(plain)}" if plain else ""))
    detail = [x for x in (precision, note) if x]
    if detail:
        body = "<br>".join(f"<small>{esc(x)}</small>" for x in detail)
        line += (f"<details class='sv-pair-detail'><summary>precision and timings<span class='sv-gl-more'> "
                 f"(the glossary at the top explains w4a8, g32, int4…)</span></summary>{body}</details>")
    if status.get("note"):  # what this pair cannot do (another engine's limits): stays in sight
        line += f"<small class='sv-pair-note'>{esc(status['note'])}</small>"
    return line
