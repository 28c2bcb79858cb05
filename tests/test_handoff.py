"""Memory handed back after a conversion (engine/cpu/memory.py): the checkpoint pages a conversion
read leave the process, the bytes read again are the same, and a mapping something wrote into
is never dropped (its written pages would be lost)."""
import sys

import pytest
import torch

from specviz.engine.cpu.memory import _mappings, drop_file_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _rss_file_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    return 0


def _mapped(path, n):
    """A uint8 tensor over the file, mapped private and writable as torch maps a checkpoint."""
    storage = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=n)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def test_read_pages_are_dropped_and_read_back_the_same(tmp_path):
    n = 32 << 20
    path = tmp_path / "w.safetensors"
    data = torch.randint(0, 255, (n,), dtype=torch.uint8)
    path.write_bytes(data.numpy().tobytes())
    t = _mapped(path, n)
    total = int(t.sum())
    before = _rss_file_kb()
    assert drop_file_pages() >= n
    assert before - _rss_file_kb() >= (n >> 10) * 3 // 4  # most of the 32 MB left the process
    assert int(t.sum()) == total and torch.equal(t[:1000], data[:1000])


def test_a_mapping_written_into_is_kept(tmp_path):
    n = 4 << 20
    path = tmp_path / "w.safetensors"
    path.write_bytes(bytes(n))
    t = _mapped(path, n)
    t[0] = 7  # a private copy of that page now: dropping it would give the file's 0 back
    drop_file_pages()
    assert int(t[0]) == 7


def test_smaps_parsing():
    text = ("7f00-7f10 rw-p 00000000 fe:00 1 /c/model.safetensors\nSize: 4 kB\nAnonymous:    8 kB\n"
            "7f20-7f30 r--p 00000000 fe:00 2 /c/other.bin\nAnonymous:    0 kB\n"
            "7f40-7f50 rw-p 00000000 fe:00 3 /c/m-00001.safetensors\nAnonymous:    0 kB\n")
    assert _mappings(text, ".safetensors") == [(0x7f00, 0x7f10, 8), (0x7f40, 0x7f50, 0)]
