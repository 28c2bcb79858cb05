"""The block-quantised kernel on Arm (AArch64): which variant this CPU runs, read from its own
flags, and the compiler command that builds it (engine/cpu/qgemm.py calls here on Arm only).

Two variants of the same C source (kernels/qgemm.c with kernels/qgemm_neon.h): `neon-dotprod`
(any ARMv8.2+ core with dotprod: vdotq_s32) and `neon-i8mm` (vmmlaq_s32 for two activation rows
at once: Apple M2 and later, Graviton 3 and later). Both compute the x86 variants' bits, proved
under qemu (tests/test_qgemm_arm.py); their speed is unmeasured until someone runs them on Arm.

The compiler is the system's: gcc on Linux, Apple clang on macOS, which has no -fopenmp. OpenMP is
probed once: gcc's -fopenmp, or clang's `-Xpreprocessor -fopenmp` against torch's own libomp
(one runtime in the process, as on x86); where neither builds, the kernel runs on one thread and
says so in its status line (qgemm.describe()).
"""
from __future__ import annotations

import functools
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

# best first: each variant's compiler flags and the CPU features (Linux /proc/cpuinfo names) it needs
VARIANTS = {
    "neon-i8mm": (("-march=armv8.2-a+dotprod+i8mm",), ("asimddp", "i8mm")),
    "neon-dotprod": (("-march=armv8.2-a+dotprod",), ("asimddp",)),
}
CFLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")
# macOS: sysctl's names for the features above
SYSCTL = {"asimddp": "hw.optional.arm.FEAT_DotProd", "i8mm": "hw.optional.arm.FEAT_I8MM"}


def is_arm() -> bool:
    return platform.machine().lower() in ("arm64", "aarch64")


def _cpuinfo() -> str:
    info = Path("/proc/cpuinfo")
    return info.read_text(errors="ignore") if info.exists() else ""


def _sysctl(name: str) -> str:
    """`sysctl -n name`'s answer ('' where there is none)."""
    try:
        res = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def features() -> set[str]:
    """The CPU's features, by their Linux names: /proc/cpuinfo's Features line on Linux, sysctl's
    hw.optional.arm.FEAT_* on macOS."""
    if sys.platform == "darwin":
        return {flag for flag, name in SYSCTL.items() if _sysctl(name) == "1"}
    line = next((ln for ln in _cpuinfo().splitlines() if ln.lower().startswith("features")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_ok() -> str | None:
    """Why this Arm machine cannot run the kernel, or None."""
    if sys.platform not in ("linux", "darwin"):
        return "needs Linux or macOS on Arm"
    if "asimddp" not in features():
        return "needs an Arm CPU with dotprod (ARMv8.2-A or later)"
    return None


def _torch_lib() -> Path:
    return Path(torch.__file__).parent / "lib"


PROBE = ("int main(void) {\n int s = 0;\n#pragma omp parallel reduction(+ : s)\n s += 1;\n"
         " return s > 0 ? 0 : 1;\n}\n")


def _openmp_candidates() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(compile flags, link flags) to try, in order: torch's OpenMP runtime where it ships one."""
    lib = _torch_lib()
    rpath = ("-L", str(lib), f"-Wl,-rpath,{lib}")
    if sys.platform == "darwin":  # Apple clang: the pragmas through the preprocessor, torch's libomp
        out = [(("-Xpreprocessor", "-fopenmp"), (*rpath, "-lomp"))] if (lib / "libomp.dylib").exists() else []
        return out + [(("-fopenmp",), ("-fopenmp",))]  # a compiler with its own (Homebrew gcc or llvm)
    gomp = rpath if (lib / "libgomp.so.1").exists() else ()
    return [(("-fopenmp",), (*gomp, "-lgomp"))]


@functools.cache
def openmp(cc: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The first OpenMP flags (compile, link) with which `cc` builds and links a parallel loop, or
    None: the kernel is then built without, and runs on one thread."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "omp.c"
        src.write_text(PROBE)
        for comp, link in _openmp_candidates():
            try:
                res = subprocess.run([cc, *comp, "-o", str(Path(tmp) / "omp"), str(src), *link],
                                     capture_output=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                continue
            if res.returncode == 0:
                return comp, link
    return None


def flags(variant: str, cc: str) -> tuple[str, ...]:
    """The compile flags of a variant (its build identity: qgemm.source_key)."""
    omp = openmp(cc)
    return CFLAGS + (omp[0] if omp else ()) + VARIANTS[variant][0]


def command(cc: str, variant: str, out: Path, src: Path) -> list[str]:
    """The compiler command that builds a variant into `out`."""
    omp = openmp(cc)
    return [cc, *flags(variant, cc), "-o", str(out), str(src), *(omp[1] if omp else ()), "-lm"]

