"""The kernel's loader, variant choice and build commands on platforms faked here (engine/cpu/arm.py,
engine/cpu/qgemm.py): Linux aarch64 with and without dotprod and i8mm, macOS arm64 (sysctl) with
and without OpenMP in its C compiler; and on x86 the same commands as before Arm existed. The
compiler and the loaded library are faked: these tests check what would run, tests/test_qgemm_arm.py
that what it builds computes the right bits."""
import ctypes
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specviz.engine.cpu import arm, qgemm, speed

SRC = str(qgemm.SRC)
LINUX_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
CPUINFO = {  # /proc/cpuinfo's Features line of three Linux Arm classes
    "graviton3": f"processor\t: 0\nFeatures\t: {LINUX_FEATURES} sha512 sve i8mm bf16 rng\nCPU part\t: 0xd40\n",
    "graviton2": f"processor\t: 0\nFeatures\t: {LINUX_FEATURES}\nCPU part\t: 0xd0c\n",
    "cortex-a72": "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n",
}
SYSCTL = {"m1": {"hw.optional.arm.FEAT_DotProd": "1", "hw.optional.arm.FEAT_I8MM": "0"},
          "m2": {"hw.optional.arm.FEAT_DotProd": "1", "hw.optional.arm.FEAT_I8MM": "1"}}


class FakeFn:
    def __init__(self, value=0):
        self.value = value

    def __call__(self, *args):
        return self.value(*args) if callable(self.value) else self.value


class FakeLib:
    """What ctypes.CDLL would load from a build: the variant's name, its threads, its structs."""

    def __init__(self, variant: str, threads: str | None):
        self.kernel_isa = FakeFn(variant.encode())
        if threads:
            self.kernel_threads = FakeFn(threads.encode())
        self.struct_size = FakeFn(lambda i: ctypes.sizeof(qgemm.Lin if i == 0 else qgemm.Layer))

    def __getattr__(self, name):
        if name.startswith("kernel_threads"):
            raise AttributeError(name)
        fn = FakeFn()
        setattr(self, name, fn)
        return fn


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """fake(system, machine, cpu, openmp): a faked machine; returns the compiler commands run."""
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECVIZ_KERNEL_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    torch_lib = tmp_path / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    monkeypatch.setattr(arm, "_torch_lib", lambda: torch_lib)
    ran: list[list[str]] = []
    state = {}

    def run(cmd, **kw):
        if str(cmd[-1]).endswith("omp.c") or any(str(c).endswith("omp.c") for c in cmd):  # the OpenMP probe
            ok = state["openmp"] is not None and state["openmp"] in " ".join(cmd)
            return subprocess.CompletedProcess(cmd, 0 if ok else 1, b"", b"")
        ran.append([str(c) for c in cmd])
        out = cmd[cmd.index("-o") + 1]
        open(out, "wb").close()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    def sysctl(name):
        return state.get("sysctl", {}).get(name, "")

    def make(system: str, machine: str, cpu: str = "", openmp: str | None = "-fopenmp", cc: str = "gcc",
             libomp: bool = False):
        state.update(openmp=openmp, sysctl=SYSCTL.get(cpu, {}))
        monkeypatch.setattr(sys, "platform", system)
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(arm, "_cpuinfo", lambda: CPUINFO.get(cpu, ""))
        monkeypatch.setattr(arm, "_sysctl", sysctl)
        monkeypatch.setattr(subprocess, "run", run)
        monkeypatch.setenv("CC", cc)
        if libomp:
            (torch_lib / "libomp.dylib").touch()
        threads = "OpenMP" if openmp else "one thread"
        monkeypatch.setattr(ctypes, "CDLL", lambda path: FakeLib(path.split("qgemm-")[1].rsplit("-", 1)[0], threads))
        arm.openmp.cache_clear()
        qgemm.cache_clear()
        return ran

    yield make
    arm.openmp.cache_clear()
    qgemm.cache_clear()


def _shown(cmd: list[str]) -> list[str]:
    """A command with its temporary output file as OUT."""
    out = cmd.index("-o") + 1
    return cmd[:out] + ["OUT"] + cmd[out + 1:]


def test_linux_aarch64_with_i8mm_runs_and_builds_both_arm_variants(fake, capsys, tmp_path):
    ran = fake("linux", "aarch64", "graviton3")
    assert qgemm._cpu_ok() is None and qgemm.runnable() == ["neon-i8mm", "neon-dotprod"]
    assert qgemm.isa() == "neon-i8mm"
    assert qgemm.main() == 0
    lib = tmp_path / "torch" / "lib"
    # the exact commands `python -m specviz kernels` runs on this box (no libgomp in torch's lib: gcc's)
    assert [_shown(c) for c in ran] == [
        ["gcc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp", "-march=armv8.2-a+dotprod+i8mm",
         "-o", "OUT", SRC, "-lgomp", "-lm"],
        ["gcc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp", "-march=armv8.2-a+dotprod",
         "-o", "OUT", SRC, "-lgomp", "-lm"]]
    out = capsys.readouterr().out
    print(out, *(" ".join(_shown(c)) for c in ran), sep="\n")  # shown with pytest -s
    assert "kernel neon-i8mm (OpenMP): qgemm-neon-i8mm-" in out and "(in use here: neon-i8mm)" in out
    (lib / "libgomp.so.1").touch()  # torch's own runtime where its wheel ships one: one thread pool
    arm.openmp.cache_clear()
    assert arm.command("gcc", "neon-dotprod", "OUT", SRC)[-6:] == [
        SRC, "-L", str(lib), f"-Wl,-rpath,{lib}", "-lgomp", "-lm"]


def test_linux_aarch64_dotprod_only_runs_the_dotprod_variant(fake, monkeypatch):
    fake("linux", "aarch64", "graviton2")
    assert qgemm.runnable() == ["neon-dotprod"] and qgemm.isa() == "neon-dotprod"
    assert qgemm.describe() == "neon-dotprod (OpenMP)"
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "neon-i8mm")
    with pytest.raises(RuntimeError, match="cannot run it .*neon-dotprod"):
        qgemm.isa()
    monkeypatch.setenv("SPECVIZ_KERNEL_ISA", "avx2")  # an x86 variant is not one on Arm
    with pytest.raises(RuntimeError, match="not a kernel variant .*neon-i8mm, neon-dotprod"):
        qgemm.isa()


def test_linux_aarch64_without_dotprod_is_a_reason_not_a_build(fake):
    ran = fake("linux", "aarch64", "cortex-a72")
    assert qgemm._cpu_ok() == "needs an Arm CPU with dotprod (ARMv8.2-A or later)"
    with pytest.raises(RuntimeError, match="dotprod"):
        qgemm.library()
    assert qgemm.build_all() == ["block-quantised kernel not built: needs an Arm CPU with dotprod (ARMv8.2-A or later)"]
    assert ran == []


@pytest.mark.parametrize("cpu, variants", [("m1", ["neon-dotprod"]), ("m2", ["neon-i8mm", "neon-dotprod"])])
def test_macos_arm64_reads_its_features_from_sysctl(fake, cpu, variants):
    fake("darwin", "arm64", cpu, openmp="-Xpreprocessor", cc="cc", libomp=True)
    assert arm.features() >= {"asimddp"} and ("i8mm" in arm.features()) == (cpu == "m2")
    assert qgemm._cpu_ok() is None and qgemm.runnable() == variants and qgemm.isa() == variants[0]


def test_macos_with_openmp_builds_against_torchs_libomp(fake, tmp_path):
    ran = fake("darwin", "arm64", "m2", openmp="-Xpreprocessor", cc="cc", libomp=True)
    lib = tmp_path / "torch" / "lib"
    qgemm.main()
    assert _shown(ran[0]) == ["cc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-Xpreprocessor", "-fopenmp",
                              "-march=armv8.2-a+dotprod+i8mm", "-o", "OUT", SRC,
                              "-L", str(lib), f"-Wl,-rpath,{lib}", "-lomp", "-lm"]
    assert qgemm.describe() == "neon-i8mm (OpenMP)"


def test_macos_without_openmp_builds_one_thread_and_says_so(fake, capsys):
    ran = fake("darwin", "arm64", "m2", openmp=None, cc="cc")  # Apple clang, no libomp anywhere
    assert arm.openmp("cc") is None
    qgemm.main()
    assert [_shown(c) for c in ran] == [
        ["cc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-march=armv8.2-a+dotprod+i8mm", "-o", "OUT", SRC, "-lm"],
        ["cc", "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-march=armv8.2-a+dotprod", "-o", "OUT", SRC, "-lm"]]
    assert "kernel neon-i8mm (one thread): qgemm-neon-i8mm-" in capsys.readouterr().out
    assert qgemm.describe() == "neon-i8mm (one thread)"
    # the flags are the build's identity (its cache name): an OpenMP build is never taken for this one
    assert "-fopenmp" not in qgemm._flags("neon-i8mm")


def test_x86_builds_exactly_the_commands_it_built_before(fake, monkeypatch):
    """The x86 commands as before the Arm variants (gcc, AVX2 base flags, torch's libgomp)."""
    ran = fake("linux", "x86_64")
    monkeypatch.setattr(qgemm, "_cpu_ok", lambda: None)
    monkeypatch.setattr(qgemm, "_cpu_flags", lambda: {"avx2", "f16c", "avx_vnni", "avx512f", "avx512bw",
                                                      "avx512vl", "avx512_vnni"})
    qgemm.main()
    lib = Path(torch.__file__).parent / "lib"
    gomp = ["-L", str(lib), f"-Wl,-rpath,{lib}"] if (lib / "libgomp.so.1").exists() else []
    base = ["gcc", "-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
    tail = ["-o", "OUT", SRC, *gomp, "-lgomp", "-lm"]
    assert [_shown(c) for c in ran] == [base + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"] + tail,
                                        base + ["-mavxvnni"] + tail, base + tail]


def test_the_precision_line_names_the_kernel_variant(fake, monkeypatch):
    from specviz.ui import glossary
    fake("linux", "aarch64", "graviton3")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    assert speed.kernel_note(model, None) == ""  # no Linear on our kernel: nothing to name
    monkeypatch.setattr(qgemm, "BlockLinear", torch.nn.Linear)  # a faked build: any Linear stands in
    note = "target int4 g32 weights, 8-bit per-block activations (9 ms/step vs 20 ms fp32 on this CPU)"
    note += speed.kernel_note(model, None)
    assert note.endswith("; kernel neon-i8mm (OpenMP)")
    html = glossary.pair_html({"device": "cpu", "label": "pair", "precision": "int4 g32 weights", "precision_note": note})
    assert "kernel neon-i8mm (OpenMP)" in html
