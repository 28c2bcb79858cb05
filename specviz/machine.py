"""What machine this is: CPU model and flags, cores, GPU name, load. One home
for /proc/cpuinfo reading; calibration caches are keyed by machine_key(). And what a
forked process of ours must get fresh (Lock, after_fork)."""
from __future__ import annotations

import contextvars
import functools
import hashlib
import os
import platform
import threading
import time
import weakref
from pathlib import Path

# called at each pause point when set: a background job's (the page's calibration, ui/loader.py) wait while
# a run goes, or its stop at its budget. Here, at the floor, so that the CPU conversions (engine/cpu: a
# second copy of the pair packs Linear by Linear) pause too, not only timed forwards: a fresh start's
# first run read its prompt 2.1x slower than the next (0.17 s against 0.08 s, 2-core Zen 4,
# 2026-11-29) while the calibration packed for up to 23 s between two pause points.
PAUSE: contextvars.ContextVar = contextvars.ContextVar("background_pause", default=None)
BUSY_SHARE = 0.5  # others use at least half of all cores: timings are unreliable
MIN_INTERVAL = 2.0  # seconds between two readings of /proc (CpuMeter's default)


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key and key not in info:  # first processor block is enough
                info[key] = value.strip()
    except OSError:
        pass
    return info


def pause_point() -> None:
    """PAUSE, when set on this thread's context: may wait for a run to end, or raise at a budget."""
    check = PAUSE.get()
    if check is not None:
        check()


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    return frozenset(_cpuinfo().get("flags", "").split())


def native_bf16() -> bool:
    """bf16 matmuls run in hardware (AVX512-BF16 or AMX); without them torch
    emulates bf16 on CPU and it is slower than fp32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def gpu_name() -> str | None:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a description is still useful without it
        pass
    return None


def half_for_capability(capability) -> str:
    """The GPU's 16-bit type from its compute capability: "fp16" below 8.0 (T4 7.5, V100 7.0: no
    native bf16, though torch.cuda.is_bf16_supported() says True on a T4 through emulation,
    pytorch#148322), "bf16" from 8.0 (A100, A10G, L4, H100)."""
    return "bf16" if tuple(int(x) for x in capability) >= (8, 0) else "fp16"


def gpu_half(device=None) -> str:
    """half_for_capability of a CUDA device (torch.cuda.get_device_capability)."""
    import torch
    return half_for_capability(torch.cuda.get_device_capability(device))


def hardware() -> str:
    """A short human label: the GPU, else the CPU model and its core count."""
    return gpu_name() or f"{cpu_model()} ({os.cpu_count()} cores)"


def machine_key() -> str:
    """Stable id of this hardware + software for caching measurements."""
    import torch
    parts = [hardware(), ",".join(sorted(cpu_flags())), torch.__version__, str(torch.get_num_threads())]
    # the kernels' class too: under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 the same CPU runs
    # other kernels, and a choice timed natively (w8a8 target, w4 draft) was never timed there
    emulated = [os.environ.get(v, "") for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")]
    parts += emulated if any(emulated) else []
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def loadavg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def on_zerogpu() -> bool:
    """A ZeroGPU Space: the `spaces` package's own switch (SPACES_ZERO_GPU=true there)."""
    import os
    return os.environ.get("SPACES_ZERO_GPU", "").strip().lower() in ("1", "t", "true")


def read_proc() -> tuple[float, float] | None:
    """(all CPU seconds used by anyone, seconds used by this process) since boot."""
    try:
        with open("/proc/stat") as f:
            vals = [float(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    used = sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)  # minus idle and iowait
    return used / tick, (float(own[11]) + float(own[12])) / tick  # utime + stime


# ------------------------------------------------------------------ forks

_LOCKS: weakref.WeakSet = weakref.WeakSet()


class Lock:
    """threading.Lock, made anew in a forked process. ZeroGPU runs each GPU call in a fork of the
    page's process (hosting/forked.py), and fork copies a lock as it is: one that another thread held
    at that instant (a replay rendering, a store being written) stays held in the fork for ever,
    and the run waiting on it hangs. tests/test_zerogpu_fork.py forks as spaces does."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self):
        self._lock = threading.Lock()
        _LOCKS.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _fresh_locks() -> None:
    for lock in list(_LOCKS):
        lock._lock = threading.Lock()


def after_fork(fn) -> None:
    """fn() in a forked child, before anything else runs there (os.register_at_fork)."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=fn)


after_fork(_fresh_locks)


class CpuMeter:
    """Cores used by other processes, averaged between two readings."""

    def __init__(self, read=None, cores: int | None = None, clock=time.monotonic,
                 interval: float = MIN_INTERVAL):
        self._read, self._clock, self.interval = read or read_proc, clock, interval
        self.cores = cores or os.cpu_count() or 1
        self._lock = Lock()
        self._last: tuple[float, tuple[float, float]] | None = None
        self.others: float | None = None  # cores' worth used by other processes
        self.exact = False  # others came from /proc (not the load average, which counts our threads too)
        self._pid = os.getpid()

    def sample(self) -> float | None:
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last[0] < self.interval:
                return self.others
            got = self._read()
            self.exact = got is not None
            if got is None:
                try:
                    self.others = os.getloadavg()[0]
                except OSError:
                    self.others = None
                return self.others
            if self._pid != os.getpid():  # a fork: its own CPU time restarts at 0, the last reading
                self._pid, self._last = os.getpid(), None  # was the parent's (18.8 of 2 cores, once)
            if self._last is not None:
                dt = now - self._last[0]
                used, own = got[0] - self._last[1][0], got[1] - self._last[1][1]
                self.others = max(0.0, (used - own) / dt)
            self._last = (now, got)
            return self.others

    def busy(self) -> bool:
        return self.others is not None and self.others >= BUSY_SHARE * self.cores
