"""EAGLE's draft head on the graph path: its layer and its kept LM head over a KV buffer of fixed size,
each forward replayed as a captured CUDA graph (as StaticModel does for the target, static.py).

The head's eager cache (trained/eagle_head.KV) grows by cat and builds a causal mask per call, so no
shape is fixed. Here its keys and values live in one buffer of `capacity` slots (SlotKV), written at
slot tensors and read whole under a mask built on the device (a key counts when its slot is <= the
query's), so the same shapes come back every step and a graph replays them. Slots count the rows the
head has read, in order, as the eager KV's length does; rotary positions are the rows' own (they may
differ: the verify's states can start past the prompt's first row). Rolling back is moving `length`.

One graph per (rows, width): the confirmed rows a round reads (1..γ+1 of the target's states, padded
up to a captured size: the padding rows sit after the real ones, are masked from them, and write slots
the next forward overwrites) and the 1-row step that drafts from the head's own predicted state. For
EAGLE-1/2 both read H-wide states; an EAGLE-3 head reads three of the target's layers (3H) and then its
own output (H): two widths. Each graph ends in the kept LM head, so a draft step is one replay.

With graphs off (graphs=False, any CPU) the same forward runs eagerly on exact shapes: how its
agreement with the eager KV path is tested without a GPU (tests/test_eagle_graphs.py)."""
from __future__ import annotations

import time

import torch

from .cache import PAD, to_device
from .static import capture_graph

SIZES = (1, 2, 4, 8, 17)  # rows a read is padded up to: the target's verify sizes (backends/graphs.SIZES)


class SlotKV:
    """A head layer's keys and values in fixed buffers, written at `write` (a device tensor of slots);
    what trained/eagle_head.attend calls: len(), add(), causal()."""

    def __init__(self, kv_heads: int, head_dim: int, capacity: int, dtype, device):
        self.k = torch.zeros(1, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.slots = torch.arange(capacity, device=device)
        self.write: torch.Tensor | None = None  # the slots this forward writes
        self.length = 0  # slots holding the rows read so far (host side)

    def __len__(self):
        return self.length

    def add(self, k, v):
        self.k.index_copy_(2, self.write, k.to(self.k.dtype))
        self.v.index_copy_(2, self.write, v.to(self.v.dtype))
        return self.k, self.v

    def causal(self, n: int, past: int, device) -> torch.Tensor:
        return self.slots.view(1, -1) <= self.write.view(-1, 1)

    def crop(self, n: int) -> None:
        self.length = min(self.length, n)


class StaticHead:
    """A Drafter's head (proposers/eagle.Drafter) over a SlotKV: run(ids, feats, pos) reads rows into the
    buffer and returns every row's predicted state and logits (views of a graph's buffers: read them
    before the next run)."""

    def __init__(self, drafter, capacity: int, graphs: bool | None = None, widths=None):
        self.head, self.lm, self.embed = drafter.head, drafter.lm, drafter.embed
        cfg = self.head.cfg
        p = next(self.head.parameters())
        self.device, self.dtype = p.device, _float_type(self.head)
        self.hidden = int(cfg["hidden"])
        self.capacity = int(capacity) + max(SIZES)  # a padded read past the last row stays inside
        self.kv = SlotKV(cfg["kv_heads"], cfg["head_dim"], self.capacity, self.dtype, self.device)
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        on_gpu = self.use_graphs and self.device.type == "cuda"  # its own capture stream: static.py says why
        self.stream = torch.cuda.Stream(self.device) if on_gpu else None
        self.pool = torch.cuda.graph_pool_handle() if on_gpu else None
        self.graphs: dict[tuple[int, int], tuple] = {}  # (rows, width) -> graph, inputs, outputs
        # the states' width a round's read has (the target's; EAGLE-3: three layers), and the head's own
        self.widths = tuple(widths or (self.hidden,))
        for w in self.widths:
            for n in (SIZES if w == self.widths[0] else (1,)):
                self.capture(n, w)
        if self.hidden not in self.widths:
            self.capture(1, self.hidden)

    def reset(self) -> None:
        self.kv.length = 0

    def _forward(self, ids, feats, pos, slots):
        """(states (n, H), logits (n, V)) of rows ids (n,), feats (n, W) at rotary positions pos (n,),
        written at slots (n,)."""
        self.kv.write = slots
        e = self.embed(ids.view(1, -1))
        f = self.head(e.to(self.dtype), feats[None].to(self.dtype), pos, self.kv)[0]
        return f, self.lm(f)

    @torch.no_grad()
    def capture(self, n: int, width: int) -> None:
        if not self.use_graphs or (n, width) in self.graphs:
            return
        end = self.capacity - n  # the last slots: nothing valid is touched
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        feats = torch.zeros(n, width, dtype=self.dtype, device=self.device)
        pos = torch.arange(end, end + n, device=self.device)
        slots = pos.clone()
        graph, out = capture_graph(lambda: self._forward(ids, feats, pos, slots), self.device,
                                   stream=self.stream, pool=self.pool)
        self.graphs[(n, width)] = (graph, (ids, feats, pos, slots), out)

    def _size(self, n: int, width: int) -> int | None:
        fits = [s for (s, w) in self.graphs if w == width and s >= n and self.kv.length + s <= self.capacity]
        return min(fits) if fits else None

    @torch.no_grad()
    def run(self, ids, feats: torch.Tensor, pos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over rows (token ids x_{t+1} as host ints or a device tensor, states f_t (n, W)) at
        rotary positions pos, into the next slots -> (predicted states (n, H), logits (n, V))."""
        n, width = len(pos), feats.shape[-1]
        if self.kv.length + n > self.capacity:
            raise ValueError(f"the head's cache is full: {self.kv.length + n} rows of {self.capacity}")
        size = self._size(n, width)
        at = self.kv.length
        self.kv.length += n
        if size is None:  # eager: exact shapes (a CPU, or a read no graph was captured for)
            slots = torch.arange(at, at + n, device=self.device)
            ids = _ids(ids, self.device)
            return self._forward(ids, feats, to_device(list(pos), self.device), slots)
        graph, (ids_buf, feats_buf, pos_buf, slots_buf), (f, logits) = self.graphs[(size, width)]
        pad = size - n
        ids_buf[:n].copy_(_ids(ids, self.device))
        ids_buf[n:].fill_(PAD)
        feats_buf[:n].copy_(feats)
        if pad:
            feats_buf[n:].zero_()
        pos_buf.copy_(to_device(list(pos) + list(range(pos[-1] + 1, pos[-1] + 1 + pad)), self.device))
        slots_buf.copy_(self.kv.slots[at:at + size])
        graph.replay()
        return f[:n], logits[:n]

    def step_after(self, rows: int):
        """A 1-row draft step (the head and the kept LM head) after `rows` read rows, as a callable that
        can be timed again and again: each call drops the step before it (kv back to `rows`)."""
        self.reset()
        self.run(torch.zeros(rows, dtype=torch.long, device=self.device),
                 torch.zeros(rows, self.widths[0], dtype=self.dtype, device=self.device), list(range(rows)))
        f = torch.zeros(1, self.hidden, dtype=self.dtype, device=self.device)
        ids = torch.zeros(1, dtype=torch.long, device=self.device)

        @torch.no_grad()
        def step():
            self.kv.crop(rows)
            self.run(ids, f, [rows])
        return step

    @torch.no_grad()
    def time_step(self, rows: int = 64, tries: int = 7) -> float:
        """The median seconds of one 1-row draft step after `rows` read rows, the device synchronised
        around each: what γ = auto prices as the head's cost."""
        step = self.step_after(rows)
        times = []
        for _ in range(tries):
            _sync(self.device)
            t0 = time.perf_counter()
            step()
            _sync(self.device)
            times.append(time.perf_counter() - t0)
        self.reset()
        return sorted(times)[tries // 2]


def _ids(ids, device) -> torch.Tensor:
    return ids.view(-1).to(device) if isinstance(ids, torch.Tensor) else to_device(list(ids), device)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _float_type(head) -> torch.dtype:
    w = getattr(head.fc, "weight", None)
    return w.dtype if isinstance(w, torch.Tensor) and w.is_floating_point() else torch.float32
