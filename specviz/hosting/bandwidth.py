"""The memory-bandwidth limit of one decoding step: at batch 1 every step reads
all weights once, so step time >= weight bytes / memory bandwidth."""
from __future__ import annotations

# TB/s, from the vendors' data sheets; matched on the CUDA device name, most specific first
BANDWIDTH_TBS = (
    ("GH200", 4.0),  # before H200: the name contains it
    ("H200", 4.8),
    ("H100 NVL", 3.9),
    ("H100 PCIe", 2.0),
    ("H100", 3.35),  # SXM
    ("B200", 8.0),
    ("A100-SXM4-80GB", 2.039),
    ("A100 80GB PCIe", 1.935),
    ("A100-PCIE-40GB", 1.555),
    ("A100", 1.555),
    ("L40S", 0.864),
    ("L40", 0.864),
    ("A10G", 0.6),
    ("A10", 0.6),
    ("L4", 0.3),
    ("T4", 0.32),
    ("V100", 0.9),
    ("RTX 4090", 1.008),
    ("RTX 3090", 0.936),
)


def bandwidth_tbs(device_name: str | None) -> float | None:
    """TB/s of a GPU by its name, None for unknown."""
    name = (device_name or "").upper()
    for key, tbs in BANDWIDTH_TBS:
        if key.upper() in name:
            return tbs
    return None


def weight_bytes(model) -> int:
    """Bytes read per step: every parameter and buffer once (a tied matrix counts once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def bound_s(nbytes: int, device_name: str | None) -> float | None:
    tbs = bandwidth_tbs(device_name)
    return nbytes / (tbs * 1e12) if tbs else None


def bound_line(label: str, nbytes: int, step_s: float | None, device_name: str | None) -> str:
    """'target: 3.1 GB, step 9.8 ms, bandwidth limit 0.9 ms (H100 3.35 TB/s): 11% of peak'."""
    lim = bound_s(nbytes, device_name)
    step = f"{step_s * 1e3:.2f} ms" if step_s else "n/a"
    if lim is None:
        return f"{label}: {nbytes / 1e9:.2f} GB of weights, step {step}, bandwidth limit unknown " \
               f"({device_name or 'no GPU name'} is not in the table)"
    frac = f": {lim / step_s:.0%} of the bandwidth limit" if step_s else ""
    return (f"{label}: {nbytes / 1e9:.2f} GB of weights, step {step}, limit {lim * 1e3:.2f} ms "
            f"({device_name}, {bandwidth_tbs(device_name):g} TB/s){frac}")


def bench_lines(device, nbytes: dict[str, int], runs) -> list[str]:
    """`python -m specviz bench --device cuda`: measured step times of the target
    (plain runs) and draft (draft-model runs) against their bandwidth limits."""
    import statistics
    if not str(device).startswith("cuda"):
        return []
    import torch
    name = torch.cuda.get_device_name(torch.device(device))
    plain = [(r.elapsed - r.value("prefill")) / (r.n_tokens - 1) for r in runs
             if r.family == "plain" and r.error is None and r.value("prefill") is not None and r.n_tokens > 1]
    drafts = [r.value("t_draft_step") for r in runs if r.family == "draft" and r.value("t_draft_step")]
    steps = {"target": statistics.median(plain) if plain else None,
             "draft": statistics.median(drafts) if drafts else None}
    return ["bandwidth limit (batch 1 reads every weight once per step): "
            + bound_line(k, nbytes[k], steps[k], name) for k in nbytes]


def measure_cpu_read_gbs(gib: float = 3.0, dtype=None, repeats: int = 5) -> dict:
    """Measured, not looked up: a CPU has no data sheet we can match. Times a chain of bf16
    matrix-vector products over `gib` GiB of weights (what a batch-1 step does), and a plain
    sum over the same bytes; median of `repeats` after one warm-up."""
    import statistics
    import time

    import torch
    dtype = dtype or torch.bfloat16
    rows = 8960  # the 1.5B target's MLP width: the same GEMV shape its steps run
    n_mats = max(1, int(gib * 2**30 / (rows * 1536 * torch.finfo(dtype).bits // 8)))
    mats = [torch.randn(rows, 1536).to(dtype) for _ in range(n_mats)]
    x = torch.randn(1, 1536).to(dtype)
    nbytes = sum(m.numel() * m.element_size() for m in mats)

    def gemv():
        for m in mats:
            torch.nn.functional.linear(x, m)

    def read():
        for m in mats:
            m.sum()

    out = {"bytes": nbytes, "threads": torch.get_num_threads()}
    for name, fn in (("gemv", gemv), ("sum", read)):
        fn()
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[f"{name}_s"] = statistics.median(ts)
        out[f"{name}_gbs"] = nbytes / out[f"{name}_s"] / 1e9
    return out


def main(argv=None) -> int:
    """python -m specviz bandwidth [SECONDS]: this machine's plain-sum read bandwidth, as JSON."""
    import json
    argv = list(argv or [])
    print(json.dumps(measure_cpu_read_gbs(float(argv[0]) if argv else 3.0), indent=1))
    return 0
