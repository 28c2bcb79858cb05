"""A StaticModel as the engine's KV cache: what a forward backend (engine/backends/) needs to serve
the page's decode loops from captured graphs.

The engine asks for forwards of a varying number of new tokens (a plain step, a verify of the
drafts it made this round, a prompt) and rolls back with crop(). Graphs have fixed shapes, so a
forward of n rows runs in the smallest captured size >= n, padded: the padding rows sit after the
real ones (a real row never attends to them: the mask is causal) and write keys past the cache's
length, which the next forward overwrites before anything can read them. The verify's size is
γ+1 for the largest γ in use (pad to γ+1); a prompt longer than every size runs eagerly.
"""
from __future__ import annotations

import torch

from .static import StaticModel

PAD = 0  # the token id padding rows carry (their logits are dropped)


class GraphCache:
    """get_seq_length() / crop(length) as transformers' caches (a negative length removes that
    many); forward(ids, keep) at the next positions -> the last `keep` rows' logits (a copy)."""

    def __init__(self, static: StaticModel, sizes=(1,)):
        self.static, self.length = static, 0
        self.read = 0  # rows of the last forward (states() reads them)
        self.sizes = sorted(set(sizes))
        for n in self.sizes:
            static.capture(n)

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        self.length = max(0, length if length >= 0 else self.length + length)

    def size_for(self, n: int) -> int:
        """The captured size a forward of n rows runs in (n itself: eager, e.g. a prompt)."""
        fits = [s for s in self.sizes if s >= n and self.length + s <= self.static.max_len]
        return fits[0] if fits and self.static.use_graphs else n

    @torch.no_grad()
    def forward(self, ids, keep: int = 1) -> torch.Tensor:
        """ids: host ints, or a device tensor (the batched plain loop's token: engine/decoding.py)."""
        n = len(ids)
        t = self.rows(ids, self.size_for(n))
        logits = self.static.run(t, self.length)[0, n - keep:n].clone()  # a graph's buffer: copied
        self.length += n
        self.read = n
        return logits

    def states(self, taps=None) -> torch.Tensor:
        """The last forward's real rows as a trained draft reads them (proposers/eagle.py), a copy
        (n, H · parts): the post-norm last hidden state (taps None: EAGLE-1/2), or the inputs of the
        layers `taps` names, joined (EAGLE-3; a tap past the last layer: the final norm's input)."""
        normed, inputs = self.static.states
        parts = [normed] if taps is None else [inputs[i] for i in taps]
        return torch.cat([p[0, :self.read] for p in parts], -1)

    def rows(self, ids, size: int) -> torch.Tensor:
        """ids padded to `size` rows on the device, without a host sync: a device tensor is padded
        there (no host tensor at all); host ints take one asynchronous copy (to_device). Why: a
        tensor built from a list and copied the ordinary way waits for the stream, every step (about
        2 ms a step of host overhead on the 2026-11-28 H200). Positions need no copy from the host:
        StaticModel.run slices them from its own arange on the device."""
        dev = self.static.device
        if not isinstance(ids, torch.Tensor):
            return to_device(list(ids) + [PAD] * (size - len(ids)), dev)
        t = ids.reshape(-1)
        if size > t.numel():
            t = torch.cat([t, t.new_full((size - t.numel(),), PAD)])
        return t


def to_device(ints: list[int], device) -> torch.Tensor:
    """Host ints as a long tensor on `device`: on CUDA through pinned memory, non-blocking (the
    pinned block is held by torch's host allocator until the copy is done), so the host never waits
    for the stream's queued work; on a CPU the tensor itself."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(ints, dtype=torch.long, device=device)
    return torch.tensor(ints, dtype=torch.long).pin_memory().to(device, non_blocking=True)


class Behind:
    """A device tensor's values, read without waiting for the work queued after them: on CUDA copied
    to pinned host memory without blocking and an event recorded after the copy, so read() waits for
    this copy only (a plain read, .tolist(), would wait for the whole stream). Why: the draft model's
    chain (proposers/draft.py) can enqueue token i+1's step before it reads token i, and the device
    runs that step while the host reads. On a CPU: the tensor, read as it is."""

    def __init__(self, t: torch.Tensor):
        self.event = None
        if t.is_cuda:
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = t

    def read(self) -> list:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()
