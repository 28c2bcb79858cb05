"""The app's first start against a later start, as a visitor meets them, side by side.

    python -m specviz first-start                     # empty cache: conversion included
    python -m specviz first-start --models-from DIR   # reuse DIR's converted models (faster)

Starts `python app.py` in a subprocess on an empty cache ($SPECVIZ_CACHE set to a fresh folder),
waits until Run is enabled and the background calibration has ended, sends the quicksort
preset through the page's `/run` API (gradio_client, as a browser tab would) `--runs` times,
stops the app, starts it again on the now-warm cache and sends the same requests. Prints,
per start: seconds until the page served and until Run was enabled, the calibration's end,
engine tok/s of each side and the speedup shown (parsed from the page's own stats), the app's
peak and final resident memory (VmHWM/VmRSS of its process), and the later/first ratios.
Run it alone on the cores: a second busy process changes both starts' timings.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..hosting.llamacpp import process_peak_mb
from ..hosting.vllm_server import free_port, stop_process

ROOT = Path(__file__).resolve().parents[2]
PRESET = dict(prompt="def quicksort(arr):\n", gamma=5, max_new_tokens=96)  # assets/presets.json's first
TOLERANCE = 0.05  # the bar: both starts within 5 %


def _gb(pid: int, key: str) -> float | None:
    """VmHWM/VmRSS of a process in GB."""
    mb = process_peak_mb(pid, key)
    return None if mb is None else mb * 1024 / 1e6


def _text(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def parse_stats(stats_html: str) -> dict:
    """Baseline and speculative tokens/s and the speedup shown, from the page's stats box."""
    row = re.search(r"tokens/s</th><td>([^<]*)</td><td>([^<]*)</td>", stats_html)
    spd = re.search(r"sv-speedup-num'>([0-9.]+)×", stats_html)
    num = lambda s: float(s) if re.fullmatch(r"[0-9.]+", s.strip()) else None  # noqa: E731
    base, spec = (num(row.group(1)), num(row.group(2))) if row else (None, None)
    return {"base_tok_s": base, "spec_tok_s": spec, "speedup": float(spd.group(1)) if spd else None}


class App:
    """`python app.py` on a port, its output in a file, its memory read from /proc."""

    def __init__(self, cache: Path, log: Path, extra: list[str]):
        self.port = free_port()
        env = {**os.environ, "SPECVIZ_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}
        self.log = log
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *extra],
                                     cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.hwm = 0.0
        self.timeline: list[tuple[float, float, str]] = []  # (s since start, resident GB, status)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def sample(self) -> None:
        self.hwm = max(self.hwm, _gb(self.proc.pid, "VmHWM") or 0.0)

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"the app exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")

    def client(self, timeout: float):
        from gradio_client import Client
        end = time.monotonic() + timeout
        while True:
            self.alive()
            try:
                return Client(self.url, verbose=False), time.monotonic() - self.t0
            except Exception:  # noqa: BLE001 - not serving yet
                if time.monotonic() > end:
                    raise
                time.sleep(1.0)

    def stop(self) -> None:
        self.sample()
        stop_process(self.proc)


def read_gbs() -> float:
    """This machine's plain-sum read bandwidth now (GB/s, 1 GiB at 2 threads): a 1.5B step is
    memory-bound, and on a shared VM host the bandwidth a neighbour leaves moves it by a third
    from one minute to the next (a w8a8 step 52 -> 36 ms with nothing else on our cores,
    2026-11-26), so each start's requests are framed by a reading taken just before and after."""
    from ..hosting.bandwidth import measure_cpu_read_gbs
    return round(measure_cpu_read_gbs(1.0, repeats=3)["sum_gbs"], 1)


def wait_status(app: App, client, want, timeout: float) -> tuple[float, str]:
    """Poll the page's status until want(text) holds; (seconds since the start, text)."""
    end = time.monotonic() + timeout
    while True:
        app.alive()
        app.sample()
        text = _text(client.predict(api_name="/status")[0])
        app.timeline.append((round(time.monotonic() - app.t0, 1), _gb(app.proc.pid, "VmRSS") or 0.0,
                             " ".join(text.split())[-160:]))
        if want(text):
            return time.monotonic() - app.t0, text
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting on the page; its status: {text[:300]}")
        time.sleep(1.0)


def calibration_ended(text: str) -> bool:
    """Run enabled and no background calibration under way or about to start (done, stopped,
    skipped, or none needed); an untimed pair's line ("a safe default, not timed") comes before
    its calibration starts."""
    return not any(s in text for s in ("Loading models", "Calibrating timings in the background",
                                       "is a safe default, not timed"))


def one_start(name: str, cache: Path, out: Path, runs: int, extra: list[str], timeout: float) -> dict:
    app = App(cache, out / f"{name}.log", extra)
    try:
        client, served = app.client(timeout)
        ready, _ = wait_status(app, client, lambda t: "Loading models" not in t, timeout)
        calibrated, status = wait_status(app, client, calibration_ended, timeout)
        bandwidth = [read_gbs()]  # the machine's own state, beside the app's numbers
        results = []
        for _ in range(runs):
            p = PRESET
            final = client.predict(p["prompt"], p["gamma"], p["max_new_tokens"], 0.0, 1.0, 0, 0, False,
                                   "fair", "draft", api_name="/run")
            app.sample()
            results.append({**parse_stats(final[2]), "identical": "identical outputs" in final[3]})
        rss = _gb(app.proc.pid, "VmRSS")
        bandwidth.append(read_gbs())
    finally:
        app.stop()
    return {"start": name, "served_s": round(served, 1), "run_enabled_s": round(ready, 1),
            "calibration_ended_s": round(calibrated, 1), "status": status.strip()[:300],
            "runs": results, "peak_rss_gb": round(app.hwm, 2), "rss_after_runs_gb": round(rss or 0.0, 2),
            "read_gbs": bandwidth, "largest_resident": sorted(app.timeline, key=lambda r: -r[1])[:3]}


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def table(starts: list[dict]) -> list[str]:
    """Every start's row, then first vs later: per pair of starts (one after the other, the same
    minute's host) the ratio of their medians, and the median of those ratios over the pairs. Why
    paired: a VM host's read bandwidth moved 40 -> 58 GB/s between two pairs (2026-11-27), and
    pooling both pairs' runs compared one pair's first start with the other's later start."""
    lines = ["| start | served s | Run enabled s | calibration ended s | baseline tok/s | speculative tok/s "
             "| speedup shown | identical | peak RSS GB | RSS after runs GB | read GB/s before, after |",
             "|" + "---|" * 11]
    for s in starts:
        runs = s["runs"]
        cells = [", ".join(f"{r[k]:.2f}" if r[k] is not None else "?" for r in runs)
                 for k in ("base_tok_s", "spec_tok_s", "speedup")]
        times = f"{s['served_s']} | {s['run_enabled_s']} | {s['calibration_ended_s']}"
        lines.append(f"| {s['start']} | {times} | " + " | ".join(cells)
                     + f" | {all(r['identical'] for r in runs)} | {s['peak_rss_gb']} | "
                     f"{s['rss_after_runs_gb']} | {', '.join(map(str, s['read_gbs']))} |")
    lines.append("")
    for key, what in (("base_tok_s", "baseline tok/s"), ("spec_tok_s", "speculative tok/s"),
                      ("speedup", "speedup shown")):
        pairs = [(_median(a["runs"], key), _median(b["runs"], key))
                 for a, b in zip(starts[0::2], starts[1::2], strict=True)]
        ratios = [a / b for a, b in pairs if a and b]
        if ratios:
            r = statistics.median(ratios)
            each = ", ".join(f"{a:.2f}/{b:.2f} = {a / b:.3f}" for a, b in pairs if a and b)
            lines.append(f"- {what}, first/later: {each}; median {r:.3f} "
                         f"({'within' if abs(r - 1) <= TOLERANCE else 'OUTSIDE'} {TOLERANCE:.0%})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz first-start", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="requests per start (default 3)")
    ap.add_argument("--models-from", metavar="DIR", help="copy the converted models of this cache folder "
                    "(its qwen2.5-coder-* folders) into the empty cache first: the calibration still starts "
                    "from nothing, the conversion is skipped")
    ap.add_argument("--out", default=None, help="folder for the apps' logs and result.json "
                    "(default: bench-results/first-start-<time>)")
    ap.add_argument("--pairs", type=int, default=1, help="alternate this many pairs of starts (empty, warm, "
                    "empty, warm, ...; each pair on a fresh cache): a VM host's memory bandwidth drifts by "
                    "tens of percent between minutes, and alternation spreads that over both kinds")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds to wait for each start")
    ap.add_argument("app_args", nargs="*", help="after --: extra flags for app.py")
    args = ap.parse_args(argv)
    out = Path(args.out or ROOT / "bench-results" / time.strftime("first-start-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    starts = []
    for i in range(max(1, args.pairs)):
        cache = Path(tempfile.mkdtemp(prefix="specviz-first-start-"))
        tag = f" #{i + 1}" if args.pairs > 1 else ""
        try:
            if args.models_from:
                for d in Path(args.models_from).glob("qwen2.5-coder-*"):
                    shutil.copytree(d, cache / d.name)
            starts += [one_start(name + tag, cache, out, args.runs, args.app_args, args.timeout)
                       for name in ("first start (empty cache)", "later start (warm cache)")]
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    from ..machine import cpu_model
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M %Z")}
    result = {"machine": machine, "preset": PRESET, "models_from": args.models_from, "starts": starts}
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(f"{machine['cpu']}, {machine['cores']} cores, {machine['date']}")
    print("\n".join(table(starts)))
    for s in starts:
        print(f"{s['start']}: {s['status']}")
        for t, gb, what in s["largest_resident"]:
            print(f"  resident {gb:.2f} GB at {t} s: ...{what}")
    print(f"written: {out / 'result.json'}")
    return 0
