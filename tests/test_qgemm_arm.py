"""The kernel's Arm variants compute the x86 variants' bits, proved on an x86 machine: each Arm
variant (engine/cpu/arm.py's flags) is cross-compiled with tests/kernels/qgemm_harness.c and run
under qemu-aarch64; every block_mm output equals the harness's scalar reference bit for bit, and
every output (block_mm, RMSNorm, SiLU gate, row-wise attention) hashes the same as the x86
variants' native run. Bits only: nothing here is timed."""
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from specviz.engine.cpu import arm, qgemm

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "tests" / "kernels" / "qgemm_harness.c"
CROSS, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


def _tools() -> None:
    missing = [t for t in (CROSS, QEMU) if not shutil.which(t)]
    if missing:
        pytest.skip(f"Arm kernel bits not proved here: {' and '.join(missing)} missing "
                    "(Debian: gcc-aarch64-linux-gnu qemu-user; scripts/setup.sh dev installs them)")


def _compile(cc: str, flags, out: Path) -> Path:
    res = subprocess.run([cc, *flags, "-I", str(qgemm.SRC.parent), "-o", str(out), str(HARNESS), "-lm"],
                         capture_output=True, text=True)
    if res.returncode and cc == CROSS and "cannot find -l" in res.stderr:
        pytest.skip(f"Arm kernel bits not proved here: no static aarch64 libraries for {CROSS} "
                    f"(Debian: libc6-dev-arm64-cross): {res.stderr.strip()[-200:]}")
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def _run(cmd) -> list[str]:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-2000:])
    return res.stdout.splitlines()


def _arm_flags(variant: str, openmp: bool = True) -> list[str]:
    """The variant's build flags as engine/cpu/arm.py gives them, for a static program."""
    base = [f for f in arm.CFLAGS if f not in ("-shared", "-fPIC")]
    return [*base, *(["-fopenmp"] if openmp else []), *arm.VARIANTS[variant][0], "-static"]


def test_every_arm_variant_computes_the_x86_bits_under_qemu(tmp_path):
    _tools()
    outs = {}
    for variant in arm.VARIANTS:
        exe = _compile(CROSS, _arm_flags(variant), tmp_path / variant)
        outs[variant] = _run([QEMU, "-cpu", "max", str(exe)])
    # macOS's Apple clang without OpenMP: the same source on one thread
    exe = _compile(CROSS, _arm_flags("neon-i8mm", openmp=False), tmp_path / "one-thread")
    outs["neon-i8mm, one thread"] = _run([QEMU, "-cpu", "max", str(exe)])
    # a dotprod core without i8mm (Neoverse N1, Graviton 2) runs the dotprod variant
    outs["neon-dotprod on neoverse-n1"] = _run([QEMU, "-cpu", "neoverse-n1", str(tmp_path / "neon-dotprod")])
    gemm = [ln for ln in outs["neon-dotprod"] if ln.startswith("block_mm")]
    assert len(gemm) >= 70 and all(": ref ok " in ln for ln in gemm), [ln for ln in gemm if "ref ok" not in ln]
    if platform.machine().lower() in ("x86_64", "amd64") and shutil.which("gcc") and not qgemm._cpu_ok():
        for variant in qgemm.runnable():  # the x86 variants this CPU runs, natively
            flags = [f for f in qgemm.CFLAGS + qgemm.ISAS[variant][0] if f not in ("-shared", "-fPIC")]
            outs[variant] = _run([str(_compile("gcc", flags, tmp_path / variant))])
    for name, lines in outs.items():
        assert lines[0].startswith("kernel ") and lines[-1] == "all block_mm outputs equal the reference", name
        first = next(iter(outs))
        assert lines[1:] == outs[first][1:], f"{name} differs from {first}"
    assert {ln.split()[1] for ln in (o[0] for o in outs.values())} >= set(arm.VARIANTS)
