"""Block-quantised Linears on our own kernel (kernels/qgemm.c): AVX2, AVX-VNNI or AVX-512 VNNI on
x86; NEON with dotprod or i8mm on Arm (engine/cpu/arm.py: its variant choice and build).

Weights as 4-bit or 8-bit codes in super-blocks of 8 × 32 (GGUF Q4_K's shape: an 8-bit
sub-scale, and for 4-bit an 8-bit sub-minimum, per 32; float scales per 256), weight rows
interleaved in groups of 16 so that a vector's lanes are output columns (no horizontal sums;
activation rows read as broadcasts), activations quantised per row and per 256 to int8 inside
the call: each row's result depends only on that row (row-exact), and the weights are read once
per call whatever the number of rows (docs/every_cpu.md has v(k) per CPU class).

Why our own kernel: torch ships no bandwidth-bound int4 CPU kernel for AVX2 (its
`_weight_int4pack_mm_for_cpu` computes at ~4 GB/s of ~17 on a 2-core AVX2 EPYC; fbgemm has
int8 only). The C source is compiled per variant with the system's gcc into the cache
(`paths.cache_root()/kernels`) by scripts/setup.sh, linked to torch's own OpenMP runtime so both
share one thread pool; without gcc, AVX2 or F16C the format is simply unavailable
(lowbit.available()).
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

from ...paths import cache_root
from . import arm

QK = 32  # weights per block
SB = 8  # blocks per super-block
SRC = Path(__file__).with_name("kernels") / "qgemm.c"
HEADERS = (SRC.with_name("qgemm_neon.h"),)  # included by SRC (on Arm): part of its build identity
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
# The kernel's variants, best first: each one's extra compiler flags and the CPU flags it needs.
# The same source; kernels/qgemm.c picks its super-block dot by what the flags enable.
ISAS = {
    "avx512vnni": (("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
                   ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")),
    "avxvnni": (("-mavxvnni",), ("avx_vnni",)),
    "avx2": ((), ()),
}
_P, _I = ctypes.c_void_p, ctypes.c_int
GMAX = 16  # kernels/qgemm.c's GMAX: query heads sharing a kv head, at most, in attend_rows


def _cpu_ok() -> str | None:
    """Why this CPU cannot run the kernel, or None. Arm: engine/cpu/arm.py's answer. x86: ATen's
    capability says AVX2 (with FMA) or better; F16C comes with every AVX2 CPU but is read from
    /proc/cpuinfo where there is one."""
    if arm.is_arm():
        return arm.cpu_ok()
    if sys.platform != "linux" or torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return "needs an x86 CPU with AVX2 (Linux)"
    flags = _cpu_flags()
    if flags and "f16c" not in flags:
        return "needs F16C"
    return None


def _cpu_flags() -> set[str]:
    """The CPU's flags from /proc/cpuinfo (empty where there is none); on Arm its features."""
    if arm.is_arm():
        return arm.features()
    info = Path("/proc/cpuinfo")
    text = info.read_text(errors="ignore") if info.exists() else ""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def variants() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """This platform's variants, best first: their compiler flags and the CPU flags they need."""
    return arm.VARIANTS if arm.is_arm() else ISAS


def runnable() -> list[str]:
    """The variants this CPU can run, best first (from its flags; AVX2 wherever the kernel runs on
    x86, dotprod on Arm)."""
    flags = _cpu_flags()
    return [name for name, (_, need) in variants().items() if set(need) <= flags]


def isa() -> str:
    """The variant in use: SPECVIZ_KERNEL_ISA if set (one machine tests every variant it can run),
    AVX2 where ATEN_CPU_CAPABILITY=avx2 emulates an AVX2 machine, else the best this CPU runs.
    Chosen from flags, never from timings: every variant computes the same bits."""
    can = runnable()
    forced = os.environ.get("SPECVIZ_KERNEL_ISA", "").strip().lower()
    if forced:
        if forced not in variants():
            raise RuntimeError(f"SPECVIZ_KERNEL_ISA={forced}: not a kernel variant "
                               f"(one of {', '.join(variants())})")
        if forced not in can:
            raise RuntimeError(f"SPECVIZ_KERNEL_ISA={forced}: this CPU cannot run it "
                               f"(it runs {', '.join(can)})")
        return forced
    if not arm.is_arm() and os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() == "avx2":
        return "avx2"
    return can[0]


def _cc() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _flags(variant: str) -> tuple[str, ...]:
    if arm.is_arm():
        return arm.flags(variant, _cc() or "cc")
    return CFLAGS + ISAS[variant][0]


def source_key(variant: str | None = None) -> str:
    """The kernel's build identity (source, variant's flags, torch's runtime): a new kernel is
    built, and timings measured on the old one (the calibration cache) are measured again."""
    torch_lib = Path(torch.__file__).parent / "lib"
    flags = " ".join(_flags(variant or isa()))
    # the Arm header on Arm only: an edit there leaves x86 builds (and their calibrations) alone
    src = SRC.read_bytes() + b"".join(h.read_bytes() for h in HEADERS if arm.is_arm())
    return hashlib.sha1(src + flags.encode() + bytes(torch_lib)).hexdigest()[:16]


def command(cc: str, variant: str, out: Path) -> list[str]:
    """The compiler command that builds a variant into `out`."""
    if arm.is_arm():
        return arm.command(cc, variant, out, SRC)
    torch_lib = Path(torch.__file__).parent / "lib"
    # torch's bundled libgomp: one OpenMP runtime (and thread pool) in the process, not two
    gomp = ["-L", str(torch_lib), f"-Wl,-rpath,{torch_lib}"] if (torch_lib / "libgomp.so.1").exists() else []
    return [cc, *_flags(variant), "-o", str(out), str(SRC), *gomp, "-lgomp", "-lm"]


def _build(variant: str) -> Path:
    out = cache_root() / "kernels" / f"qgemm-{variant}-{source_key(variant)}.so"
    if out.exists():
        return out
    cc = _cc()
    if not cc:
        raise RuntimeError("no C compiler (gcc) to build the block-quantised kernel")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    res = subprocess.run(command(cc, variant, tmp), capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"building the block-quantised kernel ({variant}) failed: "
                           f"{res.stderr.strip()[-300:]}")
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
    """The compiled kernel, this CPU's variant (built on first use if setup did not build it);
    RuntimeError says why it is unavailable."""
    why = _cpu_ok()
    if why:
        raise RuntimeError(f"block-quantised kernel {why}")
    return variant_library(isa())


def cache_clear() -> None:
    """Forget the loaded kernels (tests that change the CPU's answer or SPECVIZ_KERNEL_ISA)."""
    library.cache_clear()
    variant_library.cache_clear()


@functools.cache
def variant_library(variant: str) -> ctypes.CDLL:
    """One variant's kernel, loaded and its signatures declared."""
    lib = ctypes.CDLL(str(_build(variant)))
    lib.kernel_isa.restype = ctypes.c_char_p
    if hasattr(lib, "kernel_threads"):  # Arm builds: OpenMP, or one thread where cc had none
        lib.kernel_threads.restype = ctypes.c_char_p
    lib.struct_size.argtypes = [_I]
    for i, (name, mirror) in enumerate((("lin_t", Lin), ("layer_t", Layer))):
        if lib.struct_size(i) != ctypes.sizeof(mirror):
            raise RuntimeError(f"kernels/qgemm.c's {name} is {lib.struct_size(i)} bytes, "
                               f"its ctypes mirror {ctypes.sizeof(mirror)}: rebuild after changing both")
    lib.block_mm.argtypes = [_P, _I, _I, _P, _P, _P, _P, _P, _I, _I, _P, _I]
    lib.block_mm.restype = _I
    lib.rms_norm.argtypes = [_P, _P, ctypes.c_float, _I, _I, _P]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [_P, _I, _I, _P]
    lib.silu_mul.restype = None
    _L = ctypes.c_long
    lib.attend_rows.argtypes = [_P, _L, _L, _P, _L, _L, _P, _L, _L, _P, _P, _P, _I, _I, _I, _I,
                                ctypes.c_float, _P, _I]
    lib.attend_rows.restype = _I
    lib.layer_pre.argtypes = [ctypes.POINTER(Layer), _P, _I, _P, _P, _P, _I]
    lib.layer_post.argtypes = [ctypes.POINTER(Layer), _P, _I, _P, _P, _L, _L, _P, _L, _L, _P, _P, _P, _I]
    lib.layer_pre.restype = lib.layer_post.restype = _I
    lib.layers_forward.argtypes = [ctypes.POINTER(Layer), _I, _P, _I, _P, _P, _P, _P, _L, _L, _I, _P, _P, _P,
                                   _I]
    lib.layers_forward.restype = _I
    return lib


def describe(lib: ctypes.CDLL | None = None) -> str:
    """The kernel in use, for status lines: 'avx512vnni', 'neon-i8mm (OpenMP)', 'neon-dotprod (one
    thread)'."""
    lib = lib or library()
    threads = f" ({lib.kernel_threads().decode()})" if hasattr(lib, "kernel_threads") else ""
    return lib.kernel_isa().decode() + threads


def build_all() -> list[str]:
    """Build every variant this CPU runs into the cache (scripts/setup.sh: never in a visitor's
    first request). Lines to print, one per variant."""
    if _cpu_ok():
        return [f"block-quantised kernel not built: {_cpu_ok()}"]
    lines = []
    for v in runnable():
        try:
            lines.append(f"kernel {describe(variant_library(v))}: {_build(v).name}")
        except (RuntimeError, OSError) as e:
            lines.append(f"kernel {v} not built: {e}")
    return lines


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


GR = 16  # weight rows a group (kernels/qgemm.c's GR): one 64-byte chunk's 32-bit lanes are its rows


def _groups(v: torch.Tensor) -> torch.Tensor:
    """[N, ...] -> [N/16, 16, ...], zero rows appended to a whole group."""
    pad = -v.shape[0] % GR
    if pad:
        v = torch.cat([v, v.new_zeros(pad, *v.shape[1:])])
    return v.reshape(-1, GR, *v.shape[1:])


def _interleave(q: torch.Tensor, s: torch.Tensor, t: torch.Tensor | None, big: torch.Tensor,
                mn: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
    """Per-row codes q [N, nb, 32] (uint8 0..15 with t, int8 without), sub-scales s and sub-minimums t
    [N, nb], super-block scales big and mn [N, nsb] -> the kernel's layout (kernels/qgemm.c, "the
    GEMM"): rows in groups of 16, each group's bytes contiguous, a chunk's 16 rows side by side (4
    bytes each) so that a vector's lanes are output columns."""
    ng, nb = (q.shape[0] + GR - 1) // GR, q.shape[1]
    if t is not None:  # four 8-weight chunks a block; byte j of a row's 4: weight j | weight 4 + j << 4
        c = q.reshape(-1, nb, 4, 2, 4)
        codes = _groups(c[:, :, :, 0] | (c[:, :, :, 1] << 4))  # [ng, 16, nb, 4, 4]
    else:  # eight 4-weight chunks a block
        codes = _groups(q.view(torch.uint8).reshape(-1, nb, 8, 4))
    codes = codes.permute(0, 2, 3, 1, 4).reshape(ng, -1)
    sub = _groups(_super(s).reshape(s.shape[0], -1)).transpose(1, 2).reshape(ng, -1)  # [g][block][row]
    per_sb = lambda v: _groups(v).transpose(1, 2).reshape(ng, -1).float().contiguous()  # [g][S][row]  # noqa: E731
    out = {"codes": codes.contiguous(), "sub": sub.to(torch.uint8).contiguous(), "tmin": None,
           "wd": per_sb(big), "wm": None}
    if t is not None:  # [g][S][pair of blocks][row][2]
        tg = _groups(_super(t).reshape(t.shape[0], -1, 4, 2))  # [ng, 16, nsb, 4, 2]
        out["tmin"] = tg.permute(0, 2, 3, 1, 4).reshape(ng, -1).to(torch.int8).contiguous()
        out["wm"] = per_sb(mn)
    return out


def pack_q4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[N, K] float -> 4-bit codes in super-blocks (K/32 blocks, 8 to a super-block, as GGUF's
    Q4_K): w ≈ D·s_b·q + Mn·t_b, q in 0..15, s_b in 0..255, t_b in -127..127, D and Mn per
    super-block; laid out for the kernel by _interleave."""
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
    return _interleave(q, s, t, big, mn)


def pack_q8(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """[N, K] float -> int8 codes in super-blocks: w ≈ D·s_b·q, q in -127..127."""
    n, k = w.shape
    g = w.detach().float().reshape(n, k // QK, QK)
    s, big = _sub_scales(g.abs().amax(-1) / 127, 255)
    d_eff = (s * _per_block(big, k // QK))[..., None]
    q = (g / _nonzero(d_eff)).round().clamp(-127, 127).to(torch.int8)
    return _interleave(q, s, None, big, None)


CHUNK = 1 << 20  # weights packed this many at a time (whole groups of rows)


def pack_rows(pack, w: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """pack(w) a few rows at a time: the same bits (every packed value depends on its own row),
    and a chunk's fp32 temporaries stay in cache (4x faster on the MLP shapes: docs/why.md#qgemm-pack)."""
    rows = max(1, CHUNK // w.shape[1] // GR) * GR
    if w.shape[0] <= rows:
        return pack(w)
    parts = [pack(w[i:i + rows]) for i in range(0, w.shape[0], rows)]
    return {k: None if v is None else torch.cat([p[k] for p in parts]) for k, v in parts[0].items()}


def unpack(p: dict[str, torch.Tensor | None], n: int | None = None) -> torch.Tensor:
    """The float weights [n, K] packed codes stand for (tests; the kernel never dequantises).
    n: the rows packed (default: whole groups)."""
    ng, four = p["codes"].shape[0], p["tmin"] is not None
    nb = p["codes"].shape[1] // (256 if four else 512)
    rows = lambda v, *shape: v.reshape(ng, *shape).movedim(-2, 1).reshape(ng * GR, -1)  # noqa: E731
    sub = rows(p["sub"], -1, GR, 1)[:, :nb].float()
    d = (sub * _per_block(rows(p["wd"], -1, GR, 1), nb))[..., None]
    if not four:
        q = p["codes"].view(torch.int8).reshape(ng, nb, 8, GR, 4).permute(0, 3, 1, 2, 4)
        out = q.reshape(ng * GR, nb, QK).float() * d
    else:
        c = p["codes"].reshape(ng, nb, 4, GR, 4).permute(0, 3, 1, 2, 4)  # [ng, 16, nb, 4, 4]
        q = torch.stack([c & 15, c >> 4], 4).reshape(ng * GR, nb, QK).float()
        t = p["tmin"].reshape(ng, -1, 4, GR, 2).permute(0, 3, 1, 2, 4).reshape(ng * GR, -1)[:, :nb].float()
        out = q * d + (t * _per_block(rows(p["wm"], -1, GR, 1), nb))[..., None]
    return out.reshape(ng * GR, -1)[:n]


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
        return unpack(self.packed(), self.out_features)

    def _weights(self) -> tuple:
        """The packed tensors' addresses and bits for the kernel, read from the buffers on every
        call (models/loading.py moves a loaded model's tensors with `t.data = t.data.clone()`:
        addresses kept from an earlier call would read freed memory)."""
        b = self._buffers
        return _addresses(b["codes"], b["sub"], b["tmin"], b["wd"], b["wm"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.float().contiguous()
        if torch.compiler.is_compiling():
            # the draft's compiled step (calibration/draft_compile.py): an opaque custom op to dynamo
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
                             v.data_ptr(), v.stride(2), v.stride(1), e, None, None, n, hq, hkv, d, scale,
                             out.data_ptr(),
                             torch.get_num_threads()):
        raise MemoryError("no memory for the attention's scores")
    return out


def attends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attend() takes these tensors (else SDPA)."""
    return (q.device.type == "cpu" and q.dtype == k.dtype == v.dtype == torch.float32 and q.shape[0] == 1
            and q.shape[-1] % 8 == 0 and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
            and q.shape[1] % k.shape[1] == 0 and q.shape[1] // k.shape[1] <= GMAX
            and not torch.compiler.is_compiling())


def main(argv=None) -> int:
    """python -m specviz kernels: build every variant this CPU runs into the cache (scripts/setup.sh)."""
    print("\n".join(build_all()))
    if not _cpu_ok():
        print(f"(in use here: {isa()})")
    return 0
