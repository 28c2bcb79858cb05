"""Benchmark: plain target decoding vs SpecViz speculative decoding vs Hugging
Face assisted generation, on the same pair, prompts and machine, in one process.

    python -m specviz.bench --quick              # a few minutes on a 2-core CPU
    python -m specviz.bench                      # the full run (about 30 min on CPU)
    python -m specviz.bench --quick --quantize int8

Every prompt is run by every method, `--repeats` times, interleaved: for each
prompt and repeat the methods run one after another, their order rotated each
time, so slow drift of the machine hits all methods alike. Numbers are medians
over repeats. SpecViz numbers come only from `run_events` and `run_stats`; this
module holds no decoding of its own (Hugging Face numbers come from
`model.generate`).

Greedy outputs must match the plain baseline token for token: a SpecViz method
that differs makes the bench exit with code 1 (after writing its files) naming
the method, prompt and first differing position. Hugging Face runs that differ
are reported in their own column (`HF≠`), since HF's batched kernels can flip a
numerical near-tie.

Writes bench.json, runs.csv, summary.csv, plots.html (plotly, self-contained)
and small SVG (always) and PNG (when matplotlib is installed) plots to `--out`
(default bench-results/<timestamp>/). See docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import json
import math
import os
import platform
import resource
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli import add_pair_args
from ..hosting.bandwidth import bench_lines, weight_bytes
from ..machine import cpu_model, loadavg
from ..models import ModelError
from ..request import METHODS, RequestError
from . import vllm_rows

# --------------------------------------------------------------------- presets

QUICK = dict(tasks="code,grounded", n_prompts="code=2,grounded=1", max_new_tokens=32,
             gammas="2,4,6", repeats=3, hf_gammas="4", methods="plain,hf-assisted,hf-stock," + ",".join(METHODS))
FULL = dict(tasks="code,chat,grounded", n_prompts="1", max_new_tokens=32,
            gammas="1,2,3,4,5,6,7,8", repeats=3, hf_gammas="4",
            methods="plain,hf-greedy,hf-assisted,hf-heuristic,hf-stock," + ",".join(METHODS))
HF_FAMILIES = ("hf-greedy", "hf-assisted", "hf-heuristic", "hf-stock")
FAMILIES = ("plain",) + HF_FAMILIES + tuple(METHODS) + vllm_rows.FAMILIES
CHAT_TASKS = ("chat", "grounded")  # user messages: wrapped in the chat template
WARMUP_TOKENS = 8

RUN_COLUMNS = [
    "variant", "family", "engine", "gamma", "task", "prompt_id", "repeat", "order", "n_tokens",
    "elapsed", "cpu_s", "first_t", "first_n", "tokens_per_s", "decode_tokens_per_s", "stop_reason",
    "peak_rss_mb", "cuda_peak_mb", "match", "first_diff", "rounds", "drafted", "accepted",
    "draft_time", "verify_time", "draft_forwards", "target_forwards", "prefill",
    "alpha", "alpha_hat", "tau", "c", "v", "t_draft_step", "t_target_step", "speedup_run",
    "predicted", "load1", "error",
]
SUMMARY_COLUMNS = [
    "task", "variant", "label", "family", "engine", "gamma", "n_prompts", "repeats", "n_tokens",
    "tokens_per_s", "speedup", "paired_speedup", "decode_tokens_per_s", "decode_speedup",
    "cpu_tokens_per_s", "cpu_speedup", "cpu_per_wall",
    "alpha", "alpha_hat", "tau", "c", "v", "predicted", "measured_over_predicted",
    "peak_rss_mb", "cuda_peak_mb", "mismatches", "runs", "first_diff", "best",
]


class OutputMismatch(RuntimeError):
    """A SpecViz method's greedy output differs from the plain baseline's."""


@dataclass(frozen=True)
class Variant:
    key: str  # unique, ASCII: "plain", "draft:4", "hf-assisted:4", "hf-assisted:heuristic"
    family: str  # "plain", "hf-greedy", "hf-assisted", "hf-heuristic", or a SpecViz method
    engine: str  # "specviz" | "hf"
    gamma: int = 0  # 0: not applicable (plain, HF greedy, HF heuristic start)

    @property
    def strict(self) -> bool:
        """Greedy output must equal the baseline's (our own engine)."""
        return self.engine == "specviz"

    @property
    def label(self) -> str:
        if self.family == "plain":
            return "plain (target only)"
        if self.family == "hf-greedy":
            return "HF generate greedy"
        if self.family == "hf-assisted":
            return f"HF assisted γ={self.gamma} const"
        if self.family == "hf-heuristic":
            return "HF assisted heuristic"
        if self.family == "hf-stock":
            return f"HF assisted γ={self.gamma} stock"
        if self.engine == "vllm":
            return vllm_rows.label(self)
        return f"SpecViz {self.family} γ={self.gamma}"


@dataclass
class Run:
    """One measured run (JSON/CSV row)."""

    variant: str
    family: str
    engine: str
    gamma: int
    task: str
    prompt_id: str
    repeat: int
    order: int
    n_tokens: int = 0
    elapsed: float = 0.0
    cpu_s: float | None = None  # process CPU seconds (all threads) spent in the run
    first_t: float | None = None  # when the first output chunk appeared (prefill and first round)
    first_n: int = 0  # tokens in that first chunk
    tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    stop_reason: str = ""
    peak_rss_mb: float | None = None
    cuda_peak_mb: float | None = None
    match: bool | None = None
    first_diff: int | None = None
    rounds: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    draft_time: float | None = None
    verify_time: float | None = None
    draft_forwards: int | None = None
    target_forwards: int | None = None
    prefill: float | None = None
    alpha: float | None = None
    alpha_hat: float | None = None
    tau: float | None = None
    c: float | None = None
    v: float | None = None  # verify forward time / plain step time
    t_draft_step: float | None = None
    t_target_step: float | None = None
    speedup_run: float | None = None
    predicted: float | None = None
    load1: float | None = None  # 1-minute load average of the machine when the run ended
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)

    def row(self) -> dict:
        return {k: getattr(self, k) for k in RUN_COLUMNS}


# ------------------------------------------------------------ output checking


def first_difference(ref: list[int], got: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def check_outputs(runs: list[Run], strict_only: bool = True) -> list[str]:
    """Compare every run's token ids with the plain baseline of the same prompt
    (its first repeat); fills run.match / run.first_diff.

    Raises OutputMismatch listing every strict (SpecViz) run that differs;
    returns warning lines for non-strict (HF) runs that differ."""
    ref = {}
    for r in runs:
        if r.family == "plain" and r.error is None and r.prompt_id not in ref:
            ref[r.prompt_id] = r.token_ids
    errors, warnings = [], []
    for r in runs:
        if r.error is not None or r.prompt_id not in ref:
            continue
        pos = first_difference(ref[r.prompt_id], r.token_ids)
        r.match, r.first_diff = pos is None, pos
        if pos is None:
            continue
        base = ref[r.prompt_id]
        what = (f"{r.variant} on {r.prompt_id} (repeat {r.repeat + 1}): first differing position {pos} "
                f"(baseline token {base[pos] if pos < len(base) else 'END'}, "
                f"got {r.token_ids[pos] if pos < len(r.token_ids) else 'END'}; "
                f"lengths {len(base)} vs {len(r.token_ids)})")
        strict = r.engine == "specviz"
        (errors if strict else warnings).append(what)
    if errors and strict_only:
        raise OutputMismatch("greedy output differs from the plain baseline:\n  " + "\n  ".join(errors))
    return warnings


# ------------------------------------------------------------------- machine


def machine_info(pair, device) -> dict:
    import torch
    import transformers
    info = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "device": str(device),
        "precision": getattr(pair, "precision", "") or str(getattr(pair, "dtype", "")),
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "loadavg_start": loadavg(), "platform": platform.platform(),
    }
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _reset_peak(cuda: bool) -> None:
    """Reset the peak-RSS counter (Linux: VmHWM via /proc/self/clear_refs)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    if cuda:
        import torch
        torch.cuda.reset_peak_memory_stats()


def _peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    # lifetime peak (kB on Linux, bytes on macOS)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


# ------------------------------------------------------------------ prompts


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    task: str
    text: str
    chat_template: bool
    source: str = ""


def parse_counts(value: str, tasks: list[str]) -> dict[str, int]:
    """'3' -> 3 per task; 'code=2,grounded=1' -> per task (unlisted tasks: 0)."""
    value = str(value).strip()
    try:
        if "=" not in value:
            n = int(value)
            if n < 1:
                raise ValueError
            return {t: n for t in tasks}
        out = {t: 0 for t in tasks}
        for part in value.split(","):
            k, v = part.split("=")
            out[k.strip()] = int(v)
        return out
    except ValueError:
        raise RequestError(f"--n-prompts must be a positive number or task=n,...; got {value!r}") from None


def load_prompts(tasks: list[str], counts: dict[str, int], prompts_json: str | None) -> list[BenchPrompt]:
    if prompts_json:
        items = json.loads(Path(prompts_json).read_text())
        out = []
        for i, it in enumerate(items):
            task = it.get("task", "code")
            if task not in tasks:
                continue
            out.append(BenchPrompt(it.get("id", f"{task}/{i}"), task, it["text"],
                                   bool(it.get("chat_template", task in CHAT_TASKS)), prompts_json))
        by_task = {t: [p for p in out if p.task == t][: counts.get(t, 0) or None] for t in tasks}
        return [p for t in tasks for p in by_task[t]]
    from ..prompts import prompt_set
    out = []
    for t in tasks:
        if counts.get(t, 0) <= 0:
            continue
        for p in prompt_set(t, counts[t]):
            out.append(BenchPrompt(p.id, p.task, p.text, p.task in CHAT_TASKS, p.source))
    return out


# ---------------------------------------------------------------- the runs


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def run_specviz(pair, v: Variant, req, ids: list[int]) -> tuple[object, dict]:
    """One SpecViz run through run_events; returns (RunSummary, first-chunk info)."""
    from ..engine.events import RoundEvent, TokenEvent
    from ..runner import run_events
    mode = "baseline" if v.family == "plain" else "speculative"
    first_t, first_n, summary = None, 0, None
    for ev in run_events(pair, req, mode, ids):
        if isinstance(ev, TokenEvent):
            if first_t is None:
                first_t, first_n = ev.t, 1
        elif isinstance(ev, RoundEvent):
            if first_t is None and ev.n_new:
                first_t, first_n = ev.t_end, ev.n_new
        else:
            summary = ev
    return summary, {"first_t": first_t, "first_n": first_n}


class _FirstChunk:
    """A generate() streamer that only notes when the first new tokens arrive."""

    def __init__(self, device, t0: float):
        self.device, self.t0, self.calls = device, t0, 0
        self.first_t, self.first_n = None, 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            _sync(self.device)
            self.first_t, self.first_n = time.perf_counter() - self.t0, int(value.numel())

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _assistant_config(draft, **settings):
    gc = draft.generation_config
    old = {k: getattr(gc, k, None) for k in settings}
    for k, val in settings.items():
        setattr(gc, k, val)
    try:
        yield
    finally:
        for k, val in old.items():
            setattr(gc, k, val)


_STOCK: dict[int, object] = {}


def stock_draft(pair):
    """The fp32 draft as `from_pretrained` gives it (loaded once more if ours is int8)."""
    if pair.quantize != "draft-int8":
        return pair.draft  # fp32: the same object, run with speed.unpatched
    if id(pair) not in _STOCK:
        from ..engine import speed
        from ..models import load_stock, local_refs
        _STOCK[id(pair)] = load_stock(local_refs(pair.spec)["draft"], pair.target.device, pair.dtype)
        speed.warm_up(_STOCK[id(pair)])
    return _STOCK[id(pair)]


def run_hf(pair, v: Variant, ids: list[int], max_new_tokens: int) -> dict:
    """One `target.generate` call (greedy, plain or assisted); timed end to end."""
    import torch
    from transformers import GenerationConfig
    dev = pair.target.device
    x = torch.tensor([ids], device=dev)
    eos = list(pair.eos_ids)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                               pad_token_id=eos[0] if eos else None)
    kw = dict(attention_mask=torch.ones_like(x), generation_config=gen_cfg)
    ctx = contextlib.ExitStack()
    if v.family in ("hf-assisted", "hf-stock"):
        draft = pair.draft
        if v.family == "hf-stock":
            # what `generate(assistant_model=...)` gives out of the box: fp32 draft,
            # stock nn.Linear kernels in both models (our speed patch removed)
            from ..engine import speed
            draft = stock_draft(pair)
            ctx.enter_context(speed.unpatched(pair.target, draft))
        # constant γ, and no early stop on low draft confidence: γ drafts every round
        ctx.enter_context(_assistant_config(draft, num_assistant_tokens=v.gamma,
                                            num_assistant_tokens_schedule="constant",
                                            assistant_confidence_threshold=0.0))
        kw["assistant_model"] = draft
    elif v.family == "hf-heuristic":
        # HF's defaults: start at 20, +2 after a full accept, -1 otherwise; confidence stop 0.4
        ctx.enter_context(_assistant_config(pair.draft, num_assistant_tokens=20,
                                            num_assistant_tokens_schedule="heuristic",
                                            assistant_confidence_threshold=0.4))
        kw["assistant_model"] = pair.draft
    with ctx, torch.inference_mode():
        _sync(dev)
        t0 = time.perf_counter()
        streamer = _FirstChunk(dev, t0)
        out = pair.target.generate(x, streamer=streamer, **kw)
        _sync(dev)
        elapsed = time.perf_counter() - t0
    new = out[0, len(ids):].tolist()
    return {"token_ids": new, "elapsed": elapsed, "first_t": streamer.first_t,
            "first_n": streamer.first_n,
            "stop_reason": "eos" if new and new[-1] in eos else "max_new_tokens"}


def measure(pair, v: Variant, p: BenchPrompt, ids: list[int], max_new_tokens: int,
            run: Run) -> tuple[Run, object]:
    """Run one variant on one prompt; fills and returns `run` and the RunSummary (SpecViz)."""
    from ..request import make_request
    cuda = str(pair.target.device).startswith("cuda")
    _reset_peak(cuda)
    summary = None
    cpu0 = time.process_time()
    if v.engine == "specviz":
        method = v.family if v.family != "plain" else "draft"
        req = make_request(p.text, method=method, gamma=max(1, v.gamma), max_new_tokens=max_new_tokens,
                           temperature=0.0, seed=0, chat_template=p.chat_template)
        summary, first = run_specviz(pair, v, req, ids)
        run.token_ids, run.n_tokens, run.elapsed = list(summary.token_ids), summary.n_tokens, summary.elapsed
        run.stop_reason, run.prefill = summary.stop_reason, summary.prefill
        run.target_forwards = summary.target_forwards
        if v.family != "plain":
            run.rounds, run.drafted, run.accepted = summary.rounds, summary.drafted, summary.accepted
            run.draft_time, run.verify_time = summary.draft_time, summary.verify_time
            run.draft_forwards = summary.draft_forwards
    else:
        res = run_hf(pair, v, ids, max_new_tokens)
        first = res
        run.token_ids, run.n_tokens, run.elapsed = res["token_ids"], len(res["token_ids"]), res["elapsed"]
        run.stop_reason = res["stop_reason"]
    run.cpu_s = time.process_time() - cpu0
    run.first_t, run.first_n = first["first_t"], first["first_n"]
    run.peak_rss_mb = round(_peak_rss_mb(), 1)
    with contextlib.suppress(OSError):
        run.load1 = round(os.getloadavg()[0], 2)
    if cuda:
        import torch
        run.cuda_peak_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    run.tokens_per_s = run.n_tokens / run.elapsed if run.elapsed > 0 else None
    if run.first_t is not None and run.n_tokens > run.first_n and run.elapsed > run.first_t:
        run.decode_tokens_per_s = (run.n_tokens - run.first_n) / (run.elapsed - run.first_t)
    return run, summary


def add_stats(run: Run, spec, base) -> None:
    """Fill α, τ, c, prediction of a speculative run from run_stats(spec, paired baseline)."""
    from ..engine.metrics import run_stats
    st = run_stats(spec, base)
    run.alpha, run.alpha_hat, run.tau, run.c = st.alpha, st.alpha_hat, st.tau, st.c
    run.t_draft_step, run.t_target_step = st.t_draft_step, st.t_target_step
    run.speedup_run, run.predicted, run.v = st.speedup, st.predicted, st.verify_cost


# --------------------------------------------------------------- aggregates


def _median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def _per_repeat(runs: list[Run]) -> dict[int, tuple[float | None, float | None, float | None]]:
    """repeat -> (tokens/s, decode tokens/s, tokens per CPU second) over all the prompts of that repeat."""
    out = {}
    for rep in sorted({r.repeat for r in runs}):
        sel = [r for r in runs if r.repeat == rep]
        n, t = sum(r.n_tokens for r in sel), sum(r.elapsed for r in sel)
        dsel = [r for r in sel if r.decode_tokens_per_s is not None]
        dn = sum(r.n_tokens - r.first_n for r in dsel)
        dt = sum(r.elapsed - r.first_t for r in dsel)
        cpu = sum(r.cpu_s or 0.0 for r in sel)
        out[rep] = (n / t if t > 0 else None, dn / dt if dt > 0 and len(dsel) == len(sel) else None,
                    n / cpu if cpu > 0 else None)
    return out


def summarize(runs: list[Run], variants: list[Variant], tasks: list[str], by_prompt: bool = False) -> list[dict]:
    """Rows per task (and "all"), or per prompt with by_prompt=True (then "task" holds the prompt id)."""
    rows = []
    ok = [r for r in runs if r.error is None]
    if by_prompt:
        groups = list(dict.fromkeys(r.prompt_id for r in ok))
        member = lambda r, g: r.prompt_id == g  # noqa: E731
    else:
        groups = tasks + (["all"] if len(tasks) > 1 else [])
        member = lambda r, g: g == "all" or r.task == g  # noqa: E731
    for task in groups:
        in_task = [r for r in ok if member(r, task)]
        plain = _per_repeat([r for r in in_task if r.family == "plain"])
        if not plain:
            continue
        p_tps = _median([x[0] for x in plain.values()])
        p_dtps = _median([x[1] for x in plain.values()])
        p_ctps = _median([x[2] for x in plain.values()])
        for v in variants:
            sel = [r for r in in_task if r.variant == v.key]
            if not sel:
                continue
            reps = _per_repeat(sel)
            tps = _median([x[0] for x in reps.values()])
            dtps = _median([x[1] for x in reps.values()])
            ctps = _median([x[2] for x in reps.values()])
            paired = _median([reps[k][0] / plain[k][0] for k in reps
                              if k in plain and reps[k][0] and plain[k][0]])
            speedup = tps / p_tps if tps and p_tps else None
            dspeed = dtps / p_dtps if dtps and p_dtps else None
            pred = _median([r.predicted for r in sel])
            diffs = [r for r in sel if r.match is False]
            rows.append({
                "task": task, "variant": v.key, "label": v.label, "family": v.family, "engine": v.engine,
                "gamma": v.gamma or None, "n_prompts": len({r.prompt_id for r in sel}),
                "repeats": len(reps), "n_tokens": _median([r.n_tokens for r in sel]),
                "tokens_per_s": tps, "speedup": speedup, "paired_speedup": paired,
                "decode_tokens_per_s": dtps, "decode_speedup": dspeed,
                "cpu_tokens_per_s": ctps, "cpu_speedup": ctps / p_ctps if ctps and p_ctps else None,
                "cpu_per_wall": _median([r.cpu_s / r.elapsed for r in sel if r.cpu_s and r.elapsed]),
                "alpha": _median([r.alpha for r in sel]), "alpha_hat": _median([r.alpha_hat for r in sel]),
                "tau": _median([r.tau for r in sel]), "c": _median([r.c for r in sel]),
                "v": _median([r.v for r in sel]), "predicted": pred,
                "measured_over_predicted": dspeed / pred if dspeed and pred else None,
                "peak_rss_mb": max((r.peak_rss_mb or 0) for r in sel) or None,
                "cuda_peak_mb": max((r.cuda_peak_mb or 0) for r in sel) or None,
                "mismatches": len(diffs), "runs": len(sel),
                "first_diff": min(r.first_diff for r in diffs) if diffs else None,
                "best": False,
            })
        # best γ of the draft-model sweep: highest median speedup
        sweep = [r for r in rows if r["task"] == task and r["family"] == "draft" and r["speedup"]]
        if sweep:
            max(sweep, key=lambda r: r["speedup"])["best"] = True
    return rows


def best_lines(rows: list[dict]) -> list[str]:
    """One line per task: SpecViz at its best γ vs plain and vs HF assisted."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        best = next((r for r in rows if r["task"] == task and r["best"]), None)
        if best is None:
            continue
        line = (f"{task}: SpecViz draft best γ={best['gamma']}: {_f(best['speedup'], '{:.2f}×')} vs plain "
                f"(decode {_f(best['decode_speedup'], '{:.2f}×')}, predicted {_f(best['predicted'], '{:.2f}×')}, "
                f"measured/predicted {_f(best['measured_over_predicted'], '{:.2f}')})")
        for hf in (r for r in rows if r["task"] == task and r["engine"] == "hf" and r["family"] != "hf-greedy"):
            if hf["tokens_per_s"] and best["tokens_per_s"]:
                line += f"; {best['tokens_per_s'] / hf['tokens_per_s']:.2f}× {hf['label']}"
        out.append(line)
    return out


# ------------------------------------------------------------------ output


def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


TABLE = [  # header, width, key, format
    ("task", 8, "task", None), ("method", 24, "label", None),
    ("tok/s", 6, "tokens_per_s", "{:.2f}"), ("speedup", 7, "speedup", "{:.2f}×"),
    ("paired", 6, "paired_speedup", "{:.2f}×"), ("dec t/s", 7, "decode_tokens_per_s", "{:.2f}"),
    ("dec spd", 7, "decode_speedup", "{:.2f}×"), ("cpu spd", 7, "cpu_speedup", "{:.2f}×"), ("α", 5, "alpha", "{:.2f}"), ("α̂", 5, "alpha_hat", "{:.2f}"),
    ("τ", 5, "tau", "{:.2f}"), ("c", 5, "c", "{:.2f}"), ("v", 5, "v", "{:.2f}"),
    ("pred", 6, "predicted", "{:.2f}×"), ("meas/pred", 9, "measured_over_predicted", "{:.2f}"),
    ("RSS GB", 6, "peak_rss_mb", None), ("HF≠", 8, "mismatches", None),
]


def _cell(row, key, fmt):
    if key == "peak_rss_mb":
        gb = row["cuda_peak_mb"] if row.get("cuda_peak_mb") else row["peak_rss_mb"]
        return _f(gb / 1024 if gb else None, "{:.1f}")
    if key == "mismatches":
        if row["engine"] != "hf":
            return ""
        if not row["mismatches"]:
            return "0"
        return f"{row['mismatches']}/{row['runs']}@{row['first_diff']}"
    if key == "label":
        return row["label"] + (" *" if row["best"] else "")
    if fmt is None:
        return str(row[key])
    return _f(row[key], fmt)


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
    lines = [
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
        f"{meta['max_new_tokens']} new tokens, {meta['repeats']} repeats (median), greedy, methods "
        f"interleaved per prompt (order rotated each repeat), warm-up {'on' if meta['warmup'] else 'off'}; "
        f"wall time {meta.get('wall_s', 0) / 60:.1f} min",
    ]
    return lines


LEGEND = """\
tok/s: new tokens / wall time including prefill (median over repeats of all the task's prompts together).
speedup: ratio of medians vs plain; paired: median of per-repeat ratios (same interleaved run).
dec t/s, dec spd: after the first output chunk (prefill and first round excluded).
cpu spd: tokens per process CPU second vs plain (robust to other jobs sharing the cores).
α: accepted/drafted; α̂: mean Σmin(p,q); τ: tokens per target forward; c: draft step / plain target step;
v: verify forward (γ+1 tokens) / plain target step; pred: Leviathan et al. (α̂, γ, c), which assumes v = 1;
meas/pred: dec spd / pred. RSS GB: peak resident memory (CUDA: max allocated). HF≠: HF runs whose
output differs from plain (runs/all@first differing position). * = best γ of the draft sweep."""


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})


# ------------------------------------------------------------------- plots


def _plot_data(rows: list[dict]):
    tasks = [t for t in dict.fromkeys(r["task"] for r in rows) if t != "all"]
    sweep = {t: sorted((r for r in rows if r["task"] == t and r["family"] == "draft"),
                       key=lambda r: r["gamma"]) for t in tasks}
    alpha_rows = [r for r in rows if r["task"] in tasks and r["engine"] == "specviz" and r["alpha"] is not None]
    return tasks, sweep, alpha_rows


PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]


DASH = {"solid": "", "dash": "6,4", "dot": "2,3"}
MPL_STYLE = {"solid": "o-", "dash": "o--", "dot": "s:"}


def _svg_lines(path: Path, title: str, series: list[tuple[str, list[float], list[float], str, str]],
               xlabel: str, ylabel: str) -> None:
    """A tiny dependency-free SVG line chart. series: (name, xs, ys, colour, style)."""
    W, H, L, R, T, B = 680, 400, 60, 210, 40, 50
    pts = [(x, y) for _, xs, ys, _, _ in series for x, y in zip(xs, ys) if y is not None]
    if not pts:
        return
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = 0.0, max(1.2, max(p[1] for p in pts) * 1.1)
    x1 = x1 if x1 > x0 else x0 + 1
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)  # noqa: E731
    sy = lambda y: H - B - (y - y0) / (y1 - y0) * (H - T - B)  # noqa: E731
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{_esc(title)}</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
         f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">{_esc(xlabel)}</text>',
         f'<text x="15" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 15 {(T + H - B) / 2})">{_esc(ylabel)}</text>']
    for x in sorted({p[0] for p in pts}):
        o.append(f'<text x="{sx(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:g}</text>')
    step = 0.5 if y1 <= 4 else 1.0
    y = 0.0
    while y <= y1 + 1e-9:
        o.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step
    o.append(f'<line x1="{L}" y1="{sy(1):.1f}" x2="{W - R}" y2="{sy(1):.1f}" stroke="#888" stroke-dasharray="2,2"/>')
    for i, (name, xs, ys, colour, style) in enumerate(series):
        xy = [(sx(x), sy(y)) for x, y in zip(xs, ys) if y is not None]
        if not xy:
            continue
        dash = f' stroke-dasharray="{DASH[style]}"' if DASH[style] else ""
        o.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="'
                 + " ".join(f"{a:.1f},{b:.1f}" for a, b in xy) + '"/>')
        o += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in xy]
        ly = T + 10 + 18 * i
        o.append(f'<line x1="{W - R + 10}" y1="{ly}" x2="{W - R + 35}" y2="{ly}" stroke="{colour}" stroke-width="2"{dash}/>')
        o.append(f'<text x="{W - R + 40}" y="{ly + 4}">{_esc(name)}</text>')
    o.append("</svg>")
    path.write_text("\n".join(o))


def _svg_bars(path: Path, title: str, groups: list[str], names: list[str], values: dict, ylabel: str) -> None:
    """Grouped bar chart; values[(group, name)] -> value or None."""
    W, H, L, R, T, B = 640, 400, 60, 170, 40, 50
    if not groups or not names:
        return
    gw = (W - L - R) / len(groups)
    bw = gw * 0.8 / len(names)
    sy = lambda y: H - B - y * (H - T - B)  # noqa: E731  (0..1)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{_esc(title)}</text>',
         f'<text x="15" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 15 {(T + H - B) / 2})">{_esc(ylabel)}</text>']
    for k in range(6):
        y = k / 5
        o.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.1f}</text>')
    for gi, g in enumerate(groups):
        o.append(f'<text x="{L + gw * (gi + 0.5):.1f}" y="{H - B + 16}" text-anchor="middle">{_esc(g)}</text>')
        for ni, n in enumerate(names):
            val = values.get((g, n))
            if val is None:
                continue
            x = L + gw * gi + gw * 0.1 + bw * ni
            o.append(f'<rect x="{x:.1f}" y="{sy(val):.1f}" width="{bw:.1f}" height="{sy(0) - sy(val):.1f}" '
                     f'fill="{PALETTE[ni % len(PALETTE)]}"/>')
    o.append(f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>')
    for ni, n in enumerate(names):
        ly = T + 10 + 18 * ni
        o.append(f'<rect x="{W - R + 10}" y="{ly - 6}" width="12" height="12" fill="{PALETTE[ni % len(PALETTE)]}"/>')
        o.append(f'<text x="{W - R + 28}" y="{ly + 4}">{_esc(n)}</text>')
    o.append("</svg>")
    path.write_text("\n".join(o))


def _esc(s: str) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_plots(out: Path, rows: list[dict], title_suffix: str = "") -> list[str]:
    """plots.html (plotly), speedup_vs_gamma.svg/.png and alpha_by_task.svg/.png; returns notes."""
    notes = []
    tasks, sweep, alpha_rows = _plot_data(rows)
    names = list(dict.fromkeys(r["label"].replace("SpecViz ", "") for r in alpha_rows))
    alpha_vals = {(r["task"], r["label"].replace("SpecViz ", "")): r["alpha"] for r in alpha_rows}
    # hand-made SVG: always
    series = []
    for i, t in enumerate(tasks):
        rs = sweep[t]
        if not rs:
            continue
        col = PALETTE[i % len(PALETTE)]
        xs = [r["gamma"] for r in rs]
        series.append((f"{t} measured", xs, [r["speedup"] for r in rs], col, "solid"))
        series.append((f"{t} measured, decode", xs, [r["decode_speedup"] for r in rs], col, "dot"))
        series.append((f"{t} predicted", xs, [r["predicted"] for r in rs], col, "dash"))
    _svg_lines(out / "speedup_vs_gamma.svg", f"Speedup vs γ (draft model){title_suffix}", series,
               "γ (draft tokens per round)", "speedup vs plain")
    _svg_bars(out / "alpha_by_task.svg", f"Acceptance rate α by task{title_suffix}", tasks, names, alpha_vals,
              "α (accepted / drafted)")
    # matplotlib PNG: when installed
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        for name, xs, ys, col, style in series:
            ax.plot(xs, [float("nan") if y is None else y for y in ys], MPL_STYLE[style], color=col, label=name)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.axhline(1.0, color="#888", lw=0.8, ls=":")
        ax.set(xlabel="γ (draft tokens per round)", ylabel="speedup vs plain",
               title=f"Speedup vs γ (draft model){title_suffix}")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "speedup_vs_gamma.png")
        plt.close(fig)
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        w = 0.8 / max(1, len(names))
        for ni, n in enumerate(names):
            xs = [ti + ni * w for ti in range(len(tasks))]
            ax.bar(xs, [alpha_vals.get((t, n)) or 0 for t in tasks], w, label=n, color=PALETTE[ni % len(PALETTE)])
        ax.set_xticks([ti + w * (len(names) - 1) / 2 for ti in range(len(tasks))], tasks)
        ax.set(ylabel="α (accepted / drafted)", ylim=(0, 1), title=f"Acceptance rate α by task{title_suffix}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "alpha_by_task.png")
        plt.close(fig)
    except ImportError:
        notes.append("matplotlib not installed: PNG plots skipped (SVG written)")
    # plotly HTML: self-contained (kaleido, for write_image, is not needed)
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
        f1 = go.Figure()
        for name, xs, ys, col, style in series:
            f1.add_scatter(x=xs, y=ys, name=name, mode="lines+markers", line=dict(color=col, dash=style))
        f1.add_hline(y=1.0, line_dash="dot", line_color="#888")
        f1.update_layout(title=f"Speedup vs γ (draft model){title_suffix}", xaxis_title="γ",
                         yaxis_title="speedup vs plain (tokens/s ratio of medians)")
        f2 = go.Figure()
        for ni, n in enumerate(names):
            f2.add_bar(x=tasks, y=[alpha_vals.get((t, n)) for t in tasks], name=n,
                       marker_color=PALETTE[ni % len(PALETTE)])
        f2.update_layout(title=f"Acceptance rate α by task{title_suffix}", yaxis_title="α", yaxis_range=[0, 1],
                         barmode="group")
        body = pio.to_html(f1, include_plotlyjs=True, full_html=False) + \
            pio.to_html(f2, include_plotlyjs=False, full_html=False)
        (out / "plots.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>SpecViz bench"
                                        f"</title></head><body>{body}</body></html>")
    except ImportError:
        notes.append("plotly not installed: plots.html skipped")
    return notes


# -------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specviz.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--quick", action="store_true",
                    help=f"small subset: {QUICK['n_prompts']} prompts, {QUICK['max_new_tokens']} new tokens, "
                         f"γ {QUICK['gammas']}, {QUICK['repeats']} repeats, HF assisted γ={QUICK['hf_gammas']} only")
    ap.add_argument("--tasks", help=f"comma list of code,chat,grounded (default {FULL['tasks']})")
    ap.add_argument("--n-prompts", help="prompts per task: N, or task=N,... (default 1)")
    ap.add_argument("--prompts-json", help="JSON list of {id, task, text[, chat_template]} to use instead "
                                           "of the packaged prompt sets")
    ap.add_argument("--max-new-tokens", type=int, help="tokens per run (default 32)")
    ap.add_argument("--gammas", help="γ sweep of the draft-model method (default 1,2,...,8)")
    ap.add_argument("--hf-gammas", help="constant γ values for HF assisted generation (default 4)")
    ap.add_argument("--gamma-other", type=int, default=4,
                    help="γ for the other SpecViz methods (lookup: tokens per round; adaptive: start) (default 4)")
    ap.add_argument("--repeats", type=int, help="runs per prompt and method; the median is reported (default 3)")
    ap.add_argument("--methods", help="comma list from: " + ",".join(FAMILIES) + " (plain always runs)")
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate (greedy and assisted)")
    ap.add_argument("--out", help="output folder (default bench-results/<timestamp>/)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help=f"one untimed {WARMUP_TOKENS}-token run per method first (default on)")
    return ap


def _ints(value: str, name: str) -> list[int]:
    try:
        xs = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise RequestError(f"{name} must be a comma list of whole numbers, got {value!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise RequestError(f"{name} must list numbers >= 1, got {value!r}")
    return xs


def resolve_settings(args) -> dict:
    preset = QUICK if args.quick else FULL
    get = lambda k: getattr(args, k) if getattr(args, k) is not None else preset[k]  # noqa: E731
    tasks = [t.strip() for t in get("tasks").split(",") if t.strip()]
    bad = [t for t in tasks if t not in ("code", "chat", "grounded")]
    if bad or not tasks:
        raise RequestError(f"--tasks: unknown task(s) {bad}: use code, chat, grounded")
    families = [m.strip() for m in get("methods").split(",") if m.strip()]
    bad = [m for m in families if m not in FAMILIES]
    if bad:
        raise RequestError(f"--methods: unknown {bad}: choose from {', '.join(FAMILIES)}")
    if args.no_hf:
        families = [m for m in families if m not in HF_FAMILIES]
    if "plain" not in families:
        families.insert(0, "plain")
    repeats = get("repeats")
    if repeats < 1:
        raise RequestError("--repeats must be at least 1")
    n = get("max_new_tokens")
    if n < 2:
        raise RequestError("--max-new-tokens must be at least 2")
    # explicit --tasks with the quick preset's per-task counts: default to 1 for a listed task
    counts = parse_counts(get("n_prompts"), tasks)
    if args.tasks and args.n_prompts is None:
        counts = {t: counts.get(t) or 1 for t in tasks}
    return dict(tasks=tasks, counts=counts, families=families, repeats=repeats, max_new_tokens=n,
                gammas=_ints(get("gammas"), "--gammas"), hf_gammas=_ints(get("hf_gammas"), "--hf-gammas"),
                gamma_other=args.gamma_other)


def build_variants(pair, s: dict, notes: list[str]) -> list[Variant]:
    from ..runner import make_proposer
    vs = [Variant("plain", "plain", "specviz")]
    fam = s["families"]
    hf_ok = pair.draft is not None
    if "hf-greedy" in fam:
        vs.append(Variant("hf-greedy", "hf-greedy", "hf"))
    if "hf-assisted" in fam and hf_ok:
        vs += [Variant(f"hf-assisted:{g}", "hf-assisted", "hf", g) for g in s["hf_gammas"]]
    if "hf-heuristic" in fam and hf_ok:
        vs.append(Variant("hf-assisted:heuristic", "hf-heuristic", "hf"))
    if "hf-stock" in fam and hf_ok:
        if pair.quantize == "int8":
            notes.append("HF assisted stock skipped: the target itself is int8 here, stock would be another model")
        else:
            vs += [Variant(f"hf-stock:{g}", "hf-stock", "hf", g) for g in s["hf_gammas"]]
    for m in METHODS:
        if m not in fam:
            continue
        try:
            make_proposer(pair, m)
        except RequestError as e:
            notes.append(f"method {m!r} skipped: {e}")
            continue
        gammas = s["gammas"] if m == "draft" else [s["gamma_other"]]
        vs += [Variant(f"{m}:{g}", m, "specviz", g) for g in gammas]
    return vs


def build_variants_used(runs: list[Run], variants: list[Variant]) -> list[Variant]:
    """The variants that have runs, in their original order (a variant dropped mid-run keeps its rows)."""
    used = {r.variant for r in runs}
    return [v for v in variants if v.key in used]


def _estimate(warm: dict[str, Run], n_tokens: int) -> float | None:
    """Seconds for one run of each variant at n_tokens, from the warm-up runs."""
    total = 0.0
    for r in warm.values():
        if r.first_t is None or r.n_tokens <= r.first_n or r.elapsed <= r.first_t:
            total += r.elapsed * n_tokens / max(1, r.n_tokens)
        else:
            per = (r.elapsed - r.first_t) / (r.n_tokens - r.first_n)
            total += r.first_t + per * max(0, n_tokens - r.first_n)
    return total


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_bench(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    s = resolve_settings(args)
    command = "python -m specviz.bench " + shlex.join(argv)
    out = Path(args.out or Path("bench-results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    prompts = load_prompts(s["tasks"], s["counts"], args.prompts_json)
    if not prompts:
        raise RequestError("no prompts selected: check --tasks / --n-prompts / --prompts-json")

    import transformers
    from ..cli import load_from_args
    from ..request import encode_prompt, make_request
    transformers.logging.set_verbosity_error()
    _log(f"loading the pair (load average {loadavg()}) ...")
    if args.engine == "vllm":  # --engine vllm: add the vLLM rows; our rows still run on our engine
        s["families"] += [f for f in vllm_rows.FAMILIES if f not in s["families"]]
        args.engine = "specviz"
    pair = load_from_args(args, progress=lambda msg, frac: _log(f"  [{frac:4.0%}] {msg}"))
    spec_used = pair.spec
    nbytes = {k: weight_bytes(m) for k, m in (("target", pair.target), ("draft", pair.draft)) if m is not None}
    device = pair.target.device
    meta = {"machine": machine_info(pair, device), "command": command, "pair": pair.spec.label,
            "pair_target": pair.spec.target, "pair_draft": pair.spec.draft,
            "max_new_tokens": s["max_new_tokens"], "repeats": s["repeats"], "warmup": args.warmup,
            "settings": {k: v for k, v in s.items()}, "load_s": round(time.perf_counter() - t_start, 1)}
    variants = build_variants(pair, s, notes)
    if "hf-assisted" in s["families"] and pair.draft is None:
        notes.append("HF assisted skipped: this pair has no draft model")

    # encode once; skip prompts that do not fit
    max_pos = getattr(pair.target.config, "max_position_embeddings", None)
    encoded = []
    for p in prompts:
        req = make_request(p.text, max_new_tokens=s["max_new_tokens"], chat_template=p.chat_template)
        try:
            encoded.append((p, encode_prompt(pair.tokenizer, req, max_pos)))
        except RequestError as e:
            notes.append(f"prompt {p.id} skipped: {e}")
    if not encoded:
        raise RequestError("no prompt fits this model: " + "; ".join(notes))
    meta["prompts_line"] = ", ".join(f"{t} {sum(1 for p, _ in encoded if p.task == t)}"
                                     for t in s["tasks"]) + " (" + ", ".join(
        f"{p.id} [{len(ids)} tok{', chat' if p.chat_template else ''}]" for p, ids in encoded) + ")"
    for n in notes:
        _log("note: " + n)
    _log(f"{len(encoded)} prompts × {len(variants)} methods × {s['repeats']} repeats = "
         f"{len(encoded) * len(variants) * s['repeats']} runs of {s['max_new_tokens']} tokens")

    failed: dict[str, str] = {}
    if args.warmup:
        warm = {}
        p, ids = encoded[0]
        for v in variants:
            t0 = time.perf_counter()
            try:
                warm[v.key], _ = measure(pair, v, p, ids, min(WARMUP_TOKENS, s["max_new_tokens"]),
                                         Run(v.key, v.family, v.engine, v.gamma, p.task, p.id, -1, 0))
            except Exception as e:  # noqa: BLE001 - one broken method must not sink the others
                if v.family == "plain":
                    raise
                failed[v.key] = f"{type(e).__name__}: {e}"
                notes.append(f"{v.key} failed in warm-up and was skipped: {failed[v.key]}")
                _log("note: " + notes[-1])
            else:
                _log(f"  warm-up {v.key}: {time.perf_counter() - t0:.1f} s")
        variants = [v for v in variants if v.key not in failed]
        est = _estimate(warm, s["max_new_tokens"]) * len(encoded) * s["repeats"]
        meta["estimated_s"] = round(est)
        _log(f"estimated time: {est / 60:.1f} min (from the warm-up runs; prefill length varies by prompt)")

    runs: list[Run] = []
    blocks = len(encoded) * s["repeats"]
    t_runs = time.perf_counter()
    done = 0
    for pi, (p, ids) in enumerate(encoded):
        for rep in range(s["repeats"]):
            live = [v for v in variants if v.key not in failed]
            k = (rep + pi) % len(live)
            order = live[k:] + live[:k]  # rotate: no method always first or last
            block: dict[str, tuple[Run, object]] = {}
            for pos, v in enumerate(order):
                run = Run(v.key, v.family, v.engine, v.gamma, p.task, p.id, rep, pos)
                try:
                    block[v.key] = measure(pair, v, p, ids, s["max_new_tokens"], run)
                except Exception as e:  # noqa: BLE001
                    if v.family == "plain":
                        raise
                    run.error = failed[v.key] = f"{type(e).__name__}: {e}"
                    notes.append(f"{v.key} failed on {p.id} and was dropped from later runs: {run.error}")
                    _log("note: " + notes[-1])
                runs.append(run)
            base = block["plain"][1]
            for key, (run, summary) in block.items():
                if run.engine == "specviz" and run.family != "plain":
                    add_stats(run, summary, base)
            with open(out / "runs.partial.jsonl", "a") as f:  # what a killed bench leaves behind
                for run in runs[-len(order):]:
                    f.write(json.dumps({**run.row(), "token_ids": run.token_ids}) + "\n")
            done += 1
            spent = time.perf_counter() - t_runs
            _log(f"[{done}/{blocks}] {p.id} repeat {rep + 1}: plain {block['plain'][0].tokens_per_s:.2f} tok/s; "
                 f"{spent / 60:.1f} min so far, about {spent / done * (blocks - done) / 60:.1f} min left")

    vvariants = vllm_rows.variants(s, Variant)
    if vvariants:
        from ..engines.vllm import load_vllm
        pair = None  # free our pair: the vLLM servers need the memory
        import gc
        gc.collect()
        try:
            vpair = load_vllm(spec_used, urls=args.vllm_url, device=str(device).split(":")[0])
        except ModelError as e:
            notes.append(f"vLLM rows skipped: {e}")
        else:
            runs += vllm_rows.run_rows(vpair, vvariants, encoded, s, Run, add_stats, _log, notes)
            variants += vvariants
    try:
        hf_warnings = check_outputs(runs, strict_only=False)
        check_outputs(runs)
        mismatch = None
    except OutputMismatch as e:
        mismatch = str(e)
    for w in hf_warnings:
        notes.append("HF or vLLM output differs from plain (numerical near-tie, other precision?): " + w)
    all_variants = build_variants_used(runs, variants)
    rows = summarize(runs, all_variants, s["tasks"])
    per_prompt = summarize(runs, all_variants, s["tasks"], by_prompt=True)
    meta["machine"]["loadavg_end"] = loadavg()
    loads = [r.load1 for r in runs if r.load1 is not None]
    if loads:
        meta["machine"]["load1_range"] = f"{min(loads):.2f}–{max(loads):.2f} (median {_median(loads):.2f})"
    util = _median([r.cpu_s / r.elapsed for r in runs if r.cpu_s and r.elapsed])
    meta["machine"]["cpu_per_wall"] = round(util, 2) if util else None
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    meta["notes"] = notes

    notes += bench_lines(device, nbytes, runs)  # --device cuda: step time against the bandwidth limit
    table = format_table(rows)
    text = "\n".join(header_lines(meta) + ["", table, "", *best_lines(rows), *vllm_rows.vs_plain_lines(rows),
                                           "", LEGEND]
                     + ([""] + [f"note: {n}" for n in notes] if notes else []))
    notes += write_plots(out, rows, f" — {meta['machine']['precision']}")
    payload = {"meta": meta, "prompts": [{**asdict(p), "n_prompt_tokens": len(ids)} for p, ids in encoded],
               "summary": rows, "per_prompt": per_prompt, "best": best_lines(rows), "mismatch": mismatch,
               "runs": [{**r.row(), "token_ids": r.token_ids} for r in runs]}
    (out / "bench.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False))
    write_csv(out / "runs.csv", [r.row() for r in runs], RUN_COLUMNS)
    write_csv(out / "summary.csv", rows, SUMMARY_COLUMNS)
    write_csv(out / "per_prompt.csv", [{**r, "prompt_id": r["task"]} for r in per_prompt],
              ["prompt_id" if c == "task" else c for c in SUMMARY_COLUMNS])
    (out / "table.txt").write_text(text + "\n")
    (out / "runs.partial.jsonl").unlink(missing_ok=True)  # bench.json has it all
    print(text)
    print(f"\nwrote {out}/ (bench.json, runs.csv, summary.csv, per_prompt.csv, table.txt, plots)")
    if mismatch:
        print(f"\nFAILED: {mismatch}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run_bench(argv)
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
