"""Which model pairs exist, how a pair name or a custom target/draft resolves,
and which device and dtype a pair runs in."""
from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass
from functools import lru_cache

import torch

from .. import machine
from ..errors import ModelError
from . import embedded
from .embedded import DEFAULT_DRAFT, DEFAULT_TARGET, EMBEDDED_PREFIX


@dataclass(frozen=True)
class PairSpec:
    name: str  # registry key or "custom"
    target: str  # hub id, local dir, or "embedded:<name>"
    draft: str
    label: str  # human label for the UI dropdown
    offline: bool  # True for the embedded default pair


PAIRS: dict[str, PairSpec] = {
    p.name: p
    for p in [
        PairSpec("default", DEFAULT_TARGET, DEFAULT_DRAFT,
                 "Qwen2.5-Coder-Instruct 1.5B + 0.5B draft (offline)", True),
        PairSpec("smollm2", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "SmolLM2 1.7B + 135M draft (Hub)", False),
        PairSpec("qwen2.5", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
                 "Qwen2.5-Instruct 1.5B + 0.5B draft (Hub)", False),
        PairSpec("llama3.2", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
                 "Llama-3.2-Instruct 3B + 1B draft (Hub, gated)", False),
    ]
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ---------------------------------------------------------------- pair choice


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", ".", "~", "\\")) or os.path.exists(os.path.expanduser(value))


def resolve_pair(pair: str | None = None, target: str | None = None, draft: str | None = None,
                 allow_local_paths: bool = True) -> PairSpec:
    """A registered pair by name, or a custom target/draft (local dirs or hub ids)."""
    pair = (pair or "").strip()
    target, draft = (target or "").strip(), (draft or "").strip()
    if not target and not draft:
        name = pair or "default"
        if name == "custom":
            raise ModelError("custom pair: give both a target and a draft model (hub id or local folder)")
        if name not in PAIRS:
            raise ModelError(f"unknown pair '{name}': choose one of {', '.join(PAIRS)} or custom")
        return PAIRS[name]
    if pair not in ("", "custom"):
        raise ModelError(f"give either a pair name ('{pair}') or a custom target/draft, not both")
    if not target or not draft:
        raise ModelError("custom pair: both a target and a draft model are needed (hub id or local folder)")
    for value in (target, draft):
        if value.startswith(EMBEDDED_PREFIX):
            if value[len(EMBEDDED_PREFIX):] not in embedded.EMBEDDED:
                raise ModelError(f"unknown embedded model '{value}': choose one of "
                                 + ", ".join(EMBEDDED_PREFIX + k for k in embedded.EMBEDDED))
        elif _looks_like_path(value):
            if not allow_local_paths:
                raise ModelError("Local paths are disabled on this server: "
                                 f"use a Hugging Face Hub id instead of '{value}'")
        elif not _HUB_ID.match(value):
            raise ModelError(f"'{value}' is neither a Hugging Face Hub id (org/name) "
                             "nor an existing local folder")
    offline = all(v.startswith(EMBEDDED_PREFIX) for v in (target, draft))
    return PairSpec("custom", target, draft, f"{target} + {draft}", offline)


@lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    """Cheap, cached network probe (a thread, so a slow DNS can't block past the timeout)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(("huggingface.co", 443), timeout=1.5).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(1.5)
    return bool(ok)


def available_pairs(network: bool | None = None) -> list[PairSpec]:
    """Pairs usable here: the default if its packages (or a valid cache) exist; Hub pairs if online."""
    if network is None:
        network = _hub_reachable()
    out = []
    for spec in PAIRS.values():
        if spec.offline:
            if all(embedded.usable(embedded.model_name(ref)) for ref in (spec.target, spec.draft)):
                out.append(spec)
        elif network:
            out.append(spec)
    return out


def pick_device_dtype(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """cuda -> its half type by compute capability (bf16 from 8.0, fp16 below: a T4 has no native
    bf16 though torch.cuda.is_bf16_supported() says True there, pytorch#148322); mps -> fp16; cpu -> fp32."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ModelError(f"unknown device '{device}': use cpu, cuda or mps") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError("device 'cuda' was asked for but no CUDA GPU is available here")
        return dev, torch.bfloat16 if machine.gpu_half(dev) == "bf16" else torch.float16
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ModelError("device 'mps' was asked for but Apple MPS is not available here")
        return dev, torch.float16
    if dev.type != "cpu":
        raise ModelError(f"unsupported device '{device}': use cpu, cuda or mps")
    return dev, torch.float32


