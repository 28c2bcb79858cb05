"""Block-quantised Linears on our AVX2 kernel (kernels/qgemm.c), the layout llama.cpp decodes with.

Weights as 4-bit or 8-bit codes in super-blocks of 8 × 32 (GGUF Q4_K's shape: an 8-bit
sub-scale, and for 4-bit an 8-bit sub-minimum, per 32; float scales per 256), activations
quantised per row and per 256 to int8 inside the call: each row's result depends only on that
row (row-exact), and the weights are read once per call whatever the number of rows (a 5-token
verify still costs ~2 steps on an AVX2 EPYC: the integer multiplies, not the bytes, bound it).

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
SB = 8  # blocks per super-block
SRC = Path(__file__).with_name("kernels") / "qgemm.c"
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
_P, _I = ctypes.c_void_p, ctypes.c_int
GMAX = 16  # kernels/qgemm.c's GMAX: query heads sharing a kv head, at most, in attend_rows


def _cpu_ok() -> str | None:
    """Why this CPU cannot run the kernel, or None. ATen's capability says AVX2 (with FMA) or
    better; F16C comes with every AVX2 CPU but is read from /proc/cpuinfo where there is one."""
    if sys.platform != "linux" or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "needs an x86 CPU with AVX2 (Linux)"
    info = Path("/proc/cpuinfo")
    if info.exists() and " f16c" not in info.read_text(errors="ignore"):
        return "needs F16C"
    return None


def source_key() -> str:
    """The kernel's build identity (source, flags, torch's runtime): a new kernel is built, and
    timings measured on the old one (the calibration cache) are measured again."""
    torch_lib = Path(torch.__file__).parent / "lib"
    return hashlib.sha1(SRC.read_bytes() + " ".join(CFLAGS).encode() + bytes(torch_lib)).hexdigest()[:16]


def _build() -> Path:
    torch_lib = Path(torch.__file__).parent / "lib"
    out = cache_root() / "kernels" / f"qgemm-{source_key()}.so"
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


class Lin(ctypes.Structure):
    """kernels/qgemm.c's lin_t: one BlockLinear's packed buffers."""
    _fields_ = [("codes", _P), ("sub", _P), ("tmin", _P), ("wd", _P), ("wm", _P), ("bias", _P),
                ("bits", _I), ("n", _I), ("k", _I)]


class Layer(ctypes.Structure):
    """kernels/qgemm.c's layer_t: a Llama-family decoder layer on the kernels."""
    _fields_ = [("ln1", _P), ("ln2", _P), ("eps1", ctypes.c_float), ("eps2", ctypes.c_float),
                ("scale", ctypes.c_float), ("qkv", Lin), ("o", Lin), ("gu", Lin), ("down", Lin),
                ("hq", _I), ("hkv", _I), ("d", _I), ("inter", _I)]


@functools.cache
def library() -> ctypes.CDLL:
    """The compiled kernel (built on first use); RuntimeError says why it is unavailable."""
    why = _cpu_ok()
    if why:
        raise RuntimeError(f"block-quantised kernel {why}")
    lib = ctypes.CDLL(str(_build()))
    lib.block_mm.argtypes = [_P, _I, _I, _P, _P, _P, _P, _P, _I, _I, _P, _I]
    lib.block_mm.restype = _I
    lib.rms_norm.argtypes = [_P, _P, ctypes.c_float, _I, _I, _P]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [_P, _I, _I, _P]
    lib.silu_mul.restype = None
    _L = ctypes.c_long
    lib.attend_rows.argtypes = [_P, _L, _L, _P, _L, _L, _P, _L, _L, _P, _I, _I, _I, _I, ctypes.c_float,
                                _P, _I]
    lib.attend_rows.restype = _I
    lib.layer_pre.argtypes = [ctypes.POINTER(Layer), _P, _I, _P, _P, _P, _I]
    lib.layer_post.argtypes = [ctypes.POINTER(Layer), _P, _I, _P, _P, _L, _L, _P, _L, _L, _P, _I]
    lib.layer_pre.restype = lib.layer_post.restype = _I
    lib.layers_forward.argtypes = [ctypes.POINTER(Layer), _I, _P, _I, _P, _P, _P, _P, _L, _L, _I, _I]
    lib.layers_forward.restype = _I
    return lib


# ------------------------------------------------------------ pure packers


def _nonzero(t: torch.Tensor) -> torch.Tensor:
    """t with zeros replaced by 1 (a divisor for all-zero blocks)."""
    return torch.where(t > 0, t, torch.ones_like(t))


def _per_block(v: torch.Tensor, nb: int) -> torch.Tensor:
    """A super-block value [N, nsb] repeated for each of its nb blocks [N, nb]."""
    return v.repeat_interleave(SB, 1)[:, :nb]


def _super(v: torch.Tensor) -> torch.Tensor:
    """[N, nb] -> [N, nsb, 8], zero-padded past the last block."""
    n, nb = v.shape
    pad = -nb % SB
    return torch.nn.functional.pad(v, (0, pad)).reshape(n, -1, SB)


def _sub_scales(d: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block scales d [N, nb] >= 0 -> (8-bit sub-scales [N, nb], super-block scale [N, nsb]) with
    D·s >= d (rounded up: a block's codes never need more than their range)."""
    big = _nonzero(_super(d).amax(-1) / levels)
    return torch.ceil(d / _per_block(big, d.shape[1])).clamp(0, levels), big


def _padded(v: torch.Tensor, dtype) -> torch.Tensor:
    """Per-block bytes [N, nb] -> [N, nsb*8], zero past the last block: the kernel loads a super-block's
    8 in one read. A short last super-block took a scalar path: the 0.5B draft's K = 896 rows
    (3.5 super-blocks) ran their step's kernels in 18.9 ms, padded 16.6 (2026-11-26, AVX2 EPYC)."""
    return _super(v).reshape(v.shape[0], -1).to(dtype).contiguous()


def pack_q4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[N, K] float -> 4-bit codes in super-blocks (K/32 blocks, 8 to a super-block, as GGUF's
    Q4_K): w ≈ D·s_b·q + Mn·t_b, q in 0..15, s_b in 0..255, t_b in -127..127, D and Mn per
    super-block. Blocks go in pairs, as GGUF's Q4_K: byte j of a pair's 32 holds weight j of
    its first block (low nibble) and of its second (high); an odd last block has no second."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // QK, QK)
    nb = k // QK
    lo, hi = g.amin(-1), g.amax(-1)
    mn = _nonzero(_super(lo).abs().amax(-1) / 127)
    t = torch.floor(lo / _per_block(mn, nb)).clamp(-127, 127)  # minimum <= lo
    m_eff = t * _per_block(mn, nb)
    s, big = _sub_scales((hi - m_eff) / 15, 255)
    d_eff = (s * _per_block(big, nb))[..., None]
    q = ((g - m_eff[..., None]) / _nonzero(d_eff)).round().clamp(0, 15).to(torch.uint8)
    q = torch.nn.functional.pad(q, (0, 0, 0, nb % 2)).reshape(n, -1, 2, QK)  # pairs of blocks
    codes = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n, -1)
    return {"codes": codes.contiguous(), "sub": _padded(s, torch.uint8), "tmin": _padded(t, torch.int8),
            "wd": big.contiguous(), "wm": mn.contiguous()}


def pack_q8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[N, K] float -> int8 codes in super-blocks: w ≈ D·s_b·q, q in -127..127."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // QK, QK)
    s, big = _sub_scales(g.abs().amax(-1) / 127, 255)
    d_eff = (s * _per_block(big, k // QK))[..., None]
    q = (g / _nonzero(d_eff)).round().clamp(-127, 127).to(torch.int8)
    return {"codes": q.view(torch.uint8).reshape(n, -1).contiguous(), "sub": _padded(s, torch.uint8),
            "tmin": None, "wd": big.contiguous(), "wm": None}


CHUNK = 1 << 20  # weights packed this many at a time (whole rows)


def pack_rows(pack, w: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """pack(w) a few rows at a time: the same bits (every packed value depends on its own row),
    and a chunk's fp32 temporaries stay in cache. The 1.5B's w4a8 twin, 1 thread, 2-core AVX2
    EPYC, 2026-11-26: 26.1 s packed whole; the 8960 x 1536 MLP shapes 0.24 -> 0.06 s a matrix."""
    rows = max(1, CHUNK // w.shape[1])
    if w.shape[0] <= rows:
        return pack(w)
    parts = [pack(w[i:i + rows]) for i in range(0, w.shape[0], rows)]
    return {k: None if v is None else torch.cat([p[k] for p in parts]) for k, v in parts[0].items()}


def unpack(p: dict[str, torch.Tensor | None], k: int | None = None) -> torch.Tensor:
    """The float weights [N, k] packed codes stand for (tests; the kernel never dequantises).
    k: the input width (default: what the codes hold; an odd block count needs it)."""
    n = p["codes"].shape[0]
    nb = (k or p["codes"].shape[1] * (2 if p["tmin"] is not None else 1)) // QK
    d = (p["sub"][:, :nb].float() * _per_block(p["wd"], nb))[..., None]
    if p["tmin"] is None:
        return (p["codes"].view(torch.int8).reshape(n, nb, QK).float() * d).reshape(n, -1)
    pairs = p["codes"].reshape(n, -1, 1, QK)
    q = torch.cat([pairs & 15, pairs >> 4], 2).reshape(n, -1, QK)[:, :nb].float()
    return (q * d + (p["tmin"][:, :nb].float() * _per_block(p["wm"], nb))[..., None]).reshape(n, -1)


def quantize_reference(x: torch.Tensor) -> torch.Tensor:
    """What the kernel makes of activation rows [M, K]: each row's super-blocks (up to 256 values)
    rounded to 255 levels of their own amax/127 (tests)."""
    m, k = x.shape
    out = torch.empty_like(x)
    for s0 in range(0, k, QK * SB):
        v = x[:, s0:s0 + QK * SB].float()
        d = v.abs().amax(1, keepdim=True) / 127
        out[:, s0:s0 + QK * SB] = (v / _nonzero(d)).round() * d
    return out


def fits(linear: nn.Linear) -> bool:
    return linear.in_features % QK == 0


# ------------------------------------------------------------------ module


class BlockLinear(nn.Module):
    """y = x Wᵀ + b with W as 4-bit (bits=4) or 8-bit codes in super-blocks, x quantised per row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, bits: int = 4):
        super().__init__()
        library()  # fail here, not in the first forward
        self.out_features, self.in_features = weight.shape
        self.bits = bits
        for name, t in pack_rows(pack_q4 if bits == 4 else pack_q8, weight).items():
            self.register_buffer(name, t)
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, q{self.bits}"

    def packed(self) -> dict[str, torch.Tensor | None]:
        return {k: getattr(self, k) for k in ("codes", "sub", "tmin", "wd", "wm")}

    def dequantized(self) -> torch.Tensor:
        return unpack(self.packed(), self.in_features)

    def _weights(self) -> tuple:
        """The packed tensors' addresses and bits for the kernel, read from the buffers on every
        call (models/loading.py moves a loaded model's tensors with `t.data = t.data.clone()`:
        addresses kept from an earlier call read freed memory, 2026-11-25)."""
        b = self._buffers
        return _addresses(b["codes"], b["sub"], b["tmin"], b["wd"], b["wm"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        if torch.compiler.is_compiling():
            # the draft's compiled step (engine/draft_compile.py): an opaque custom op to dynamo
            y = block_mm(x2, self.codes, self.sub, self.tmin, self.wd, self.wm, self.out_features)
        else:  # eager: straight to the kernel (the dispatcher would add a Python hop per Linear)
            y = _mm(x2, self._weights(), self.out_features)
        bias = self._buffers["bias"]
        if bias is not None:
            y = y + bias
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _addresses(codes, sub, tmin, wd, wm) -> tuple:
    """What the kernel takes of packed weights: their addresses and the code width."""
    return codes.data_ptr(), sub.data_ptr(), _ptr(tmin), wd.data_ptr(), _ptr(wm), 8 if tmin is None else 4


def _mm(x: torch.Tensor, weights: tuple, n: int) -> torch.Tensor:
    """x [M, K] contiguous float32 times packed weights (their addresses and bits): y [M, n]."""
    (m, k), y = x.shape, torch.empty(x.shape[0], n)
    if library().block_mm(x.data_ptr(), m, k, *weights, n, y.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"no memory for the kernel's scratch ({m} x {k} activations)")
    return y


def _block_mm(x: torch.Tensor, codes: torch.Tensor, sub: torch.Tensor, tmin: torch.Tensor | None,
              wd: torch.Tensor, wm: torch.Tensor | None, n: int) -> torch.Tensor:
    return _mm(x, _addresses(codes, sub, tmin, wd, wm), n)


@torch.library.custom_op("specviz::block_mm", mutates_args=())
def block_mm(x: torch.Tensor, codes: torch.Tensor, sub: torch.Tensor, tmin: torch.Tensor | None,
             wd: torch.Tensor, wm: torch.Tensor | None, n: int) -> torch.Tensor:
    """x [M, K] float32 times the packed weights (4-bit when tmin is given): y [M, n] float32."""
    return _block_mm(x.contiguous(), codes, sub, tmin, wd, wm, n)


@block_mm.register_fake
def _(x, codes, sub, tmin, wd, wm, n):
    return x.new_empty(x.shape[0], n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Llama family's RMSNorm of contiguous float32 rows x [..., K] with a float32 weight [K]."""
    y = torch.empty_like(x)
    k = x.shape[-1]
    library().rms_norm(x.data_ptr(), weight.data_ptr(), eps, x.numel() // k, k, y.data_ptr())
    return y


def silu_mul(gu: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(g) * u of contiguous float32 rows gu [..., 2·inter] = [g | u]: the family's MLP gate."""
    y = gu.new_empty(*gu.shape[:-1], inter)
    library().silu_mul(gu.data_ptr(), gu.numel() // (2 * inter), inter, y.data_ptr())
    return y


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: list[int], scale: float) -> torch.Tensor:
    """Row-wise attention on a CPU in float32: q (1, hq, n, d), k and v (1, hkv, L, d) with the
    last dimension contiguous; row r attends to the first ends[r] keys. Returns (1, n, hq, d), the
    layout transformers' attention functions return."""
    _, hq, n, d = q.shape
    hkv = k.shape[1]
    out = q.new_empty(1, n, hq, d)
    e = (ctypes.c_int * n)(*ends)
    if library().attend_rows(q.data_ptr(), q.stride(2), q.stride(1), k.data_ptr(), k.stride(2), k.stride(1),
                             v.data_ptr(), v.stride(2), v.stride(1), e, n, hq, hkv, d, scale, out.data_ptr(),
                             torch.get_num_threads()):
        raise MemoryError("no memory for the attention's scores")
    return out


def attends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attend() takes these tensors (else SDPA)."""
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32 and q.shape[0] == 1
            and q.shape[-1] % 8 == 0 and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
            and q.shape[1] % k.shape[1] == 0 and q.shape[1] // k.shape[1] <= GMAX
            and not torch.compiler.is_compiling())
