"""Where a free draft came from (issue 52): a round whose drafts were copied from text by a
suffix tree (RoundEvent.info["drafter"] == "suffix", engine/proposers/suffix.py and hybrid.py)
is marked in the speculative pane and in the round charts, and hovering its tokens shows the
source and highlights it: a line of the prompt, earlier tokens of this output, or an earlier
run or preset output remembered for this visitor (its label and text, in a card).

Pure functions of events, like render.py. Every field goes into an escaped attribute; the
pane's script (SOURCE_JS, part of inspector.PANE_JS) builds the card with textContent only,
so nothing in a source can become markup. The mark is a quote sign (❝) before the round and a
dashed box around its drafted tokens (not colour alone); blue in light, sky blue in dark mode
(Okabe-Ito).
"""
from __future__ import annotations

import html

from ..engine.events import Outcome
from .escape import esc

SUFFIX = "suffix"  # info["drafter"] of a round drafted from a suffix tree
# the methods that draft from text (engine/proposers/suffix.py, hybrid.py): priced per round by v(k),
# no chain-formula prediction (the speedup box) and no point on the theory charts
FREE_DRAFTS = ("suffix", "hybrid", "suffix-tree", "hybrid-tree")
# the chain methods whose suffix tree also reads earlier runs' outputs (suffix_tree.Memory); the tree
# modes copy from this run's own text only
READS_MEMORY = ("suffix", "hybrid")
COPY_SIGN = "❝"
WHERE_WORDS = {"prompt": "the prompt", "output": "this output", "memory": "an earlier output"}


def from_text(info: dict | None) -> bool:
    """True for a round whose draft was copied from text (a suffix-tree draft)."""
    return isinstance(info, dict) and info.get("drafter") == SUFFIX


def source_of(info: dict | None) -> dict:
    """The round's source dict, {} when none (a plain step, a model draft, a forgotten memory)."""
    src = info.get("source") if isinstance(info, dict) else None
    return src if isinstance(src, dict) else {}


def from_memory(info: dict | None) -> bool:
    """A copied round whose draft came from an earlier run's output (the visitor's own, or a preset's):
    not from this run's prompt or output. A copied round whose source was forgotten since (evicted
    from the memory) came from there too: this run's own text always has a source."""
    return from_text(info) and source_of(info).get("where", "memory") == "memory"


def memory_tokens(rounds) -> int:
    """Tokens of the output that were drafts copied from earlier runs' outputs and accepted by the
    target (a round's resampled or bonus token is the target's own, never counted)."""
    return sum(1 for r in rounds if from_memory(r.info) for t in r.tokens if t.outcome is Outcome.ACCEPTED)


def drafter_counts(rounds) -> dict:
    """Rounds per drafter of a suffix or hybrid run: {'suffix': copied, 'model': draft model, 'none':
    plain steps}; {} for a method whose rounds do not say."""
    out: dict = {}
    for r in rounds:
        who = r.info.get("drafter") if isinstance(r.info, dict) else None
        if who in ("suffix", "model", "none"):
            out[who] = out.get(who, 0) + 1
    return out


def _int(x) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def where_line(info: dict | None) -> str:
    """'the prompt, line 12' / 'your earlier run 2, line 3' / 'a source no longer remembered'."""
    src = source_of(info)
    if not src:
        return "a source no longer remembered"
    label = str(src.get("label") or WHERE_WORDS.get(src.get("where"), "text"))
    line = _int(src.get("line_no"))
    return label + (f", line {line}" if line else "")


def priced_line(info: dict | None) -> str:
    """hybrid: why the copied draft won ('' where a round was not priced)."""
    rs, rm = (info or {}).get("rate_suffix"), (info or {}).get("rate_model")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (rs, rm)):
        return ""
    return (f"chosen over the draft model: {rs:.2f} vs {rm:.2f} expected tokens per plain step of cost "
            "(measured v(k) and c)")


def round_class(info: dict | None) -> str:
    """The class attribute of a round's span: 'sv-round', plus 'sv-from-text' for a copied draft."""
    return "sv-round sv-from-text" if from_text(info) else "sv-round"


def round_data(info: dict | None) -> str:
    """data-* attributes of a copied round's span (the pane's script reads them on hover); '' otherwise."""
    if not from_text(info):
        return ""
    src = source_of(info)
    n = (_int(src.get("end")) or 0) - (_int(src.get("start")) or 0)
    fields = {"where": src.get("where", ""), "from": where_line(info), "text": src.get("text", ""),
              "span": src.get("span", ""), "n": n if n > 0 else "", "match": info.get("match_len", ""),
              "why": priced_line(info)}
    return "".join(f' data-src-{k}="{esc(v)}"' for k, v in fields.items() if v not in (None, ""))


def legend_item() -> str:
    return ('<span class="sv-legend-item" role="listitem"><span class="sv-from-text sv-legend-copy">'
            '<span class="sv-tok sv-accepted">copied</span></span> '
            '<span class="sv-legend-text"><b>copied</b>: drafted from text a suffix tree found (no model) '
            '<i>(❝ and a dashed box; hover for its source)</i></span></span>')


def chart_hover(info: dict | None) -> str:
    """The round charts' hover line for a round ('copied from the prompt, line 3' or the drafter)."""
    if from_text(info):
        return "copied from " + html.escape(where_line(info))
    drafter = info.get("drafter") if isinstance(info, dict) else None
    return {"model": "draft model", "none": "no draft: a plain step"}.get(drafter, "")


# one delegated hover listener on the speculative pane (appended to inspector.PANE_JS)
SOURCE_JS = """
(() => {
  const card = document.createElement('div');
  card.className = 'sv-src-card';
  card.setAttribute('role', 'tooltip');
  card.hidden = true;
  document.body.appendChild(card);  // outside the pane: a streamed update replaces the pane's content
  const clear = () => {
    document.querySelectorAll('.sv-src-hit').forEach(x => x.classList.remove('sv-src-hit'));
    card.hidden = true;
  };
  // mark the elements of `els` whose text overlaps the last occurrence of `needle` in their joined text
  const mark = (els, needle) => {
    if (!needle) return false;
    const texts = els.map(x => x.textContent);
    const joined = texts.join('');
    const at = joined.lastIndexOf(needle);
    if (at < 0) return false;
    let pos = 0;
    els.forEach((x, i) => {
      const end = pos + texts[i].length;
      if (end > at && pos < at + needle.length) x.classList.add('sv-src-hit');
      pos = end;
    });
    return true;
  };
  element.addEventListener('mouseover', (e) => {
    const tok = e.target.closest('.sv-from-text > .sv-tok');
    if (!tok) return;
    const r = tok.parentElement;
    if (card.dataset.round === r.dataset.round && !card.hidden) return;
    clear();
    const d = r.dataset;
    card.dataset.round = d.round;
    card.replaceChildren();
    const head = document.createElement('div');
    head.className = 'sv-src-head';
    head.textContent = '\u275d copied ' + (d.srcN ? d.srcN + ' tokens ' : '') + 'from '
      + (d.srcFrom || 'text') + (d.srcMatch ? ' (its context matched ' + d.srcMatch + ' tokens)' : '');
    const body = document.createElement('pre');
    const text = d.srcText || '', span = d.srcSpan || '';
    const i = span ? text.indexOf(span) : -1;
    if (i >= 0) {
      const m = document.createElement('mark');
      m.textContent = span;
      body.append(text.slice(0, i), m, text.slice(i + span.length));
    } else {
      body.textContent = text || span;
    }
    card.append(head, body);
    if (d.srcWhy) {  // hybrid: the pricing that chose the copied draft
      const why = document.createElement('div');
      why.className = 'sv-src-why';
      why.textContent = d.srcWhy;
      card.append(why);
    }
    if (d.srcWhere === 'output') {  // earlier output tokens of this pane, before this round
      const rounds = Array.from(element.querySelectorAll('.sv-round'));
      const upto = rounds.indexOf(r);
      const toks = rounds.slice(0, upto)
        .flatMap(x => Array.from(x.querySelectorAll('.sv-tok:not(.sv-rejected)')));
      mark(toks, span);
    } else if (d.srcWhere === 'prompt') {  // the prompt's lines (render.prompt_span)
      const lines = Array.from(element.querySelectorAll('.sv-prompt .sv-pl'));
      mark(lines, text) || mark(lines, span);
    }
    const box = tok.getBoundingClientRect();
    card.hidden = false;
    card.style.left = Math.max(4, Math.min(box.left, window.innerWidth - card.offsetWidth - 8)) + 'px';
    card.style.top = (box.bottom + 6) + 'px';
  });
  element.addEventListener('mouseleave', clear);
  element.addEventListener('mouseout', (e) => {
    if (!e.relatedTarget || !e.relatedTarget.closest || !e.relatedTarget.closest('.sv-from-text')) clear();
  });
})();
"""

CSS = """
/* drafts copied from text (ui/draft_source.py): a copy sign before the round, a dashed box per draft */
.sv-from-text::before { content: "❝"; color: #0072B2; font: 700 1em sans-serif; margin: 0 1px; }
.sv-from-text > .sv-accepted, .sv-from-text > .sv-rejected { outline: 1.5px dashed #0072B2;
  outline-offset: -1px; }
.dark .sv-from-text::before { color: #56B4E9; }
.dark .sv-from-text > .sv-accepted, .dark .sv-from-text > .sv-rejected { outline-color: #56B4E9; }
.sv-legend-copy::before { margin-right: 3px; }
.sv-src-hit { outline: 2px solid #0072B2; background: rgba(240, 228, 66, .45); border-radius: 3px; }
.dark .sv-src-hit { outline-color: #56B4E9; background: rgba(240, 228, 66, .28); }
.sv-src-card { position: fixed; z-index: 1000; max-width: min(46em, 90vw); padding: 6px 10px;
  border-radius: 8px; border: 1.5px solid #0072B2; background: var(--background-fill-primary, #fff);
  color: var(--body-text-color, inherit); box-shadow: 0 4px 14px rgba(0,0,0,.25); font-size: 12.5px;
  white-space: normal; pointer-events: none; }
.dark .sv-src-card { border-color: #56B4E9; background: var(--background-fill-primary, #1f2937); }
.sv-src-card[hidden] { display: none; }
.sv-src-head { font-family: var(--font, sans-serif); font-weight: 600; margin-bottom: 3px; }
.sv-src-why { margin-top: 3px; opacity: .8; font-family: var(--font, sans-serif); }
.sv-src-card pre { margin: 0; white-space: pre-wrap; overflow-wrap: anywhere;
  font-family: var(--font-mono, monospace); }
.sv-src-card mark { background: rgba(240, 228, 66, .6); color: inherit; outline: 1.5px solid #0072B2;
  border-radius: 2px; }
.dark .sv-src-card mark { background: rgba(240, 228, 66, .3); outline-color: #56B4E9; }
"""
