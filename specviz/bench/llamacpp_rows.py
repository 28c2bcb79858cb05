"""Bench rows `llama.cpp plain` and `llama.cpp speculative γ=N`
(`--methods …,llamacpp,llamacpp-spec`, γ from `--llamacpp-gammas`).

They run interleaved with ours, per prompt and repeat, in the same rotated
order: one llama-server per setting (hosting/llamacpp.py), loaded
before the warm-up and idle (blocked, ~0 CPU) except during its own request,
with `--llamacpp-threads` threads (default: ours). Same GGUF files as the
default pair (joined once into the cache), same prompt token ids, greedy,
same max new tokens. Their greedy output is compared with our plain run like
HF's: a different kernel on Q4_K weights may differ (a note gives where).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.events import RunSummary
from ..hosting.llamacpp import LlamaCppError, Server, server_binary, server_command
from .runs import Variant, first_difference

FAMILIES = ("llamacpp", "llamacpp-spec")
UNMEASURED = ("alpha_hat", "c", "t_draft_step", "predicted", "best_gamma", "verify_cost")


def variants(families: list[str], gammas: list[int]) -> list[Variant]:
    out = []
    if "llamacpp" in families:
        out.append(Variant("llamacpp", "llamacpp", "llamacpp"))
    if "llamacpp-spec" in families:
        out += [Variant(f"llamacpp-spec:{g}", "llamacpp-spec", "llamacpp", g) for g in gammas]
    return out


# ------------------------------------------------------------- GGUF files


def _joined_gguf(ref: str) -> Path:
    """The default pair's GGUF for `ref` ("embedded:<name>"), joined once into <cache>/gguf/ and
    checked against its pinned sha256 (the conversion deletes its own joined copy)."""
    from ..models import embedded as emb
    name = emb.model_name(ref)
    info = emb.EMBEDDED[name]
    dest = emb.cache_root() / "gguf" / f"{name}.gguf"
    ok = dest.with_suffix(".gguf.sha256")
    if dest.is_file() and ok.is_file() and ok.read_text().strip() == info.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".gguf.tmp")
    digest = emb._join_parts(emb._part_files(name), tmp, lambda f: None)
    if digest != info.sha256:
        tmp.unlink(missing_ok=True)
        raise LlamaCppError(f"the joined GGUF of {name} failed its checksum: reinstall the model packages")
    tmp.replace(dest)
    ok.write_text(info.sha256)
    return dest


def gguf_files(spec, explicit: str | None) -> tuple[str, str | None]:
    """(target, draft) GGUF paths: --llamacpp-gguf TARGET[,DRAFT], else the default pair's own."""
    if explicit:
        parts = [p.strip() for p in explicit.split(",") if p.strip()]
        missing = [p for p in parts if not Path(p).is_file()]
        if not parts or missing:
            raise LlamaCppError(f"--llamacpp-gguf: no such file {missing or explicit!r}")
        return parts[0], (parts[1] if len(parts) > 1 else None)
    refs = (spec.target, spec.draft)
    if not all(r and r.startswith("embedded:") for r in refs):
        raise LlamaCppError("they need this pair as GGUF files: give --llamacpp-gguf TARGET.gguf,DRAFT.gguf")
    return str(_joined_gguf(refs[0])), str(_joined_gguf(refs[1]))


def _sha12(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:12]


# ------------------------------------------------------------------ rows


@dataclass
class LlamaCppRows:
    """The servers of the llama.cpp variants; `measure()` runs them like a pair (duck-typed)."""

    servers: dict[str, Server] = field(default_factory=dict)  # variant key -> server
    busy_cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds inside requests
    start_cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds when loaded and idle

    class target:  # noqa: N801 - what measure() reads of a pair: our clocks are wall time on the CPU
        device = "cpu"

    def run(self, variant: Variant, ids: list[int], max_new_tokens: int, run) -> dict:
        """One request; fills `run` like runs._run_engine does, returns the first-chunk info."""
        server = self.servers[variant.key]
        steps0 = server.counter("spec_decode_num_drafts_total") if variant.gamma else None
        cpu0 = server.cpu_s()
        c = server.complete(ids, max_new_tokens)
        cpu = server.cpu_s()
        steps1 = server.counter("spec_decode_num_drafts_total") if variant.gamma else None
        rounds = int(steps1 - steps0) if steps0 is not None and steps1 is not None else 0
        run.token_ids, run.n_tokens, run.elapsed, run.stop_reason = c.token_ids, len(c.token_ids), \
            c.elapsed, c.stop_reason
        side = "speculative" if variant.gamma else "baseline"
        run.summary = RunSummary(
            side=side, method=f"llama.cpp {'draft-simple' if variant.gamma else 'plain'}",
            token_ids=c.token_ids, text=c.text, n_tokens=len(c.token_ids), elapsed=c.elapsed,
            prefill=c.prompt_ms / 1e3, target_forwards=rounds + 1 if variant.gamma else len(c.token_ids),
            stop_reason=c.stop_reason, rounds=rounds, drafted=c.drafted, accepted=c.accepted,
            verify_time=c.predicted_ms / 1e3 if variant.gamma else 0.0, gamma=variant.gamma,
            device=f"llama.cpp@{server.url}", engine="llamacpp",
            unmeasured=list(UNMEASURED) if variant.gamma else [],
            extra={"prompt_n": c.n_prompt, "predicted_per_second": c.decode_tps})
        busy = cpu - cpu0 if cpu is not None and cpu0 is not None else None
        if busy is not None:
            self.busy_cpu[variant.key] = self.busy_cpu.get(variant.key, 0.0) + busy
        return {"first_t": c.prompt_ms / 1e3, "first_n": 1 if c.token_ids else 0,
                "cpu_s": busy, "peak_rss_mb": server.peak_mb()}

    def idle_cpu_lines(self) -> list[str]:
        """CPU the servers spent outside their own requests (should be ~0: they block when idle)."""
        out = []
        for key, server in self.servers.items():
            now = server.cpu_s()
            if now is None or key not in self.start_cpu:
                continue
            idle = now - self.start_cpu[key] - self.busy_cpu.get(key, 0.0)
            out.append(f"{key}: {idle:.2f} s")
        return ["llama.cpp servers' CPU time outside their own requests (taken from ours): "
                + ", ".join(out)] if out else []

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


def start(bench, args, log) -> LlamaCppRows | None:
    """Start one server per llama.cpp variant of `bench` and add the variants; None (and a one-line
    note) when llama.cpp is not built or the pair has no GGUF files."""
    import torch
    vs = variants(bench.settings.families, bench.settings.llamacpp_gammas)
    if not vs:
        return None
    try:
        binary = str(server_binary())
        target, draft = gguf_files(bench.pair.spec, args.llamacpp_gguf)
    except LlamaCppError as e:
        bench.note(f"llama.cpp rows skipped: {e}")
        return None
    threads = args.llamacpp_threads or torch.get_num_threads()
    rows = LlamaCppRows()
    try:
        for v in vs:
            if v.gamma and not draft:
                bench.note(f"{v.key} skipped: --llamacpp-gguf names no draft GGUF")
                continue
            server = Server(v.key, server_command(binary, target, 0, threads, draft if v.gamma else None,
                                                 v.gamma))
            log(f"  starting llama-server for {v.key} ...")
            server.start()
            rows.servers[v.key], rows.start_cpu[v.key] = server, server.cpu_s() or 0.0
            bench.variants.append(v)
    except LlamaCppError as e:
        rows.close()
        bench.note(f"llama.cpp rows skipped: {e}")
        return None
    info = next(iter(rows.servers.values())).info.get("system_info", "")
    bench.notes.append(f"llama.cpp rows: llama-server ({binary}), {threads} threads, greedy, on "
                       f"{Path(target).name} [{_sha12(target)}]"
                       + (f" + {Path(draft).name} [{_sha12(draft)}]" if draft else "")
                       + (f"; kernels: {info}" if info else "")
                       + "; interleaved with ours; speculative: draft-simple, p_min 0; "
                         "α from its timings, rounds from its /metrics")
    bench.meta["llamacpp_commands"] = {k: s.cmd for k, s in rows.servers.items()}
    return rows


def output_lines(runs) -> list[str]:
    """Where llama.cpp speculative's greedy output first differs from llama.cpp plain's (same prompt
    and repeat): llama.cpp's own losslessness, apart from ours."""
    plain = {(r.prompt_id, r.repeat): r.token_ids for r in runs if r.family == "llamacpp" and r.error is None}
    out = []
    for r in runs:
        base = plain.get((r.prompt_id, r.repeat))
        if r.family != "llamacpp-spec" or r.error is not None or base is None:
            continue
        pos = first_difference(base, r.token_ids)
        if pos is not None:
            out.append(f"{r.variant} on {r.prompt_id} (repeat {r.repeat + 1}) differs from llama.cpp plain "
                       f"at position {pos} (lengths {len(base)} vs {len(r.token_ids)})")
    return out


def vs_plain_lines(rows: list[dict]) -> list[str]:
    """llama.cpp speculative against llama.cpp plain, and our plain against llama.cpp plain."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        sel = [r for r in rows if r["task"] == task]
        lp = next((r for r in sel if r["family"] == "llamacpp" and r["tokens_per_s"]), None)
        ours = next((r for r in sel if r["family"] == "plain" and r["tokens_per_s"]), None)
        if not lp:
            continue
        if ours:
            out.append(f"{task}: SpecViz plain {ours['tokens_per_s'] / lp['tokens_per_s']:.2f}× "
                       f"llama.cpp plain ({ours['tokens_per_s']:.2f} vs {lp['tokens_per_s']:.2f} tok/s)")
        for r in sel:
            if r["family"] == "llamacpp-spec" and r["tokens_per_s"]:
                out.append(f"{task}: llama.cpp speculative γ={r['gamma']} "
                           f"{r['tokens_per_s'] / lp['tokens_per_s']:.2f}× llama.cpp plain "
                           f"({r['tokens_per_s']:.2f} vs {lp['tokens_per_s']:.2f} tok/s)")
    return out
