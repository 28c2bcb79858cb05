"""Bench rows `vllm` and `vllm speculative`: the same prompts on vLLM servers.

They run after our own rows, one server at a time, with our pair freed first:
on a 24 GB CPU machine our fp32 pair and two vLLM servers do not fit together.
So they are not interleaved with ours (the notes say so); the speedup column
is against our plain rows, and `vllm speculative` also gets its speedup
against `vllm` plain in best_lines.
"""
from __future__ import annotations

import contextlib
import os
import time

from ..engine.events import RoundEvent, TokenEvent
from ..request import make_request

FAMILIES = ("vllm", "vllm-spec")


def variants(s: dict, Variant) -> list:
    out = []
    if "vllm" in s["families"]:
        out.append(Variant("vllm", "vllm", "vllm"))
    if "vllm-spec" in s["families"]:
        out.append(Variant(f"vllm-spec:{s['gamma_other']}", "vllm-spec", "vllm", s["gamma_other"]))
    return out


def label(v) -> str | None:
    if v.family == "vllm":
        return "vLLM plain"
    if v.family == "vllm-spec":
        return f"vLLM speculative γ={v.gamma}"
    return None


def _measure(vpair, v, p, ids, max_new_tokens, run):
    mode = "speculative" if v.family == "vllm-spec" else "baseline"
    req = make_request(p.text, "draft", max(1, v.gamma), max_new_tokens, 0.0, seed=0, chat_template=p.chat_template)
    summary = None
    for ev in vpair.run_events(req, mode, ids):
        if isinstance(ev, TokenEvent) and run.first_t is None:
            run.first_t, run.first_n = ev.t, 1
        elif isinstance(ev, RoundEvent) and run.first_t is None and ev.n_new:
            run.first_t, run.first_n = ev.t_end, ev.n_new
        elif not isinstance(ev, (TokenEvent, RoundEvent)):
            summary = ev
    run.token_ids, run.n_tokens, run.elapsed = list(summary.token_ids), summary.n_tokens, summary.elapsed
    run.stop_reason, run.prefill, run.target_forwards = summary.stop_reason, summary.prefill, summary.target_forwards
    if mode == "speculative":
        run.rounds, run.drafted, run.accepted = summary.rounds, summary.drafted, summary.accepted
    with contextlib.suppress(OSError):
        run.load1 = round(os.getloadavg()[0], 2)
    run.tokens_per_s = run.n_tokens / run.elapsed if run.elapsed > 0 else None
    if run.first_t is not None and run.n_tokens > run.first_n and run.elapsed > run.first_t:
        run.decode_tokens_per_s = (run.n_tokens - run.first_n) / (run.elapsed - run.first_t)
    return run, summary


def run_rows(vpair, vs: list, encoded, s: dict, Run, add_stats, log, notes: list[str]) -> list:
    """All runs of the vLLM variants: per variant (one server up at a time) a
    warm-up, then every prompt × repeat."""
    runs, base = [], {}
    try:
        for v in vs:
            t0 = time.perf_counter()
            p, ids = encoded[0]
            try:
                _measure(vpair, v, p, ids, 8, Run(v.key, v.family, v.engine, v.gamma, p.task, p.id, -1, 0))
            except Exception as e:  # noqa: BLE001 - vLLM failing must not sink our rows
                notes.append(f"{v.key} skipped: {e}")
                log("note: " + notes[-1])
                continue
            log(f"  {v.key}: server up and warm in {time.perf_counter() - t0:.0f} s")
            for p, ids in encoded:
                for rep in range(s["repeats"]):
                    run, summary = _measure(vpair, v, p, ids, s["max_new_tokens"],
                                            Run(v.key, v.family, v.engine, v.gamma, p.task, p.id, rep, 0))
                    if v.family == "vllm":
                        base[(p.id, rep)] = summary
                    else:
                        add_stats(run, summary, base.get((p.id, rep)))
                        run.alpha_hat = run.c = run.predicted = None  # vLLM does not expose them
                    runs.append(run)
                    log(f"  {v.key} {p.id} repeat {rep + 1}: {run.tokens_per_s:.2f} tok/s")
    finally:
        vpair.close()
    if runs:
        notes.append("vLLM rows ran after ours, one server at a time (our pair freed first), not interleaved; "
                     "their acceptance comes from vLLM's /metrics, α̂ and c are not exposed")
    return runs


def vs_plain_lines(rows: list[dict]) -> list[str]:
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        plain = next((r for r in rows if r["task"] == task and r["family"] == "vllm"), None)
        spec = next((r for r in rows if r["task"] == task and r["family"] == "vllm-spec"), None)
        if plain and spec and plain["tokens_per_s"] and spec["tokens_per_s"]:
            out.append(f"{task}: vLLM speculative γ={spec['gamma']} {spec['tokens_per_s'] / plain['tokens_per_s']:.2f}× "
                       f"vLLM plain ({spec['tokens_per_s']:.2f} vs {plain['tokens_per_s']:.2f} tok/s)")
    return out
