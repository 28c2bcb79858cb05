"""Block-quantised Linears on our AVX2 kernel (kernels/qgemm.c), the layout llama.cpp decodes with.

Weights in ggml's Q4_1 blocks (32 weights share an fp16 scale and minimum) or Q8_0 blocks (an
fp16 scale), activations quantised per row and per 32-block to int8 inside the call: each row's
result depends only on that row (row-exact), and the weights are read once per call whatever
the number of rows (a verify forward costs about a step).

Why our own kernel: torch ships no bandwidth-bound int4 CPU kernel for AVX2 (its
`_weight_int4pack_mm_for_cpu` computes at ~4 GB/s of ~17 on a 2-core AVX2 EPYC; fbgemm has
int8 only). The C source is compiled once per machine with the system's gcc into the cache
(`paths.cache_root()/kernels`), linked to torch's own OpenMP runtime so both share one thread
pool; without gcc, AVX2 or F16C the format is simply unavailable (lowbit.available()).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from ..paths import cache_root

QK = 32  # weights per block
SRC = Path(__file__).with_name("kernels") / "qgemm.c"
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
_P, _I = ctypes.c_void_p, ctypes.c_int


def _cpu_ok() -> str | None:
    """Why this CPU cannot run the kernel, or None. ATen's capability says AVX2 (with FMA) or
    better; F16C comes with every AVX2 CPU but is read from /proc/cpuinfo where there is one."""
    if sys.platform != "linux" or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "needs an x86 CPU with AVX2 (Linux)"
    info = Path("/proc/cpuinfo")
    if info.exists() and " f16c" not in info.read_text(errors="ignore"):
        return "needs F16C"
    return None


def _build() -> Path:
    torch_lib = Path(torch.__file__).parent / "lib"
    key = hashlib.sha1(SRC.read_bytes() + " ".join(CFLAGS).encode() + bytes(torch_lib)).hexdigest()[:16]
    out = cache_root() / "kernels" / f"qgemm-{key}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc) to build the block-quantised kernel")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    # torch's bundled libgomp: one OpenMP runtime (and thread pool) in the process, not two
    gomp = ["-L", str(torch_lib), f"-Wl,-rpath,{torch_lib}"] if (torch_lib / "libgomp.so.1").exists() else []
    res = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SRC), *gomp, "-lgomp", "-lm"],
                         capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"building the block-quantised kernel failed: {res.stderr.strip()[-300:]}")
    tmp.replace(out)
    return out


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernel (built on first use); RuntimeError says why it is unavailable."""
    why = _cpu_ok()
    if why:
        raise RuntimeError(f"block-quantised kernel {why}")
    lib = ctypes.CDLL(str(_build()))
    lib.quantize_rows.argtypes = [_P, _I, _I, _P, _P, _P, _I]
    lib.gemm_q4_1.argtypes = [_P, _I, _I, _P, _P, _P, _I, _P, _I]
    lib.gemm_q8_0.argtypes = [_P, _I, _I, _P, _P, _I, _P, _I]
    for f in (lib.quantize_rows, lib.gemm_q4_1, lib.gemm_q8_0):
        f.restype = None
    return lib


# ------------------------------------------------------------ pure packers


def _groups(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    return w.detach().float().reshape(n, k // QK, QK)


def pack_q4_1(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K/32, 20] uint8 blocks: fp16 scale d, fp16 minimum m, 16 bytes of
    nibbles (byte j: weight j low, weight j+16 high); w ≈ d·q + m, q in 0..15."""
    g = _groups(w)
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15
    q = ((g - lo[..., None]) / torch.where(d > 0, d, torch.ones_like(d))[..., None]).round().clamp(0, 15)
    q = q.to(torch.uint8)
    head = torch.stack([d, lo], -1).half().view(torch.uint8)
    return torch.cat([head, q[..., :QK // 2] | (q[..., QK // 2:] << 4)], -1).contiguous()


def pack_q8_0(w: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> [N, K/32, 34] uint8 blocks: fp16 scale d, 32 int8; w ≈ d·q."""
    g = _groups(w)
    d = g.abs().amax(-1) / 127
    q = (g / torch.where(d > 0, d, torch.ones_like(d))[..., None]).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([d.half().view(torch.uint8).reshape(*d.shape, 2),
                      q.view(torch.uint8)], -1).contiguous()


def unpack(blocks: torch.Tensor, bits: int) -> torch.Tensor:
    """The float weights the blocks stand for (tests; the kernel never dequantises)."""
    n, nb, _ = blocks.shape
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()
    if bits == 8:
        return (blocks[..., 2:].contiguous().view(torch.int8).float() * d).reshape(n, nb * QK)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float()
    nib = blocks[..., 4:]
    q = torch.cat([nib & 15, nib >> 4], -1).float()
    return (q * d + m).reshape(n, nb * QK)


def fits(linear: nn.Linear) -> bool:
    return linear.in_features % QK == 0


# ------------------------------------------------------------------ module


class BlockLinear(nn.Module):
    """y = x Wᵀ + b with W in Q4_1 (bits=4) or Q8_0 (bits=8) blocks, x quantised per row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int = 4):
        super().__init__()
        library()  # fail here, not in the first forward
        self.out_features, self.in_features = weight.shape
        self.bits = bits
        self.register_buffer("blocks", pack_q4_1(weight) if bits == 4 else pack_q8_0(weight))
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, q{self.bits}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lib, k, n = library(), self.in_features, self.out_features
        x2 = x.reshape(-1, k).float().contiguous()
        m, nt = x2.shape[0], torch.get_num_threads()
        xq = torch.empty(m, k, dtype=torch.int8)
        xd, xs = torch.empty(2, m, k // QK).unbind(0)
        y = torch.empty(m, n)
        lib.quantize_rows(x2.data_ptr(), m, k, xq.data_ptr(), xd.data_ptr(), xs.data_ptr(), nt)
        if self.bits == 4:
            lib.gemm_q4_1(self.blocks.data_ptr(), n, k, xq.data_ptr(), xd.data_ptr(), xs.data_ptr(), m,
                          y.data_ptr(), nt)
        else:
            lib.gemm_q8_0(self.blocks.data_ptr(), n, k, xq.data_ptr(), xd.data_ptr(), m, y.data_ptr(), nt)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], n).to(x.dtype)
