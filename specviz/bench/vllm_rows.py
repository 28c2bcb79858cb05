"""Bench rows `vllm` and `vllm speculative`: the same prompts on vLLM servers
(`--methods …,vllm,vllm-spec` or `--engine vllm`).

They run after our own rows, one server at a time, with our pair freed first:
on a 24 GB CPU machine our fp32 pair and two vLLM servers do not fit together.
So they are not interleaved with ours (a note says so). The speedup column is
against our plain rows; `vllm speculative` also gets a line against vLLM plain.
"""
from __future__ import annotations

import gc
import time

from .runs import Run, Variant, add_stats, measure

FAMILIES = ("vllm", "vllm-spec")


def variants(families: list[str], gamma: int) -> list[Variant]:
    out = []
    if "vllm" in families:
        out.append(Variant("vllm", "vllm", "vllm"))
    if "vllm-spec" in families:
        out.append(Variant(f"vllm-spec:{gamma}", "vllm-spec", "vllm", gamma))
    return out


def run_rows(bench, args, log) -> None:
    """Measure the vLLM variants of `bench` (one warm-up, then every prompt ×
    repeat, per variant); appends runs, variants and notes to `bench`."""
    from ..errors import ModelError
    from ..hosting.vllm import load_vllm
    vs = variants(bench.settings.families, bench.settings.gamma_other)
    if not vs:
        return
    spec, device = bench.pair.spec, str(bench.pair.target.device).split(":")[0]
    bench.pair = None  # free our pair: the vLLM servers need the memory
    gc.collect()
    try:
        vpair = load_vllm(spec, urls=args.vllm_url, device=device)
    except ModelError as e:
        bench.note(f"vLLM rows skipped: {e}")
        return
    base = {}
    try:
        for v in vs:
            t0 = time.perf_counter()
            prompt, ids = bench.encoded[0]
            try:
                measure(vpair, v, prompt, ids, 8, Run.of(v, prompt, -1, 0))
            except ModelError as e:
                bench.note(f"{v.key} skipped: {e}")
                continue
            log(f"  {v.key}: server up and warm in {time.perf_counter() - t0:.0f} s")
            bench.variants.append(v)
            for prompt, ids in bench.encoded:
                for rep in range(bench.settings.repeats):
                    run = measure(vpair, v, prompt, ids, bench.settings.tokens_for(prompt.task),
                                  Run.of(v, prompt, rep, 0))
                    # the work happens in the server: our process's CPU time and memory say nothing
                    run.cpu_s = run.peak_rss_mb = None
                    if v.family == "vllm":
                        base[(prompt.id, rep)] = run.summary
                    else:
                        run.stats = None
                        add_stats(run, base.get((prompt.id, rep)))
                    bench.runs.append(run)
                    log(f"  {v.key} {prompt.id} repeat {rep + 1}: {run.tokens_per_s:.2f} tok/s")
    finally:
        vpair.close()
    bench.notes.append("vLLM rows ran after ours, one server at a time (our pair freed first), not "
                       "interleaved; their α comes from vLLM's /metrics, α̂ and c are not exposed by vLLM")


def vs_plain_lines(rows: list[dict]) -> list[str]:
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        plain = next((r for r in rows if r["task"] == task and r["family"] == "vllm"), None)
        spec = next((r for r in rows if r["task"] == task and r["family"] == "vllm-spec"), None)
        if plain and spec and plain["tokens_per_s"] and spec["tokens_per_s"]:
            out.append(f"{task}: vLLM speculative γ={spec['gamma']} "
                       f"{spec['tokens_per_s'] / plain['tokens_per_s']:.2f}× vLLM plain "
                       f"({spec['tokens_per_s']:.2f} vs {plain['tokens_per_s']:.2f} tok/s)")
    return out
