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
    lib.gemm_blocks.argtypes = [_P, _P, _P, _I, _I, _I, _P, _P, _P, _I, _P, _I]
    for f in (lib.quantize_rows, lib.gemm_blocks):
        f.restype = None
    return lib


# ------------------------------------------------------------ pure packers


def _groups(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    return w.detach().float().reshape(n, k // QK, QK)


def _safe(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d > 0, d, torch.ones_like(d))[..., None]


def pack_q4_1(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float -> (codes uint8 [N, K/2], scales fp16 [N, K/32], minimums fp16 [N, K/32]):
    w ≈ d·q + m, q in 0..15; a block's byte j holds weight j (low nibble) and j+16 (high)."""
    g = _groups(w)
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15
    q = ((g - lo[..., None]) / _safe(d)).round().clamp(0, 15).to(torch.uint8)
    codes = q[..., :QK // 2] | (q[..., QK // 2:] << 4)
    return codes.reshape(w.shape[0], -1).contiguous(), d.half(), lo.half()


def pack_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    """[N, K] float -> (codes int8 [N, K] as uint8, scales fp16 [N, K/32], None): w ≈ d·q."""
    g = _groups(w)
    d = g.abs().amax(-1) / 127
    q = (g / _safe(d)).round().clamp(-127, 127).to(torch.int8)
    return q.view(torch.uint8).reshape(w.shape[0], -1).contiguous(), d.half(), None


def unpack(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """The float weights packed blocks stand for (tests; the kernel never dequantises)."""
    n, nb = d.shape
    if m is None:
        return (codes.view(torch.int8).reshape(n, nb, QK).float() * d.float()[..., None]).reshape(n, -1)
    nib = codes.reshape(n, nb, QK // 2)
    q = torch.cat([nib & 15, nib >> 4], -1).float()
    return (q * d.float()[..., None] + m.float()[..., None]).reshape(n, -1)


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
        codes, d, m = (pack_q4_1 if bits == 4 else pack_q8_0)(weight)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", d)
        self.register_buffer("mins", m)
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, q{self.bits}"

    def dequantized(self) -> torch.Tensor:
        return unpack(self.codes, self.scales, self.mins)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        # under torch.compile (the draft's step, engine/draft_compile.py) the call is an opaque
        # custom op; eager calls it directly (the dispatcher would add a Python hop per Linear)
        mm = block_mm if torch.compiler.is_compiling() else _block_mm
        y = mm(x2, self.codes, self.scales, self.mins, self.bits, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _block_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
              bits: int, n: int) -> torch.Tensor:
    lib, (m, k), nt = library(), x.shape, torch.get_num_threads()
    xq = torch.empty(m, k, dtype=torch.int8)
    xd, xs = torch.empty(2, m, k // QK).unbind(0)
    y = torch.empty(m, n)
    lib.quantize_rows(x.data_ptr(), m, k, xq.data_ptr(), xd.data_ptr(), xs.data_ptr(), nt)
    lib.gemm_blocks(codes.data_ptr(), scales.data_ptr(), None if mins is None else mins.data_ptr(), bits,
                    n, k, xq.data_ptr(), xd.data_ptr(), xs.data_ptr(), m, y.data_ptr(), nt)
    return y


@torch.library.custom_op("specviz::block_mm", mutates_args=())
def block_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
             bits: int, n: int) -> torch.Tensor:
    """x [M, K] float32 (contiguous) times the packed weights: y [M, n] float32."""
    return _block_mm(x.contiguous(), codes, scales, mins, bits, n)


@block_mm.register_fake
def _(x, codes, scales, mins, bits, n):
    return x.new_empty(x.shape[0], n)
