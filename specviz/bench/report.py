"""What a bench run prints and writes: machine info, the table, header lines, CSV."""
from __future__ import annotations

import csv
import datetime as _dt
import os
import platform
from pathlib import Path

from ..engine.pair import runs_as
from ..format import number
from ..machine import cpu_model, loadavg


def machine_info(pair, device) -> dict:
    import torch
    import transformers
    info = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "device": str(device),
        "precision": runs_as(pair),
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "loadavg_start": loadavg(), "platform": platform.platform(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


TABLE = [  # header, width, key, format
    ("task", 8, "task", None), ("method", 24, "label", None),
    ("tok/s", 6, "tokens_per_s", "{:.2f}"), ("speedup", 7, "speedup", "{:.2f}×"),
    ("paired", 6, "paired_speedup", "{:.2f}×"), ("dec t/s", 7, "decode_tokens_per_s", "{:.2f}"),
    ("dec spd", 7, "decode_speedup", "{:.2f}×"), ("cpu spd", 7, "cpu_speedup", "{:.2f}×"),
    ("α", 5, "alpha", "{:.2f}"), ("α̂", 5, "alpha_hat", "{:.2f}"),
    ("τ", 5, "tau", "{:.2f}"), ("c", 5, "c", "{:.2f}"), ("v", 5, "v", "{:.2f}"),
    ("pred", 6, "predicted", "{:.2f}×"), ("meas/pred", 9, "measured_over_predicted", "{:.2f}"),
    ("RSS GB", 6, "peak_rss_mb", None), ("HF≠", 8, "mismatches", None),
]


def _cell(row: dict, key: str, fmt: str | None) -> str:
    if key == "peak_rss_mb":
        mb = row["cuda_peak_mb"] if row.get("cuda_peak_mb") else row["peak_rss_mb"]
        return number(mb / 1024 if mb else None, "{:.1f}", missing="–")
    if key == "mismatches":
        if row["engine"] not in ("hf", "llamacpp"):  # other engines' kernels: differences are notes
            return ""
        if not row["mismatches"]:
            return "0"
        return f"{row['mismatches']}/{row['runs']}@{row['first_diff']}"
    if key == "label":
        return row["label"] + (" *" if row["best"] else "")
    if fmt is None:
        return str(row[key])
    return number(row[key], fmt, missing="–")


def format_table(rows: list[dict]) -> str:
    head = " ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, w, _, _) in enumerate(TABLE))
    lines = [head, "-" * len(head)]
    last = None
    for r in rows:
        if last is not None and r["task"] != last:
            lines.append("")
        last = r["task"]
        lines.append(" ".join(_cell(r, k, f).rjust(w) if i > 1 else _cell(r, k, f).ljust(w)
                              for i, (_, w, k, f) in enumerate(TABLE)))
    return "\n".join(lines)


def header_lines(meta: dict) -> list[str]:
    m = meta["machine"]
    tokens = meta.get("tokens_line") or f"{meta['max_new_tokens']} new tokens"  # edit: its own count
    return [
        f"SpecViz bench, {m['date']}",
        f"machine: {m['cpu']}, {m['cores']} cores (torch threads {m['torch_threads']})"
        + (f", GPU {m['gpu']}" if m.get("gpu") else ""),
        f"load average {m['loadavg_start']} at start, {m.get('loadavg_end', 'n/a')} at end, "
        f"1-min load during runs {m.get('load1_range', 'n/a')}; "
        f"process CPU s per wall s {m.get('cpu_per_wall', 'n/a')} (≈ threads when the machine is free)",
        f"python {m['python']}, torch {m['torch']}, transformers {m['transformers']}; "
        f"device {m['device']}, precision {m['precision']}",
        f"pair: {meta['pair']}",
        f"command: {meta['command']}",
        f"prompts: {meta['prompts_line']}",
        f"{tokens}, {meta['repeats']} repeats (median), greedy, methods "
        f"interleaved per prompt (order rotated each repeat), warm-up {'on' if meta['warmup'] else 'off'}; "
        f"wall time {meta.get('wall_s', 0) / 60:.1f} min",
    ]


LEGEND = """\
tok/s: new tokens / wall time including prefill (median over repeats of all the task's prompts together).
speedup: ratio of medians vs plain; paired: median of per-repeat ratios (same interleaved run).
dec t/s, dec spd: after the first output chunk (prefill and first round excluded).
cpu spd: tokens per process CPU second vs plain (robust to other jobs sharing the cores).
α: accepted/drafted; α̂: mean Σmin(p,q); τ: tokens per target forward; c: draft step / plain target step;
v: verify forward (γ+1 tokens) / plain target step; pred: Leviathan et al. (α̂, γ, c), which assumes v = 1;
meas/pred: dec spd / pred. RSS GB: peak resident memory (CUDA: max allocated). HF≠: HF runs whose
output differs from plain (runs/all@first differing position). * = best γ of the draft sweep."""


def report_text(meta: dict, rows: list[dict], best: list[str], notes: list[str]) -> str:
    """Header, table, best-γ lines, legend and notes: what the bench prints and table.txt holds."""
    return "\n".join(header_lines(meta) + ["", format_table(rows), "", *best, "", LEGEND]
                     + ([""] + [f"note: {n}" for n in notes] if notes else []))


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
