"""One measured run per (method, prompt, repeat): what ran, what it took, and
the engine's own RunSummary and Stats for SpecViz runs (held, not copied)."""
from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine.events import RoundEvent, RunSummary, TokenEvent
from ..engine.metrics import Stats, run_stats
from ..engine.proposer import describe, summarize
from ..engine.proposers import method_spec
from ..run.equality import judge
from ..run.request import METHODS, RequestError, make_request
from .hf import run_hf
from .settings import BenchPrompt, Settings

RUN_COLUMNS = [
    "variant", "family", "engine", "gamma", "task", "prompt_id", "repeat", "order", "n_tokens",
    "elapsed", "cpu_s", "first_t", "first_n", "tokens_per_s", "decode_tokens_per_s", "stop_reason",
    "peak_rss_mb", "cuda_peak_mb", "match", "first_diff", "rounds", "drafted", "accepted",
    "draft_time", "verify_time", "draft_forwards", "target_forwards", "prefill",
    "alpha", "alpha_hat", "tau", "c", "v", "t_draft_step", "t_target_step", "speedup_run",
    "predicted", "gamma_mean", "predicted_v", "method_info", "load1", "error",
]
FROM_SUMMARY = ("target_forwards", "prefill")  # every SpecViz run
FROM_ROUNDS = ("rounds", "drafted", "accepted", "draft_time", "verify_time", "draft_forwards")  # speculative
FROM_STATS = {"alpha": "alpha", "alpha_hat": "alpha_hat", "tau": "tau", "c": "c", "v": "verify_cost",
              "t_draft_step": "t_draft_step", "t_target_step": "t_target_step", "speedup_run": "speedup",
              "predicted": "predicted", "gamma_mean": "gamma_mean", "predicted_v": "predicted_v"}


class OutputMismatch(RuntimeError):
    """A SpecViz method's greedy output differs from the plain baseline's."""


@dataclass(frozen=True)
class Variant:
    key: str  # unique, ASCII: "plain", "draft:4", "hf-assisted:4", "hf-assisted:heuristic"
    family: str  # "plain", "hf-greedy", "hf-assisted", "hf-heuristic", or a SpecViz method
    engine: str  # "specviz" | "hf" | "vllm" (bench/vllm_rows.py) | "llamacpp" (bench/llamacpp_rows.py)
    gamma: int = 0  # 0: not applicable (plain, HF greedy, HF heuristic start)
    auto: bool = False  # γ auto: chosen each round from the measured costs (engine/gamma.py)
    options: tuple = ()  # ((name, value), ...): method settings of a --sweep (RunRequest.options)

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
            return "vLLM plain" if self.family == "vllm" else f"vLLM speculative γ={self.gamma}"
        if self.engine == "llamacpp":
            return "llama.cpp plain" if self.family == "llamacpp" else f"llama.cpp speculative γ={self.gamma}"
        extra = "".join(f" {k.split('_')[-1]}={v}" for k, v in self.options)
        return f"SpecViz {self.family} γ={'auto' if self.auto else self.gamma}{extra}"


@dataclass
class Run:
    """One measured run (a JSON/CSV row). Engine numbers live in `summary` and `stats`."""

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
    load1: float | None = None  # 1-minute load average of the machine when the run ended
    error: str | None = None
    # the method's own totals (MethodSpec.summarize, e.g. "suffix rounds 12  model rounds 3")
    method_info: str = ""
    token_ids: list[int] = field(default_factory=list)
    gaps: list = field(default_factory=list)  # SpecViz greedy runs: target top-2 logit gap per output token
    summary: RunSummary | None = None  # SpecViz runs: the engine's own summary
    stats: Stats | None = None  # speculative SpecViz runs: run_stats against the paired plain run

    @classmethod
    def of(cls, variant: Variant, prompt: BenchPrompt, repeat: int, order: int) -> Run:
        return cls(variant.key, variant.family, variant.engine, variant.gamma, prompt.task, prompt.id,
                   repeat, order)

    def value(self, column: str):
        """A RUN_COLUMNS value, read from the run, its summary or its stats."""
        if column in FROM_STATS:
            return getattr(self.stats, FROM_STATS[column]) if self.stats else None
        if column in FROM_SUMMARY or column in FROM_ROUNDS:
            if self.summary is None or (column in FROM_ROUNDS and self.family == "plain"):
                return None
            return getattr(self.summary, column)
        return getattr(self, column)

    def row(self) -> dict:
        return {k: self.value(k) for k in RUN_COLUMNS}


# ------------------------------------------------------------ output checking


def first_difference(ref: list[int], got: list[int]) -> int | None:
    """Index of the first differing token (the shorter length if one is a prefix); None if equal."""
    for i, (a, b) in enumerate(zip(ref, got, strict=False)):  # lengths may differ
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def check_outputs(runs: list[Run], strict_only: bool = True, dtype: torch.dtype = torch.float32) -> list[str]:
    """Compare every run's token ids with the plain baseline of the same prompt
    (its first repeat); fills run.match / run.first_diff.

    Raises OutputMismatch listing every strict (SpecViz) run that differs,
    unless run/equality.py judges the first difference a numerical near-tie
    (both runs' tokens top of their own rows and each other's runner-up, both
    top-2 gaps within rounding of the target's precision). Returns warning
    lines for near-ties and non-strict (HF) runs."""
    ref: dict[str, Run] = {}
    for r in runs:
        if r.family == "plain" and r.error is None and r.prompt_id not in ref:
            ref[r.prompt_id] = r
    errors, warnings = [], []
    for r in runs:
        if r.error is not None or r.prompt_id not in ref:
            continue
        base, base_gaps = ref[r.prompt_id].token_ids, ref[r.prompt_id].gaps
        pos = first_difference(base, r.token_ids)
        r.match, r.first_diff = pos is None, pos
        if pos is None:
            continue
        eq = None
        if pos < min(len(base), len(r.token_ids), len(base_gaps), len(r.gaps)):
            eq = judge(pos, base[pos], r.token_ids[pos], base_gaps[pos], r.gaps[pos], dtype)
        near = eq is not None and eq.verdict == "near-tie"
        what = (f"{r.variant} on {r.prompt_id} (repeat {r.repeat + 1}): first differing position {pos} "
                f"(baseline token {base[pos] if pos < len(base) else 'END'}, "
                f"got {r.token_ids[pos] if pos < len(r.token_ids) else 'END'}; "
                f"lengths {len(base)} vs {len(r.token_ids)}"
                + (f"; target top-2 logit gap {eq.gap:.3g}, near-tie threshold {eq.threshold:.3g}: "
                   f"{eq.reason}" if eq is not None and eq.gap is not None else "")
                + ")")
        strict = r.engine == "specviz" and not near
        (errors if strict else warnings).append(("numerical near-tie: " if near else "") + what)
    if errors and strict_only:
        raise OutputMismatch("greedy output differs from the plain baseline:\n  " + "\n  ".join(errors))
    return warnings


# ------------------------------------------------------------------ variants


def build_variants(pair, settings: Settings, notes: list[str]) -> list[Variant]:
    """Every (method, γ) to run on this pair; methods the pair cannot run get a note."""
    from ..run import runner
    variants = [Variant("plain", "plain", "specviz")]
    families = settings.families
    has_draft = pair.draft is not None
    if "hf-greedy" in families:
        variants.append(Variant("hf-greedy", "hf-greedy", "hf"))
    if "hf-assisted" in families and has_draft:
        variants += [Variant(f"hf-assisted:{g}", "hf-assisted", "hf", g) for g in settings.hf_gammas]
    if "hf-heuristic" in families and has_draft:
        variants.append(Variant("hf-assisted:heuristic", "hf-heuristic", "hf"))
    if "hf-stock" in families and has_draft:
        if pair.quantize == "int8":
            notes.append("HF assisted stock skipped: the target itself is int8 here, "
                         "stock would be another model")
        else:
            variants += [Variant(f"hf-stock:{g}", "hf-stock", "hf", g) for g in settings.hf_gammas]
    for method in METHODS:
        if method not in families:
            continue
        try:
            runner.build_proposer(pair, method)
        except RequestError as e:
            notes.append(f"method {method!r} skipped: {e}")
            continue
        if method_spec(method).own_gamma:  # it prices each round's length itself: γ auto is only its cap
            variants.append(Variant(f"{method}:auto", method, "specviz", 0, auto=True))
            continue
        gammas = settings.gammas if method in ("draft", "eagle") else [settings.gamma_other]
        variants += [Variant(f"{method}:{g}", method, "specviz", g) for g in gammas]
        for name, values in settings.sweeps.get(method, {}).items():  # e.g. tree budget 4,8,16
            variants += [Variant(f"{method}:{g}[{name}={v}]", method, "specviz", g, options=((name, v),))
                         for g in gammas for v in values]
        if method in ("draft", "eagle", "tree", "lookup") and settings.gamma_auto:  # a tree's depth is its γ
            variants.append(Variant(f"{method}:auto", method, "specviz", 0, auto=True))
            if method == "tree":
                variants += [Variant(f"{method}:auto[{name}={v}]", method, "specviz", 0, auto=True,
                                     options=((name, v),))
                             for name, values in settings.sweeps.get(method, {}).items() for v in values]
    return variants


# ------------------------------------------------------------------- measuring


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


def run_specviz(pair, variant: Variant, req, ids: list[int]) -> tuple[RunSummary, dict]:
    """One SpecViz run through run_events; returns (RunSummary, first-chunk info)."""
    from ..run.runner import run_events
    mode = "baseline" if variant.family in ("plain", "vllm") else "speculative"
    first_t, first_n, summary, gaps, rounds = None, 0, None, [], []
    for ev in run_events(pair, req, mode, ids):
        if isinstance(ev, TokenEvent):
            if first_t is None:
                first_t, first_n = ev.t, 1
            gaps.append(ev.gap)
        elif isinstance(ev, RoundEvent):
            if first_t is None and ev.n_new:
                first_t, first_n = ev.t_end, ev.n_new
            gaps += [t.gap for t in ev.tokens if t.in_output]
            rounds.append(ev)
        else:
            summary = ev
    info = describe(summarize(rounds, req.method)) if rounds else ""
    return summary, {"first_t": first_t, "first_n": first_n, "gaps": gaps, "method_info": info}


def _run_engine(pair, variant: Variant, prompt: BenchPrompt, ids: list[int], max_new_tokens: int,
                run: Run) -> dict:
    """Run SpecViz, HF or llama.cpp; fills the run's output fields, returns the first-chunk info."""
    if variant.engine == "llamacpp":  # `pair`: the bench's LlamaCppRows (bench/llamacpp_rows.py)
        return pair.run(variant, ids, max_new_tokens, run)
    if variant.engine in ("specviz", "vllm"):  # vLLM: a VllmPair, the same events (hosting/vllm.py)
        method = variant.family if variant.engine == "specviz" and variant.family != "plain" else "draft"
        gamma = "auto" if variant.auto else max(1, variant.gamma)
        req = make_request(prompt.text, method=method, gamma=gamma,
                           max_new_tokens=max_new_tokens, temperature=0.0, seed=0,
                           chat_template=prompt.chat_template, options=dict(variant.options))
        summary, first = run_specviz(pair, variant, req, ids)
        run.summary, run.gaps, run.method_info = summary, first["gaps"], first["method_info"]
        run.token_ids, run.n_tokens, run.elapsed = list(summary.token_ids), summary.n_tokens, summary.elapsed
        run.stop_reason = summary.stop_reason
        return first
    res = run_hf(pair, variant.family, variant.gamma, ids, max_new_tokens)
    run.token_ids, run.n_tokens, run.elapsed = res["token_ids"], len(res["token_ids"]), res["elapsed"]
    run.stop_reason = res["stop_reason"]
    return res


def measure(pair, variant: Variant, prompt: BenchPrompt, ids: list[int], max_new_tokens: int,
            run: Run) -> Run:
    """Run one variant on one prompt; fills and returns `run` (SpecViz: with its RunSummary)."""
    cuda = str(pair.target.device).startswith("cuda")
    _reset_peak(cuda)
    cpu0 = time.process_time()
    first = _run_engine(pair, variant, prompt, ids, max_new_tokens, run)
    # an engine in another process (llama.cpp) reports its own CPU time and peak memory
    run.cpu_s = first["cpu_s"] if "cpu_s" in first else time.process_time() - cpu0
    run.first_t, run.first_n = first["first_t"], first["first_n"]
    peak = first["peak_rss_mb"] if "peak_rss_mb" in first else _peak_rss_mb()
    run.peak_rss_mb = round(peak, 1) if peak is not None else None
    with contextlib.suppress(OSError):
        run.load1 = round(os.getloadavg()[0], 2)
    if cuda:
        import torch
        run.cuda_peak_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    run.tokens_per_s = run.n_tokens / run.elapsed if run.elapsed > 0 else None
    if run.first_t is not None and run.n_tokens > run.first_n and run.elapsed > run.first_t:
        run.decode_tokens_per_s = (run.n_tokens - run.first_n) / (run.elapsed - run.first_t)
    return run


def add_stats(run: Run, base: RunSummary, costs=None) -> None:
    """α, τ, c, predictions of a speculative run: run_stats against the paired baseline
    (`costs`: the pair's CostModel, for the verify-cost-aware prediction)."""
    run.stats = run_stats(run.summary, base, costs)
