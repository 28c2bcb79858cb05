"""HTML and the bar chart of the "Race all methods" tab, from a leaderboard.Board
(i.e. from the runs' own events only). No gradio here."""
from __future__ import annotations

import plotly.graph_objects as go

from ..engine.events import RoundEvent
from ..engine.proposer import REGISTRY
from ..format import number
from ..run.leaderboard import PLAIN, Board, Row
from ..run.trace import headline
from .charts import BLUE, FONT, GREEN, GRID, VERMILLION
from .draft_source import READS_MEMORY, memory_tokens
from .glossary import plain_weights
from .render import esc
from .why_lost import cause_of, staged_share, staged_text

WRAP = "style='overflow-x:auto;max-width:100%'"
LEFT = " style='text-align:left'"
STATE = "id='sv-lb-state' role='status'"  # the race's progress line, said as it changes
CHECK = {"identical": ("✓ identical", "sv-good"), "near-tie": ("≈ near-tie", ""),
         "mismatch": ("≠ differs", "sv-bad"), "reference": ("reference", ""),
         "n/a (sampled)": ("n/a (sampled)", "")}
HEAD = [("#", ""), ("method", ""), ("γ", "draft length (auto: chosen each round)"),
        ("tok/s", "output tokens ÷ seconds on this run's own clock (fair mode: only its own steps)"),
        ("× plain", "tokens/s ÷ the tokens/s of plain decoding raced beside it, step by step, in the same "
                    "moments (hover a figure for its plain run and its ratio by CPU time)"),
        ("plain then", "plain decoding's tokens/s that × plain divides by: plain raced beside this method "
                       "(plain's row: every race's, lowest-highest)"),
        ("τ", "output tokens per target forward pass"),
        ("α̂", "expected acceptance: mean Σ min(p, q) over drafted positions"),
        ("c", "one draft forward ÷ one plain target step, the step of plain raced beside it "
              "(0: no draft model)"),
        ("v", "one verify pass in plain target steps (as c's), measured in this run"),
        ("output", "greedy: the method's text against plain decoding's, token for token "
                   "(run/equality.py)")]


def _num(x, fmt: str) -> str:
    return number(x, fmt, missing="–")


def memory_note(board: Board, row: Row) -> tuple[str, int]:
    """(what the row says of copying from earlier runs, tokens so copied) for a method that may copy
    from them (suffix, hybrid; issue 71: the race showed the hybrid at 1.83× with no word about the
    memory). The race's runs read no session's memory, so they copy from their own text only."""
    run = board.runs.get(row.key)
    if run is None or run.entry.method not in READS_MEMORY or row.tokens_per_s is None:
        return "", 0
    n = memory_tokens([e for e in run.events if isinstance(e, RoundEvent)])
    if n:
        return f"{n} of {row.n_tokens} tokens copied from earlier runs", n
    return "copied from this run's prompt and output only: the race reads no earlier runs", 0


def row_flag(board: Board, row: Row) -> str:
    """Everything that makes a row's × plain misleading: its flag, and tokens copied from earlier runs."""
    note, n = memory_note(board, row)
    return "; ".join(f for f in (row.flag, note if n else "") if f)


def row_why(board: Board, row: Row) -> str:
    """Why a finished row lost or gained little, by its own numbers (ui/why_lost.py), and a staged row's
    lookup part; '' for plain, an unfinished, cut or failed run."""
    run = board.runs.get(row.key)
    s = run.summary if run is not None else None
    if s is None or row.key == PLAIN or row.speedup is None or row.error or row.cut_note:
        return ""
    stats = dict(speedup=row.speedup, tau=row.tau, verify_cost=row.v, c=row.c, alpha_hat=row.alpha_hat,
                 gamma_mean=s.drafted / s.rounds if s.rounds else None,
                 alpha=s.accepted / s.drafted if s.drafted else None,
                 draft_steps=s.draft_forwards / s.timed_rounds if s.timed_rounds else None)
    method = run.entry.method
    tree = method in REGISTRY and REGISTRY[method].kind == "tree"
    lines = [cause_of(stats, tree, int(row.gamma) if str(row.gamma).isdigit() else None)]
    if method == "staged":
        lines.append(staged_text(staged_share([e for e in run.events if isinstance(e, RoundEvent)]),
                                 board.greedy))
    return " ".join(x for x in lines if x)


def _check_cell(row: Row, memory: str = "", why: str = "") -> str:
    mem = f"<br><span class='sv-lb-mem'>❝ {esc(memory)}</span>" if memory else ""
    mem += f"<br><span class='sv-lb-why'>{esc(why)}</span>" if why else ""
    if row.error:
        return f"<span title='{esc(row.error)}'>not run: {esc(row.error)}</span>"
    if row.tokens_per_s is None:
        return "<span style='opacity:.7'>waiting</span>"
    if row.cut_note:
        return (f"<span title='its numbers are measured up to the stop, not ranked against whole runs'>"
                f"{esc(row.cut_note)}</span>")
    text, cls = CHECK.get(row.identical, (row.identical, ""))
    flag = f"<br><span class='sv-bad sv-lb-flag'>⚠ {esc(row.flag)}</span>" if row.flag else ""
    return f"<span class='{cls}' title='{esc(row.detail)}'>{esc(text)}</span>{flag}{mem}"


def _speedup_cell(row: Row, flagged: bool = False) -> str:
    """× plain with how its plain figure was taken on hover (and ⚠ where a flag says it misleads)."""
    text = _num(row.speedup, "{:.2f}×") + (" ⚠" if (flagged or row.flag) and row.speedup is not None else "")
    return f"<span title='{esc(row.plain_how)}'>{text}</span>" if row.plain_how else text


def busy_line(reason: str) -> str:
    """The live tab's warning, said over the table while other programs use the machine."""
    if not reason:
        return ""
    return ("<div class='sv-status sv-status-warning sv-busy' role='status' id='sv-lb-busy'>"
            f"<span class='sv-dot sv-dot-warning'></span><b>This machine is busy</b> ({esc(reason)}): "
            "tokens/s measured now are unreliable. Each × plain divides by plain raced beside it in the "
            "same moments, so it suffers least; a row run while busy says so.</div>")


def table_html(board: Board | None, busy: str = "") -> str:
    """The leaderboard; `busy`: why this machine's timings are unreliable right now, or ""."""
    return busy_line(busy) + _table(board)


def _table(board: Board | None) -> str:
    if board is None or not (board.baseline or any(r.events for r in board.runs.values())):
        return ("<div class='sv-runinfo' id='sv-lb-empty'><span class='sv-mode'>Tick the methods and press "
                "<b>Run race</b>: each method races plain decoding, step by step; "
                "the table fills in as each one finishes.</span></div>")
    head = "".join(f"<th title='{esc(tip)}'{LEFT if name in ('method', 'output') else ''}>{esc(name)}</th>"
                   for name, tip in HEAD)
    body = []
    for i, r in enumerate(board.rows()):
        ran = r.ranked
        style = " style='font-weight:600'" if r.key == PLAIN else ""
        memory, copied = memory_note(board, r)
        cells = [str(i + 1) if ran else "–", esc(r.label), esc(r.gamma), _num(r.tokens_per_s, "{:.2f}"),
                 _speedup_cell(r, bool(copied)), esc(r.plain_then), _num(r.tau, "{:.2f}"),
                 _num(r.alpha_hat, "{:.3f}"), _num(r.c, "{:.3f}"), _num(r.v, "{:.2f}")]
        # the method names the row (a screen reader read each row as its rank: "1", "–")
        tds = "".join(f"<th scope='row'{LEFT}>{c}</th>" if j == 1 else f"<td>{c}</td>"
                      for j, c in enumerate(cells))
        check = _check_cell(r, memory, row_why(board, r))
        body.append(f"<tr data-key='{esc(r.key)}'{style}>{tds}<td{LEFT}>{check}</td></tr>")
    return (f"<div {WRAP}><table class='sv-table' id='sv-lb-rows'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>" + _footnote(board))


def _footnote(board: Board) -> str:
    s = board.settings
    how = "greedy" if board.greedy else f"sampled at temperature {s.get('temperature')}, seed {s.get('seed')}"
    plain = ("each method raced plain decoding step by step (fair mode), so each × plain is a ratio of "
             "the same moments (hover it), and a row whose ratio by CPU time parts from it by more than "
             "15 % says the machine was disturbed" if board.paired else
             "recorded before 2026-11-28: plain decoding timed once, before every method, so its × plain "
             "figures are not ratios of the same moments and none ranks above plain")
    return (f"<div class='sv-runinfo'><span class='sv-mode'>{esc(s.get('max_new_tokens'))} new tokens, "
            f"{how}; "
            f"every run timed on its own clock (fair mode), each number from that run's own events; "
            f"{plain}; sorted by × plain, a method with τ 1.00 never above plain.</span></div>")


def progress_html(board: Board | None, note: str = "", banner: str = "") -> str:
    if board is None:
        return (f"<div class='sv-runinfo' {STATE}>{banner}<span class='sv-mode'>{esc(note)}</span>"
                "</div>")
    done, total = board.done(), board.total
    if board.current:
        name = board.runs[board.current].entry.label
        what = (f"running {min(done + 1, total)} of {total}: <b>{esc(name)}</b> beside plain decoding, "
                "step by step")
    else:
        what = f"{done} of {total} runs done" + (f": {esc(note)}" if note else "")
    if board.meta.get("graphs"):  # ZeroGPU: the graphs this call captured before the clocks
        what += f" · {esc(board.meta['graphs'])}"
    bar = (f"<div class='sv-bar' style='height:6px;border-radius:3px;background:rgba(128,128,128,.2);"
           f"margin-top:4px'><div style='width:{100 * done / total:.0f}%'></div></div>")
    return f"<div class='sv-runinfo' {STATE}>{banner}<span class='sv-mode'>{what}</span>{bar}</div>"


HATCHED = "#aaaaaa"  # a flagged row's bar: grey and hatched, never the green of a speedup


def bar_chart(board: Board | None) -> go.Figure:
    """× plain of each finished run, in the table's order (issue 71: the bars were tokens/s while the
    rows were ranked by × plain, and the token tree's bar outgrew the draft model's above it). A row
    whose × plain carries a flag (τ 1.00, a disturbed machine, tokens copied from earlier runs) is
    drawn grey and hatched, ⚠ before its name and the flag in its hover; plain decoding at 1.00×."""
    fig = go.Figure()
    fig.update_layout(title=dict(text="× plain, as ranked (⚠ hatched: flagged, see its row)", x=0.01,
                                 xanchor="left", font=dict(size=14)),
                      height=320, margin=dict(l=8, r=16, t=48, b=40), paper_bgcolor="rgba(0,0,0,0)",
                      plot_bgcolor="rgba(0,0,0,0)", font=dict(color=FONT, size=12), showlegend=False)
    fig.update_xaxes(title_text="× plain: tokens/s ÷ plain decoding's raced beside it", gridcolor=GRID,
                     zerolinecolor=GRID, linecolor=GRID)
    fig.update_yaxes(gridcolor=GRID, linecolor=GRID, automargin=True)
    rows = [r for r in (board.rows() if board is not None else []) if r.ranked]
    if not rows:
        fig.add_annotation(text="the leaderboard's bars appear here", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", font=dict(color=FONT, size=13))
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return fig
    rows = rows[::-1]  # plotly draws the first bar at the bottom
    pairs = [(r, row_flag(board, r) if r.key != PLAIN else "") for r in rows]
    colours = ["#999999" if r.key == PLAIN else VERMILLION if r.identical == "mismatch" else
               HATCHED if f else (GREEN if (r.speedup or 0) >= 1 else BLUE) for r, f in pairs]
    names = [("⚠ " if f else "") + r.label + (f" (γ {r.gamma})" if r.gamma not in ("–", "", "auto") else "")
             for r, f in pairs]
    fig.add_bar(x=[r.speedup or 0.0 for r, _ in pairs], y=names, orientation="h",
                marker=dict(color=colours, pattern=dict(shape=["/" if f else "" for _, f in pairs],
                                                        fgcolor="#555555")),
                text=[f"{_num(r.speedup, '{:.2f}×')}{' ⚠' if f else ''} · {r.tokens_per_s:.2f} tok/s"
                      for r, f in pairs], textposition="auto",
                customdata=[f"{_num(r.tokens_per_s, '{:.2f}')} tokens/s" + (f"<br>⚠ {esc(f)}" if f else "")
                            for r, f in pairs],
                hovertemplate="%{y}: %{x:.2f}× plain · %{customdata}<extra></extra>")
    fig.add_vline(x=1.0, line=dict(color=FONT, width=1, dash="dot"))
    fig.update_layout(height=max(220, 70 + 34 * len(rows)))
    return fig


def pick_choices(board: Board | None) -> list[tuple[str, str]]:
    """The method selector: every run that produced events, in table order."""
    if board is None:
        return []
    return [(f"{r.label} · {_num(r.tokens_per_s, '{:.2f}')} tok/s", r.key) for r in board.rows()
            if r.key != PLAIN and r.tokens_per_s is not None]


def replay_banner(meta: dict, source: str) -> str:
    """A recorded race's banner: what it ran on, the precision in plain words first, and that its
    timings are that machine's (issue 71)."""
    h = headline(meta)
    words = plain_weights(meta.get("precision") or "")
    prec = f"<b>{esc(words)}</b> ({esc(h['precision'])})" if words else esc(h["precision"])
    hw = esc(meta["hardware"]) if meta.get("hardware") else "another machine (not named in the recording)"
    return ("<div class='sv-replay-banner' role='status'><b>▶ Recorded race</b> "
            f"({esc(source)}) on <b>{hw}</b>, {esc(h['date'])}, {esc(h['models'])}, {prec} — "
            "<b>not live</b>: that machine's timings, not this one's.</div>")
