"""Stage mode and the page's keyboard: `?stage=1` (any visitor) or `app.py --stage`
(everyone). Large type in the panes and numbers (read from the back of a hall
at 1280×720), the explainer and settings collapsed, the keyboard shortcuts on
the page, and a replay one key away if anything goes wrong.

The keys work on every page, outside text fields: R run, S or Esc stop,
P replay the selected recorded run, N next preset; they and a glossary are
listed beside the title for every visitor (issue 51). The same script tells a
visitor when a number typed or pasted into any slider's box (every tab's) was out
of range and got clamped, and puts the clamped value in the box (issue 21: 99 became
16 without a word; issue 71: the race and theory tabs' boxes were still silent), moves
the method selector with the arrow keys, gives the focus back to Run after a run,
and closes older toasts on the next press.
"""
from __future__ import annotations

from . import access
from .glossary import glossary_html

KEYS = (("R", "run"), ("S / Esc", "stop"), ("P", "replay"), ("N", "next preset"),
        ("Tab", "prompt → Run → Stop"), ("← →", "method"))


def keys_html(stage: bool = False) -> str:
    """The keys and the glossary, for every visitor (issue 51: the keys were listed in stage mode
    only). `stage` is kept for callers; both modes show the same line."""
    keys = " · ".join(f"<kbd>{k}</kbd> {what}" for k, what in KEYS)
    return (f"<div class='sv-help'><div class='sv-keys' id='sv-keys' role='note' aria-label='keyboard "
            f"shortcuts'><b>Keys</b> {keys}{access.KEYS_OFF}</div>{glossary_html(keys)}</div>")


# runs once in the browser at page load (demo.load js): stage mode, the keys, the clamp notes
PAGE_JS = """() => {
  const forced = %(forced)s;
  const stage = forced || new URLSearchParams(location.search).get('stage') === '1';
  const root = document.querySelector('.gradio-container') || document.body;
  // a phone: the explainer starts folded, so Run is on the first screen (issue 51)
  if (!stage && window.innerWidth <= 720) {
    const fold1 = () => { const b = document.querySelector('#sv-explainer .label-wrap');
      if (b && b.classList.contains('open')) b.click(); };
    setTimeout(fold1, 100); setTimeout(fold1, 1500);
  }
  // the method selector: gradio names each radio apart, so arrow keys did not move it (issue 51)
  document.addEventListener('keydown', (e) => {
    const groups = '#sv-method, #sv-replay-speed, #sv-th-vmode';  // the replay's speed, the theory's v
    const box = e.target && e.target.closest && e.target.closest(groups);
    const step = {ArrowDown: 1, ArrowRight: 1, ArrowUp: -1, ArrowLeft: -1}[e.key];
    if (!box || !step || e.target.type !== 'radio') return;
    const all = [...box.querySelectorAll('input[type=radio]')].filter((r) => !r.disabled);
    const next = all[(all.indexOf(e.target) + step + all.length) %% all.length];
    if (next) { next.focus(); next.click(); }
    e.preventDefault();
  }, true);
  if (stage) {
    root.classList.add('sv-stage');
    const keys = document.querySelector('#sv-keys');
    if (keys) keys.style.display = 'flex';
    // fold the explainer and the settings: the panes and numbers fill the screen
    const fold = () => document.querySelectorAll('#sv-explainer, #sv-more, #sv-replay, #sv-pair')
      .forEach(acc => { const b = acc.querySelector('button.label-wrap, .label-wrap');
        if (b && b.classList.contains('open')) b.click(); });
    setTimeout(fold, 300); setTimeout(fold, 3000);
  }
  const click = (sel) => { const b = document.querySelector(sel); if (b && !b.disabled) b.click(); };
  // a run's press focuses Stop (ui/runqueue.py PRESS_JS sets svFocusBack); Run takes the focus
  // back once it is "▶ Run" again, unless the visitor moved it elsewhere meanwhile (issue 51)
  setInterval(() => {
    if (!window.svFocusBack || Date.now() - window.svFocusBack < 400) return;
    const run = document.querySelector('#sv-run');
    if (!run || run.disabled || !run.textContent.trim().startsWith('▶')) return;
    const a = document.activeElement;
    // no scroll: focus() brought the settings back over the finished run's headline (a stage pass,
    // 2026-11-28: scrollY 1902 to 257 at 1280x720 the moment the run ended)
    if (!a || a === document.body || a.id === 'sv-stop') run.focus({preventScroll: true});
    window.svFocusBack = 0;
  }, 150);
  // an older toast goes when the visitor acts again: gradio stacks same-kind toasts as
  // "Error (2)" and stops timing them out, so they piled up (issue 51)
  const closeToasts = () => document.querySelectorAll('.toast-wrap [data-testid="toast-close"]')
    .forEach((b) => b.click());
  document.addEventListener('click', (e) => {
    const b = e.target && e.target.closest && e.target.closest('button');
    if (b && !b.closest('.toast-wrap')) closeToasts();
  }, true);
  // ← → outside a text field: the next or previous method on the live tab, its settings opened so
  // the change shows (issue 59: the keys line's "← → method" worked only once a radio, folded
  // inside More settings, had the focus); the picked radio takes the focus, so the keys go on.
  // Called on the live tab only (the keys' handler below checks)
  const svMethod = (step, tries = 10) => {
    const more = document.querySelector('#sv-more .label-wrap');
    if (more && !more.classList.contains('open') && tries === 10) more.click();
    const all = [...document.querySelectorAll('#sv-method input[type=radio]')].filter((r) => !r.disabled);
    if (!all.length || !all[0].offsetParent) {  // drawn once the fold opens
      if (tries > 0) setTimeout(() => svMethod(step, tries - 1), 50);
      return;
    }
    const at = all.findIndex((r) => r.checked);
    const next = all[(at + step + all.length) %% all.length];
    next.focus(); next.click();
  };
  // the panes follow their newest tokens while a run or replay streams, unless the visitor scrolled
  // up in one (issue 59: after an edit preset's run both panes stayed at the top, showing the long
  // prompt, with the output below their fold); a press of Run, Play or Run race follows again
  const follow = new Map();  // pane scroller -> [following, tokens seen]
  const scroller = (root) => root && (root.matches('.prose') ? root : root.querySelector('.prose'));
  const panes = '#sv-baseline, #sv-speculative, #sv-lb-baseline, #sv-lb-speculative';
  new MutationObserver(() => document.querySelectorAll(panes).forEach((root) => {
    const e = scroller(root);
    if (!e) return;
    if (!follow.has(e)) {
      follow.set(e, [true, 0]);
      e.addEventListener('scroll', () => {  // at the bottom (or our own scroll): follow on
        follow.get(e)[0] = e.scrollTop + e.clientHeight >= e.scrollHeight - 24; });
    }
    const st = follow.get(e), n = e.querySelectorAll('.sv-tok').length;
    if (n !== st[1]) { st[1] = n; if (st[0]) e.scrollTop = e.scrollHeight; }  // new tokens, not a hover card
  })).observe(document.body, {childList: true, subtree: true});
  // the run's line and panes on screen when they are off it (a run's press, ui/runqueue.py PRESS_JS,
  // and a replay's)
  window.svShowRun = () => {
    const info = document.querySelector('#sv-runinfo');
    const r = info && info.getBoundingClientRect();
    if (r && (r.top < 0 || r.top > window.innerHeight * 0.6))
      info.scrollIntoView({behavior: 'smooth', block: 'start'});
  };
  document.addEventListener('click', (e) => {
    if (e.target && e.target.closest && e.target.closest('#sv-run, #sv-replay-play, #sv-lb-run'))
      follow.forEach((st) => { st[0] = true; });
    // a replay plays in the live run's panes: bring them on screen too (P played below the fold, the
    // folded section it opened pushing the panes further down)
    if (e.target && e.target.closest && e.target.closest('#sv-replay-play'))
      setTimeout(window.svShowRun, 300);
  }, true);
  // replay the selected recorded run; the replay section may be folded: open it first
  window.svReplay = () => {
    const play = document.querySelector('#sv-replay-play');
    if (play && play.offsetParent) { play.click(); return; }
    const head = document.querySelector('#sv-replay .label-wrap');
    if (head) head.click();
    setTimeout(() => click('#sv-replay-play'), 500);
  };
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (t && (t.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(t.tagName))) {
      if (e.key === 'Escape') t.blur();
      return;
    }
    if (window.svKeysOff && window.svKeysOff()) return;  // turned off beside the keys (ui/access.py)
    const k = e.key.toLowerCase();
    // the live tab's keys act only while it shows: on the theory tab R started a live run unseen,
    // and S stopped a replay (an accessibility pass, 2026-11-28); on the race tab S stops the race
    const shown = (sel) => { const b = document.querySelector(sel); return b && b.offsetParent; };
    const live = shown('#sv-run');
    if ((k === 'arrowleft' || k === 'arrowright') && live) svMethod(k === 'arrowright' ? 1 : -1);
    else if (k === 'r' && live) click('#sv-run');
    else if ((k === 's' || k === 'escape') && (live || shown('#sv-lb-stop')))
      click(live ? '#sv-stop' : '#sv-lb-stop');
    else if (k === 'p' && live) window.svReplay();
    else if (k === 'n' && live) click('#sv-next-preset');
    else return;
    e.preventDefault();
  });
  // a number typed outside a slider's range: the slider clamps it, say so under it. The typed value is
  // kept as typed (capture phase, before the slider's own handler): the slider may clamp before the
  // box commits, and a clamp back to the value it had (top-k 0, typed -5) fires no change event at
  // all, so the check also runs on Enter and on leaving the box (the top-k test saw the note in 3 of 6 tries)
  // Every slider's box: the race and theory tabs' were left out and clamped in silence (issue 71: on the
  // race tab 100000 typed then Tab became 512 without a word, and Enter kept 100000 in the box). Named
  // here, or by the label's first words ("Tree budget (nodes)": tree budget)
  const names = {'sv-gamma': 'γ', 'sv-max-new': 'max new tokens', 'sv-temperature': 'temperature',
                 'sv-top-p': 'top-p', 'sv-top-k': 'top-k', 'sv-lb-gamma': 'γ',
                 'sv-lb-max-new': 'max new tokens', 'sv-lb-temperature': 'temperature',
                 'sv-th-alpha': 'α', 'sv-th-gamma': 'γ', 'sv-th-c': 'c'};
  const numberIn = (box) => {
    if (!box || box.type !== 'number' || !box.closest) return null;
    const block = box.closest('.block');
    return block && block.querySelector('input[type=range]') ? block : null;
  };
  const nameOf = (block) => {
    const label = block.querySelector('[data-testid=block-info]');
    const words = label ? label.textContent.split('(')[0].trim() : '';
    return names[block.id] || (words ? words.charAt(0).toLowerCase() + words.slice(1) : 'this value');
  };
  document.addEventListener('input', (e) => {
    if (numberIn(e.target)) e.target.dataset.svTyped = e.target.value;
  }, true);
  const check = (e) => {
    const box = e.target, block = numberIn(box);
    if (!block || box.dataset.svTyped === undefined) return;
    const range = block.querySelector('input[type=range]');
    const lo = Number(range ? range.min : box.min), hi = Number(range ? range.max : box.max);
    const raw = box.dataset.svTyped;
    delete box.dataset.svTyped;
    const typed = raw === '' ? NaN : Number(raw);
    let note = block.querySelector('.sv-clamp');
    if (!note) { note = document.createElement('div'); note.className = 'sv-clamp'; block.appendChild(note); }
    if (Number.isFinite(typed) && (typed < lo || typed > hi)) {
      const set = typed < lo ? lo : hi;
      note.textContent = `${nameOf(block)} must be ${lo}–${hi}: ${typed} was set to ${set}`;
      // the box shows the value the run uses (it kept the typed -5, issue 51)
      if (box.value !== String(set)) {
        box.value = String(set);
        box.dispatchEvent(new Event('input', {bubbles: true}));
        delete box.dataset.svTyped;  // that input was ours
      }
    } else { note.textContent = ''; }
  };
  document.addEventListener('change', check, true);
  document.addEventListener('focusout', check, true);
  document.addEventListener('keydown', (e) => { if (e.key === 'Enter') check(e); }, true);
  return [];
}"""

CSS = """
.sv-keys { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: center; font-size: 14px;
  padding: 4px 10px; border-radius: 8px; border: 1px dashed var(--border-color-primary); }
.sv-keys kbd { font-family: var(--font-mono, monospace); padding: 0 6px; border-radius: 4px;
  border: 1px solid var(--border-color-primary); background: var(--background-fill-secondary); }
.sv-title-row { display: flex; flex-wrap: wrap; gap: 6px 24px; align-items: center; }
.sv-help { display: flex; flex-wrap: wrap; gap: 4px 10px; align-items: flex-start; margin-left: auto; }
.sv-keys { font-size: 13px; padding: 2px 10px; }
.sv-glossary { font-size: 13px; padding: 2px 10px; border-radius: 8px;
  border: 1px dashed var(--border-color-primary); }
.sv-glossary summary { cursor: pointer; }
.sv-glossary dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0; }
.sv-glossary dt { font-weight: 700; }
/* gradio 6.31 ships Source Sans Pro SemiBold (600) as a 5 KB file with a handful of glyphs: at 600 a
   "B" came from it and the rest from a fallback bold, so the baseline title's "B" looked lighter in
   every theme (issue 51). Its Bold file is whole, but the theme declares 400 and 600 only: declared
   here as 700 (gradio serves it at the path its own 600 rule uses), our bold text asks for 700. */
@font-face { font-family: "Source Sans Pro"; font-weight: 700; font-style: normal; font-display: swap;
  src: url('static/fonts/SourceSansPro/SourceSansPro-Bold.woff2') format('woff2'); }
.sv-pane-title, .sv-badge, .sv-src-head { font-weight: 700; }
.sv-glossary dd { margin: 0; }
.sv-glossary .sv-glossary-keys { display: none; }
.sv-pair-detail summary { cursor: pointer; font-size: 12.5px; opacity: .8; }
.sv-pair-note { display: block; }
.sv-pair-detail + br { display: none; }  /* the status box's next line follows the disclosure */
abbr[title] { text-decoration: underline dotted; cursor: help; }
#sv-run-row { align-items: stretch; }
.sv-ds-measured { font-size: 15px; padding: 8px 12px; margin: 4px 0 8px; border-radius: 8px;
  border-left: 4px solid #E69F00; background: var(--background-fill-secondary); }
.sv-clamp { font-size: 12.5px; color: #D55E00; min-height: 0; }
.dark .sv-clamp { color: #ff8a4c; }
/* layout (issue 21): whitespace tokens carry no underline (indentation read as underscores),
   the recorded-runs text stops before the dropdown's arrow, sliders keep their end labels */
.sv-target.sv-ws { box-shadow: none; }
/* a failed run's message is in the run info line: gradio's red "Error" label covered it */
#sv-runinfo [data-testid="status-tracker"]:has(.error) { display: none !important; }
#sv-replay-pick input { padding-right: 2.2em; text-overflow: ellipsis; }
#sv-gamma, #sv-max-new { overflow: visible; min-width: 11em; }
/* a pane shorter than its neighbour starts at the top (it sat centred, under a gap) */
.sv-pane-col { justify-content: flex-start !important; }
/* a phone (400 px): one chart a row, legend items wrap (titles and legends were cut off) */
@media (max-width: 720px) {
  .sv-chart-row { flex-wrap: wrap !important; }
  .sv-chart-row > * { min-width: 100% !important; }
  .sv-legend-item { white-space: normal; }
  /* Run on the first screen (issue 51): the keys move into the glossary's disclosure, the
     preset and prompt hints and the status lines get smaller */
  #sv-keys.sv-keys { display: none; }
  .sv-help .sv-glossary .sv-glossary-keys { display: block; }
  .sv-gl-more { display: none; }
  #sv-preset .info-text, #sv-prompt .info-text { display: none; }
  .sv-status { font-size: 13px; }
  .sv-header p { font-size: 14px; }
  .sv-busy-more { display: none; }  /* the busy banner's first sentence only (issue 59) */
}
"""
# large type for a hall, written `.sv-stage X` and scoped by staged() below
STAGE_RULES = """
.sv-stage .prose.sv-pane { font-size: 22px; line-height: 1.6; max-height: 17em; min-height: 8em; }
.sv-stage .sv-pane-title { font-size: 19px; }
.sv-stage .sv-speedup-num { font-size: 3.4em; }
.sv-stage .sv-speedup-label, .sv-stage .sv-speedup-sub { font-size: 15px; }
.sv-stage .sv-table { font-size: 18px; }
.sv-stage .sv-chip { font-size: 17px; }
.sv-stage .sv-runinfo, .sv-stage .sv-badge { font-size: 17px; }
.sv-stage .sv-keys { font-size: 17px; }
.sv-stage .sv-legend { font-size: 15px; }
.sv-stage .sv-header p { display: none; }
"""
# gradio repeats every custom rule scoped as `.gradio-container.gradio-container-<version> .contain X`,
# three classes over X, and .sv-stage sits on .gradio-container itself, outside .contain: so
# `.sv-stage X` lost to the scoped copy of the plain `X` rule (13.5 px panes on stage). Scoped as
# deep, a stage rule ties it and wins as the later rule (page_css puts this CSS last).
STAGE_SCOPE = ".gradio-container.sv-stage .contain "


def staged(rules: str) -> str:
    return rules.replace(".sv-stage ", STAGE_SCOPE)


CSS += staged(STAGE_RULES)


def next_preset(presets: list[dict]):
    """The N key: the preset after the selected one (its .change fills the prompt)."""
    import gradio as gr
    names = [p["name"] for p in presets]

    def pick(current):
        i = names.index(current) if current in names else -1
        return gr.Dropdown(value=names[(i + 1) % len(names)])
    return pick


def wire(demo, page, presets: list[dict], stage: bool) -> None:
    demo.load(None, None, None, js=PAGE_JS % {"forced": "true" if stage else "false"},
              api_visibility="private", queue=False)
    demo.load(None, None, None, js=access.PAGE_JS, api_visibility="private", queue=False)  # names, live line
    page.next_preset.click(next_preset(presets), page.preset, page.preset, api_visibility="private",
                           queue=False, show_progress="hidden")
