"""The kernel's Arm variants compute the x86 variants' bits, proved on an x86 machine: each Arm
variant (engine/cpu/arm.py's flags) is cross-compiled with tests/kernels/qgemm_harness.c and run
under qemu-aarch64; every block_mm output equals the harness's scalar reference bit for bit, and
every output (block_mm, RMSNorm, SiLU gate, row-wise attention, two whole layers) hashes the same
as the x86 variants' native run. Bits only: nothing here is timed."""
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
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
    res = subprocess.run([cc, *flags, "-I", str(qgemm.SRC.parent), "-o", str(out), str(HARNESS),
                          *([] if "-c" in flags else ["-lm"])], capture_output=True, text=True)
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


def _builds(tmp_path: Path) -> dict[str, tuple[list[str], Path]]:
    """What to build: each Arm variant; one without OpenMP (macOS's Apple clang: one thread), by
    clang where there is one, else by the cross gcc; and the x86 variant this CPU uses."""
    out = {v: ([CROSS, *_arm_flags(v)], tmp_path / v) for v in arm.VARIANTS}
    if shutil.which("clang"):  # compiled by clang, linked below by the cross gcc
        flags = ["--target=aarch64-linux-gnu", *_arm_flags("neon-i8mm", openmp=False)[:-1], "-c"]
        out["neon-i8mm, clang, one thread"] = (["clang", *flags], tmp_path / "clang.o")
    else:
        out["neon-i8mm, one thread"] = ([CROSS, *_arm_flags("neon-i8mm", openmp=False)], tmp_path / "one-thread")
    if platform.machine().lower() in ("x86_64", "amd64") and shutil.which("gcc") and not qgemm._cpu_ok():
        v = qgemm.isa()  # every x86 variant gives the same bits (tests/test_qgemm.py): one suffices here
        out[v] = (["gcc", *[f for f in qgemm._flags(v) if f not in ("-shared", "-fPIC")]], tmp_path / v)
    return out


def test_every_arm_variant_computes_the_x86_bits_under_qemu(tmp_path):
    _tools()
    builds = _builds(tmp_path)
    with ThreadPoolExecutor(2) as pool:  # each build is a few seconds of one core
        exes = dict(zip(builds, pool.map(lambda b: _compile(b[0][0], b[0][1:], b[1]), builds.values()),
                        strict=True))
    if "neon-i8mm, clang, one thread" in exes:
        exe = tmp_path / "clang"
        subprocess.run([CROSS, "-static", "-o", str(exe), str(exes["neon-i8mm, clang, one thread"]), "-lm"],
                       check=True, capture_output=True)
        exes["neon-i8mm, clang, one thread"] = exe
    outs = {name: _run([str(exe)] if builds[name][0][0] == "gcc" else [QEMU, "-cpu", "max", str(exe)])
            for name, exe in exes.items()}  # x86 natively, Arm under qemu
    # a dotprod core without i8mm (Neoverse N1, Graviton 2) runs the dotprod variant
    outs["neon-dotprod on neoverse-n1"] = _run([QEMU, "-cpu", "neoverse-n1", str(exes["neon-dotprod"])])
    gemm = [ln for ln in outs["neon-dotprod"] if ln.startswith("block_mm")]
    assert len(gemm) >= 70 and all(": ref ok " in ln for ln in gemm), [ln for ln in gemm if "ref ok" not in ln]
    first = next(iter(outs))
    for name, lines in outs.items():
        assert lines[0].startswith("kernel ") and lines[-1] == "all block_mm outputs equal the reference", name
        assert lines[1:] == outs[first][1:], f"{name} differs from {first}"
    assert {o[0].split()[1] for o in outs.values()} >= set(arm.VARIANTS)
    assert outs["neon-i8mm"][0] == "kernel neon-i8mm (OpenMP)"  # the status line qgemm.describe() reads
    assert [o[0] for name, o in outs.items() if "one thread" in name] == ["kernel neon-i8mm (one thread)"]
