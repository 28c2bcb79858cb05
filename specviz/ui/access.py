"""What a keyboard or a screen reader gets from the page (an axe-core 4.14 audit and a Tab walk in
headless Chromium, 2026-11-28; the figures before and after are in the README):

- the panes are named regions, their titles headings; a rejected draft token is a deletion
  (render.token_span), so a screen reader does not read it as output;
- the speculative pane is one Tab stop: the arrow keys (Home, End) walk its tokens, each read as its
  outcome and text, and Enter or Space opens the p/q inspector, as a click does (the tokens took no
  focus: the inspector was mouse-only);
- the run line is a polite live region: "identical outputs" or "stopped by you" is said when it comes;
- each chart is a figure named by its title and its lines' last values (it read as an unnamed image
  of tick labels);
- text and lines reach WCAG AA contrast in light mode (the prompt echo was 3.0:1, gradio's subdued
  grey 1.9:1, the Run button's white on orange 2.8:1).
"""
from __future__ import annotations

# the one-key shortcuts (R, S, P, N, ← →) can be turned off, and stay off in this browser: speech input
# or a screen reader's own letter keys may type them (WCAG 2.1.4); ui/stage.py lists the keys
KEYS_OFF = ("<button type='button' id='sv-keys-off' class='sv-keys-off' aria-pressed='false' "
            "title='The one-key shortcuts act outside text fields; turn them off if your screen reader or "
            "voice control types letters'>turn keys off</button>")

# the speculative pane's keys (inspector.PANE_JS adds it to the pane's js_on_load; `element` is the pane)
PANE_KEYS_JS = """
element.tabIndex = 0;  // the scrolling box inside the named region (access.PAGE_JS)
element.setAttribute('role', 'group');
element.setAttribute('aria-label', 'speculative tokens: the arrow keys walk them, Enter opens the inspector');
const svWords = {accepted: 'accepted draft', rejected: 'rejected draft', resampled: 'resampled',
                 bonus: 'bonus', target: 'plain step'};
element.addEventListener('keydown', (e) => {
  const toks = [...element.querySelectorAll('.sv-tok[data-r]')];
  if (!toks.length) return;
  const at = toks.indexOf(document.activeElement);
  const step = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1}[e.key];
  let next = null;
  const last = toks.length - 1;
  if (step) next = at < 0 ? (step > 0 ? 0 : last) : Math.min(last, Math.max(0, at + step));
  else if (e.key === 'Home') next = 0;
  else if (e.key === 'End') next = last;
  else if ((e.key === 'Enter' || e.key === ' ') && at >= 0) { e.preventDefault(); toks[at].click(); return; }
  if (next === null) return;
  e.preventDefault();
  e.stopPropagation();  // the page's keys (ui/stage.py) leave the pane's arrows alone
  const t = toks[next];
  t.tabIndex = -1;
  t.setAttribute('role', 'button');
  const o = t.classList.contains('sv-target') ? 'target' : (t.dataset.o || '');
  t.setAttribute('aria-label', (svWords[o] || o) + ': ' + JSON.stringify(t.textContent));
  t.focus();
});
"""

# the region names, the live lines and the charts' names: at page load and again after the page
# changes (another tab's parts are drawn when it first opens), and as gradio redraws a chart
PAGE_JS = """() => {
  const named = (sel, title, text) => {
    const pane = document.querySelector(sel);
    if (!pane || pane.getAttribute('role') === 'region') return;
    pane.setAttribute('role', 'region');
    const head = document.getElementById(title);
    if (head) pane.setAttribute('aria-labelledby', title); else pane.setAttribute('aria-label', text);
  };
  const polite = (sel) => {
    const el = document.querySelector(sel);
    if (!el || el.getAttribute('aria-live')) return;
    el.setAttribute('aria-live', 'polite'); el.setAttribute('aria-atomic', 'true');
    // gradio's own tracker inside it ("queue: 1/1 | 0.1/1.3s") would be read out with each change
    el.querySelectorAll('[data-testid="status-tracker"]')
      .forEach((t) => t.setAttribute('aria-hidden', 'true'));
  };
  const fmt = (v) => typeof v !== 'number' ? String(v)
    : (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
  const label = (box) => {
    const gd = box.querySelector('.js-plotly-plot');
    if (!gd || !gd.layout) return;
    const title = ((gd.layout.title || {}).text || 'chart').replace(/<[^>]*>/g, '');
    const lines = (gd.data || []).filter((t) => t.y && t.y.length && t.name).map((t) => {
      const ys = [...t.y].filter((y) => y !== null && y !== undefined);
      return ys.length ? `${t.name}: ${ys.length} points, last ${fmt(ys[ys.length - 1])}` : '';
    }).filter(Boolean);
    const text = title + (lines.length ? '. ' + lines.join('; ') : ': no data yet');
    if (box.getAttribute('aria-label') !== text) box.setAttribute('aria-label', text);
    box.querySelectorAll('svg.main-svg').forEach((s) => s.setAttribute('aria-hidden', 'true'));
  };
  const mark = () => {
    named('#sv-baseline', 'sv-baseline-title', 'baseline output');
    named('#sv-speculative', 'sv-speculative-title', 'speculative output');
    named('#sv-lb-baseline', 'sv-lb-baseline-title', 'baseline output');
    named('#sv-lb-speculative', 'sv-lb-speculative-title', "the picked method's output");
    polite('#sv-runinfo');
    polite('#sv-th-numbers');  // follows the theory sliders (a reader heard only the slider's value)
    document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
      const box = gd.closest('[id^="sv-"]');
      if (!box || box.dataset.svNamed) return;
      box.dataset.svNamed = '1';
      box.setAttribute('role', 'figure');
      let due = null;
      new MutationObserver(() => { clearTimeout(due); due = setTimeout(() => label(box), 150); })
        .observe(box, {childList: true, subtree: true});
      label(box);
    });
  };
  const keysOff = () => {
    try { return localStorage.getItem('sv-keys-off') === '1'; } catch (e) { return false; } };
  window.svKeysOff = keysOff;
  const showKeys = () => {
    const b = document.querySelector('#sv-keys-off');
    if (!b) return;
    b.setAttribute('aria-pressed', keysOff() ? 'true' : 'false');
    b.textContent = keysOff() ? 'keys are off: turn on' : 'turn keys off';
  };
  document.addEventListener('click', (e) => {
    if (!(e.target && e.target.closest && e.target.closest('#sv-keys-off'))) return;
    try { localStorage.setItem('sv-keys-off', keysOff() ? '0' : '1'); } catch (err) { /* kept on */ }
    showKeys();
  });
  showKeys();
  let soon = null;
  new MutationObserver(() => { if (!soon) soon = setTimeout(() => { soon = null; mark(); }, 500); })
    .observe(document.body, {childList: true, subtree: true});
  mark();
  return [];
}"""

CSS = """
.sv-keys-off { font-size: 12px; padding: 0 8px; border-radius: 6px;
  border: 1px solid var(--border-color-primary); background: transparent; font-weight: 400;
  color: inherit; cursor: pointer; }
/* read by screen readers, not drawn */
.sv-sr { position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px; overflow: hidden;
  clip: rect(0 0 0 0); white-space: nowrap; border: 0; }
.sv-tok del { text-decoration: none; }  /* the token's own line is the strike (render.CSS) */
#sv-speculative:focus-visible, #sv-speculative .sv-tok[data-r]:focus-visible {
  outline: 2px solid #0072B2; outline-offset: 1px; }
.dark #sv-speculative:focus-visible, .dark #sv-speculative .sv-tok[data-r]:focus-visible {
  outline-color: #56B4E9; }
/* gradio draws no focus ring on a slider's thumb or a checked radio (the Tab walk lost its place there) */
input[type=range]:focus-visible, input[type=radio]:focus-visible, input[type=checkbox]:focus-visible {
  outline: 2px solid #0072B2; outline-offset: 2px; }
.dark input[type=range]:focus-visible, .dark input[type=radio]:focus-visible,
.dark input[type=checkbox]:focus-visible { outline-color: #56B4E9; }
/* text boxes and dropdowns: gradio's focus was a 1px pale border (1.8:1), none at all in dark mode */
textarea:focus-visible, input[type=text]:focus-visible, input[type=number]:focus-visible {
  outline: 2px solid #0072B2; outline-offset: 1px; }
.dark textarea:focus-visible, .dark input[type=text]:focus-visible, .dark input[type=number]:focus-visible {
  outline-color: #56B4E9; }
/* the charts' grey text (charts.FONT, #8c8c8c, one colour for both themes: 3.4:1 on white) takes a
   grey per theme; plotly writes it inline, so only this match reaches it, and coloured text stays */
.js-plotly-plot text[style*="fill: rgb(140, 140, 140)"] { fill: #5f5f69 !important; }
.dark .js-plotly-plot text[style*="fill: rgb(140, 140, 140)"] { fill: #b4b4bc !important; }
/* contrast, light mode: gradio's subdued grey (#bbbbc2, 1.9:1 on white) and its primary buttons'
   white on orange (2.8:1) */
:root { --body-text-color-subdued: #6b6b75; }
:root, .dark { --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-border-color: #c2410c; --button-primary-text-color: #ffffff; }
"""
