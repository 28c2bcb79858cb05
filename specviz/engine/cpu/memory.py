"""Memory handed back to the OS: heap pages after a conversion, checkpoint pages a conversion has
read, and the cycle collector kept off what was imported before any model."""
from __future__ import annotations


def trim_heap() -> None:
    """Free what conversions leave in reference cycles (a model's modules point at each other, so
    only the cycle collector frees them), then hand the heap's free pages back to the OS (glibc
    keeps them): docs/why.md#trim-heap."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to hand back this way
        pass
    drop_file_pages()


MADV_DONTNEED = 4  # Linux


def drop_file_pages(suffix: str = ".safetensors") -> int:
    """Unmap the pages this process has read of its checkpoint mappings (bytes dropped).
    A converted model's tensors are its own memory; the fp32 checkpoint it was read from stays
    mapped while any of its tensors lives (calibration keeps the fp32 model for its candidates),
    and every page a conversion read counts as the process's memory: 5.9 GB of a first start's
    16.7 GB peak (issue 41). torch maps a checkpoint private and writable, so only a mapping with no
    page of its own (smaps "Anonymous: 0": nothing was written into it) is dropped; a later read of
    a dropped page maps it again from the page cache, or the disk, with the same bytes."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        with open("/proc/self/smaps") as f:
            text = f.read()
    except (OSError, AttributeError):  # not Linux/glibc: the kernel reclaims them under pressure
        return 0
    dropped = 0
    for lo, hi, anon in _mappings(text, suffix):
        if anon == 0 and libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_DONTNEED) == 0:
            dropped += hi - lo
    return dropped


def _mappings(smaps: str, suffix: str) -> list[tuple[int, int, int]]:
    """(start, end, Anonymous kB) of each mapping of a file ending in `suffix`."""
    out, cur = [], None
    for line in smaps.splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's header
            cur = None
            if len(head) == 6 and head[5].strip().endswith(suffix):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = [lo, hi, 0]
                out.append(cur)
        elif cur is not None and head[0] == "Anonymous:":
            cur[2] = int(head[1])
    return [tuple(m) for m in out]


def freeze_imports() -> None:
    """Put every object alive now (imported modules and their tables) out of the cycle collector's
    walk, once, before any model exists: each trim_heap() then walks only what came later, a
    fraction of the app's objects (docs/why.md#freeze-imports). Models
    are never frozen (only the collector frees their modules' cycles): call it before one loads.
    Later calls do nothing, so a process that builds the app or the bench again (the tests do)
    never freezes the models that exist by then."""
    import gc
    if _FROZEN:
        return
    gc.collect()
    gc.freeze()
    _FROZEN.append(True)


_FROZEN: list[bool] = []  # freeze_imports ran in this process
