"""GPUs: which device runs which side, and which pair shows the method.

Everything here is a pure function of a device list (GpuInfo), so the logic is
tested on CPU with fake lists; `gpus()` reads the real one through torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..models import PairSpec
from .spaces import ZEROGPU_NOTE, on_zerogpu

GB = 1e9


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int


def gpus() -> list[GpuInfo]:
    """The CUDA devices here with their free memory (empty without CUDA)."""
    import torch
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out.append(GpuInfo(i, torch.cuda.get_device_name(i), int(total), int(free)))
    return out


# ------------------------------------------------------------------ placement


@dataclass(frozen=True)
class Placement:
    baseline: str  # device of the baseline's target
    speculative: str  # device of the speculative side's target and draft
    default_mode: str  # "fair" or "parallel"
    note: str  # what the page says about the race

    @property
    def separate(self) -> bool:
        return self.baseline != self.speculative


def placement(devices: list[GpuInfo]) -> Placement:
    """Two or more GPUs: each side gets its own (the baseline's target on the one
    with the most free memory after the speculative side took its pick) and
    parallel is true parallelism. One GPU: both sides share it; fair stays the
    default and parallel runs on two CUDA streams of the same device."""
    if not devices:
        return Placement("cpu", "cpu", "fair",
                         "CPU: fair mode times each side alone; parallel mode shares the cores")
    by_free = sorted(devices, key=lambda g: (-g.free_bytes, g.index))
    if len(by_free) == 1:
        g = by_free[0]
        return Placement(f"cuda:{g.index}", f"cuda:{g.index}", "fair",
                         f"one GPU ({g.name}): fair mode times each side alone; parallel mode runs both "
                         "on two CUDA streams that share this device, so each slows the other")
    spec, base = by_free[0], by_free[1]  # the speculative side also holds the draft
    return Placement(f"cuda:{base.index}", f"cuda:{spec.index}", "parallel",
                     f"two GPUs: baseline on cuda:{base.index} ({base.name}), speculative target + draft on "
                     f"cuda:{spec.index} ({spec.name}); both run at once with no interference "
                     "(true parallelism)")


# ------------------------------------------------------------ pair by memory


@dataclass(frozen=True)
class Candidate:
    target: str
    target_params: float  # parameters, billions (config counts, embeddings included)
    draft: str = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    draft_params: float = 0.49

    def need_bytes(self, with_draft: bool = True, bytes_per_param: int = 2) -> float:
        """bf16 weights + 15% for KV cache/activations at batch 1 + 2 GB CUDA context."""
        params = self.target_params + (self.draft_params if with_draft else 0.0)
        return params * 1e9 * bytes_per_param * 1.15 + 2 * GB


# biggest first: the deeper the target relative to the 0.5B draft, the smaller c
# and the larger the speedup the method can show
CANDIDATES = (
    Candidate("Qwen/Qwen2.5-Coder-32B-Instruct", 32.8),
    Candidate("Qwen/Qwen2.5-Coder-14B-Instruct", 14.7),
    Candidate("Qwen/Qwen2.5-Coder-7B-Instruct", 7.62),
)


def _name(target: str) -> str:
    return "gpu-" + target.split("-Coder-")[1].split("-")[0].lower()  # gpu-32b, gpu-14b, gpu-7b


def gpu_pairs() -> dict[str, PairSpec]:
    return {_name(c.target): PairSpec(_name(c.target), c.target, c.draft,
                                      f"{c.target.split('/')[1]} + 0.5B draft (Hub, bf16, GPU)", False)
            for c in CANDIDATES}


def pick_pair(devices: list[GpuInfo]) -> tuple[PairSpec | None, str]:
    """(pair, why): the biggest Qwen2.5-Coder target that fits in bf16 next to the
    0.5B draft, or (None, why) to keep the default pair. With two GPUs the
    speculative side's GPU holds target + draft and the baseline's the target."""
    if not devices:
        return None, "no GPU: the default 1.5B + 0.5B pair"
    place = placement(devices)
    free = {f"cuda:{g.index}": g.free_bytes for g in devices}
    for c in CANDIDATES:
        if place.separate:
            fits = free[place.speculative] >= c.need_bytes() and \
                free[place.baseline] >= c.need_bytes(with_draft=False)
        else:
            fits = free[place.speculative] >= c.need_bytes()
        if fits:
            spec = gpu_pairs()[_name(c.target)]
            need = c.need_bytes() / GB
            return spec, (f"{spec.target.split('/')[1]} + 0.5B in bf16 needs ~{need:.0f} GB and "
                          f"{_free_text(devices)}: a target this much deeper than the draft makes drafting "
                          "cheap (small c), so the speedup shows")
    least = CANDIDATES[-1].need_bytes() / GB
    return None, (f"{_free_text(devices)}, less than the ~{least:.0f} GB a 7B + 0.5B "
                  "pair needs in bf16: the default 1.5B + 0.5B pair. On a GPU at batch 1 it is launch-bound "
                  "(28 vs 24 layers, c ≈ 0.85), so expect little speedup")


def _free_text(devices: list[GpuInfo]) -> str:
    return ", ".join(f"{g.name} has {g.free_bytes / GB:.0f} GB free" for g in devices)


# ------------------------------------------------------------------ loading


def host_loader(notes: dict[str, str] | None = None, devices=None, load=None):
    """A ModelManager loader (load_pair's signature) that places the sides by
    `placement()` and attaches the page's pair note. With two GPUs the target is
    loaded twice: pair (speculative: target + draft) and pair.baseline_pair."""
    notes = dict(notes or {})

    def loader(spec, device=None, progress=None, **kw):
        from ..models import load_pair
        load_fn = load or load_pair
        devs = (gpus() if devices is None else devices) if device in (None, "", "auto", "cuda") else []
        place = placement(devs)
        if place.separate:
            pair = load_fn(spec, device=place.speculative, progress=progress, **kw)
            pair.baseline_pair = load_fn(spec, device=place.baseline, progress=progress, load_draft=False,
                                         **kw)
        else:
            pair = load_fn(spec, device=device, progress=progress, **kw)
        # the loader's own note too (a 16-bit overflow's fallback: models/overflow.py), and ZeroGPU's
        zero = ZEROGPU_NOTE if on_zerogpu() else ""
        pair.note = " ".join(n for n in (notes.get(spec.name, ""), place.note if devs else "", zero,
                                         getattr(pair, "note", "")) if n)
        return pair
    return loader


def host_default(device: str | None, devices=None) -> tuple[PairSpec | None, str]:
    """(pair, why) for a host that named no pair: on a GPU host, the biggest that fits."""
    if device not in (None, "", "auto", "cuda"):
        return None, ""
    devs = gpus() if devices is None else devices
    return pick_pair(devs) if devs else (None, "")
