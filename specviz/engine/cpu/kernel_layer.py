"""A Llama-family decoder layer as two C calls around the KV cache's update; the stack as one.

After the norms, attention rows and MLP gate went to C (engine/cpu/lean.py's kernel_rows),
a low-bit step still made ~20 Python-side calls a layer (views, rotary, the residual adds,
each Linear's wrapper). kernels/qgemm.c's layer_pre (norm, q/k/v projection, rotary) and
layer_post (row-wise attention, output projection, residual, norm, gate/up, SiLU gate, down,
residual) run the same C functions the modules call, in the same order, and the elementwise
steps as the same single float operations as aten's, so a layer's output is the module path's
bit for bit (tests/test_lean.py) and every engine, cache and tree path agrees with it.

A forward whose cache this module can write (a filled DynamicCache, an eager StaticKV) runs
every layer in one C call instead (forward_stack, kernels/qgemm.c's layers_forward): the same
calls in the same order, with the new keys and values written into the cache from C.

Serves a fused (lean), kernel-flagged layer whose four projections are BlockLinears
(w4a8, q8a8 weights: engine/cpu/qgemm.py) on a CPU; anything else keeps the module path.
"""
from __future__ import annotations

import contextlib
import ctypes
import weakref

import torch
from torch.nn.modules import module as _module

from . import qgemm
from .lean import KernelRMSNorm
from .qgemm import BlockLinear, Layer, Lin

MAX_HEAD_DIM = 512  # layer_pre's rotary scratch
GROW = 256  # positions of room added when a cache's buffer is (re)made
_OFF = [False]  # off(): the module path, for a profile that times each Linear through hooks
_EPOCH = [0]  # bumped by moved(), so held layer structs are rebuilt


def moved(*_) -> None:
    """Say that some model's modules or tensors changed: every held layer struct (and lean_forward's
    list of them) is rebuilt at its next use. Every module, buffer and parameter registration
    anywhere says it (torch's global registration hooks, below); code that re-homes tensors
    (`t.data = ...`) says it itself. One missed call is safe from freed memory, though not from
    stale weights: a held struct keeps the storages it points into alive (layer_struct)."""
    _EPOCH[0] += 1


def epoch() -> int:
    """How many times moved() was said."""
    return _EPOCH[0]


def is_off() -> bool:
    return _OFF[0]


for _register in (_module.register_module_module_registration_hook,
                  _module.register_module_buffer_registration_hook,
                  _module.register_module_parameter_registration_hook):
    _register(moved)


@contextlib.contextmanager
def off():
    """Within: layer_struct says no, and the model's modules run (same kernels, same bits). Entering
    and leaving say moved(): what a forward backend planned for a model changes with it."""
    _OFF[0] = True
    moved()
    try:
        yield
    finally:
        _OFF[0] = False
        moved()


def _lin(m: BlockLinear) -> Lin:
    *packed, bits = m._weights()  # the packed buffers' addresses, as BlockLinear hands them to its kernel
    return Lin(*packed, qgemm._ptr(m._buffers["bias"]), bits, m.out_features, m.in_features)


def _modules(layer) -> tuple | None:
    """(attention, MLP, the two norms, the four projections) of a kernel-flagged fused layer, read
    from the module dicts: an nn.Module attribute lookup is slow (docs/why.md#module-dicts)."""
    m = layer._modules
    attn, mlp = m.get("self_attn"), m.get("mlp")
    if not (getattr(attn, "kernel", False) and getattr(mlp, "kernel", False)):
        return None  # only FusedAttention / FusedMLP carry the flag, so the projections below exist
    a, f = attn._modules, mlp._modules
    return (attn, mlp, m.get("input_layernorm"), m.get("post_attention_layernorm"),
            a["qkv_proj"], a["o_proj"], f["gate_up"], f["down_proj"])


def _fits(mods: tuple) -> bool:
    attn, _, n1, n2, *lins = mods
    d = attn.head_dim
    hq, hkv = attn.sizes[0] // d, attn.sizes[1] // d
    return (all(isinstance(n, KernelRMSNorm) and n.weight.dtype == torch.float32 for n in (n1, n2))
            and all(type(m) is BlockLinear for m in lins)
            and d % 8 == 0 and d <= MAX_HEAD_DIM and hq % hkv == 0 and hq // hkv <= qgemm.GMAX)


def _tensors(mods: tuple) -> list[torch.Tensor]:
    _, _, n1, n2, *lins = mods
    return [n1.weight, n2.weight] + [t for m in lins for t in m._buffers.values() if t is not None]


def layer_struct(layer) -> Layer | None:
    """The layer as kernels/qgemm.c's layer_t, kept on the layer until moved() is said (a module
    swapped, tensors re-homed); None when it is not all on the kernels. What is held keeps the
    storages it points into (detached views). Why not check the modules and every tensor's
    address each time: that was most of the Python around a step (docs/why.md#struct-epoch)."""
    if _OFF[0]:
        return None
    held = layer.__dict__.get("_specviz_kernel_layer")
    if held is not None and held[0] == _EPOCH[0]:  # no module swapped, no tensor moved since
        return held[2]
    mods = _modules(layer)
    if mods is None:
        return None
    if not _fits(mods):
        return None
    attn, mlp, n1, n2, qkv, o, gu, down = mods
    d = attn.head_dim
    s = Layer(n1.weight.data_ptr(), n2.weight.data_ptr(), n1.variance_epsilon, n2.variance_epsilon,
              float(attn.scaling), _lin(qkv), _lin(o), _lin(gu), _lin(down), attn.sizes[0] // d,
              attn.sizes[1] // d, d, mlp.inter)
    layer._specviz_kernel_layer = (_EPOCH[0], [t.detach() for t in _tensors(mods)], s)
    return s


def covers(model) -> bool:
    """Whether every layer of `model` runs as kernel calls (a fused w4a8 Llama-family model)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return bool(layers) and all(layer_struct(layer) is not None for layer in layers)


def forward(s: Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, i: int) -> None:
    """One layer for h (1, n, hidden) contiguous float32, in place; cos, sin (n, d) contiguous."""
    n, lib, nt = h.shape[1], qgemm.library(), torch.get_num_threads()
    qkv = h.new_empty(n, s.qkv.n)
    if lib.layer_pre(ctypes.byref(s), h.data_ptr(), n, cos.data_ptr(), sin.data_ptr(), qkv.data_ptr(), nt):
        raise MemoryError("no memory for a layer's scratch")
    heads = qkv.view(1, n, -1, s.d)
    kv_heads = heads[:, :, s.hq:].transpose(1, 2)  # (1, 2 hkv, n, d): the keys' heads, then the values'
    k, v = cache.update(kv_heads[:, :s.hkv], kv_heads[:, s.hkv:], i)
    kv = k.shape[2]
    ends = (ctypes.c_int * n)(*range(kv - n + 1, kv + 1))
    if lib.layer_post(ctypes.byref(s), h.data_ptr(), n, qkv.data_ptr(), k.data_ptr(), k.stride(2),
                      k.stride(1), v.data_ptr(), v.stride(2), v.stride(1), ends, None, None, nt):
        raise MemoryError("no memory for a layer's scratch")


# ------------------------------------------------------------------ the whole stack in one call
# One layers_forward call for every layer: a 1.5B step made 56 C calls, 28 cache updates (each a
# torch.cat of the layer's whole cache) and the Python between them. The keys and values of a
# DynamicCache live in one buffer with room to grow; its layers hold prefix views of it, so a
# crop (a view of the same start) keeps it and anything else (a tree's index_select, a module
# path's cat) is copied back in on the next forward.

_STACKS: dict = {}  # tuple of Layer ids -> (the Layers, their C array): kept alive, so ids stay theirs
_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DynamicCache -> _Buffer


def _stack(structs: list[Layer]):
    key = tuple(map(id, structs))
    held = _STACKS.get(key)
    if held is None:
        if len(_STACKS) >= 8:  # old models' stacks: a handful at most
            _STACKS.clear()
        held = _STACKS[key] = (structs, (Layer * len(structs))(*structs))
    return held[1]


class _Buffer:
    """Every layer's keys (even slots) and values (odd) of one DynamicCache with room for `cap`
    positions: (2 layers, 1, kv heads, cap, head dim)."""

    def __init__(self, layers, cap: int):
        k0 = layers[0].keys
        self.cap, t = cap, k0.shape[-2]
        self.buf = k0.new_empty(2 * len(layers), *k0.shape[:2], cap, k0.shape[-1])
        for i, layer in enumerate(layers):
            self.buf[2 * i, :, :, :t] = layer.keys
            self.buf[2 * i + 1, :, :, :t] = layer.values
        ptrs = [t.data_ptr() for t in self.buf.unbind(0)]
        self.kp, self.vp = ptrs[0::2], ptrs[1::2]
        arr = ctypes.c_void_p * len(layers)
        self.kb, self.vb = arr(*self.kp), arr(*self.vp)

    def holds(self, layers, end: int) -> bool:
        return end <= self.cap and all(a.keys.data_ptr() == k and a.values.data_ptr() == v
                                       for a, k, v in zip(layers, self.kp, self.vp, strict=True))


def _cache_room(cache, nl: int, n: int):
    """(keys array, values array, kr, kh, p, the DynamicCache's _Buffer or None) for a forward of n
    tokens over `cache`, or None when this cache is not one the stack call can write (an empty or
    foreign DynamicCache, a masked StaticKV)."""
    own = getattr(cache, "buffers", None)  # engine/kvcache.py's StaticKV: its own buffers, pointer
    if own is not None:
        keys, values, p = own() or ([], [], 0)
        if len(keys) != nl:
            return None
        kb = (ctypes.c_void_p * nl)(*(t.data_ptr() for t in keys))
        vb = (ctypes.c_void_p * nl)(*(t.data_ptr() for t in values))
        return kb, vb, keys[0].stride(2), keys[0].stride(1), p, None
    layers = getattr(cache, "layers", None)
    if not layers or len(layers) != nl or getattr(layers[0], "keys", None) is None \
            or layers[0].keys.dtype != torch.float32:
        return None  # a prompt's first forward fills the cache through update(); then this
    p = layers[0].keys.shape[-2]
    b = _BUFFERS.get(cache)
    if b is None or not b.holds(layers, p + n):
        b = _BUFFERS[cache] = _Buffer(layers, p + n + GROW)
    return b.kb, b.vb, b.buf.stride(3), b.buf.stride(2), p, b


def tap(taps, i: int, h: torch.Tensor) -> None:
    """A copy of h (1, n, hidden) into the list of each tap (layer index, list) at layer i: what layer i
    reads (forward_stack; lean_forward.tapping)."""
    for j, box in taps or ():
        if j == i:
            box.append(h.clone())


def tree_rows(visible: list) -> tuple:
    """Rows' visible keys (rowwise_attention.visible_keys: a causal prefix as a slice, else a tree row's
    positions in cache order) -> layers_forward's (ends, base, extras) C arrays: each row's key
    count, its contiguous prefix, then every row's positions past its prefix, one after another."""
    ends, base, extra = [], [], []
    for keys in visible:
        if isinstance(keys, slice):
            ends.append(keys.stop)
            base.append(keys.stop)
            continue
        idx = keys.tolist()
        b = 0
        while b < len(idx) and idx[b] == b:
            b += 1
        ends.append(len(idx))
        base.append(b)
        extra += idx[b:]
    n = len(ends)
    return (ctypes.c_int * n)(*ends), (ctypes.c_int * n)(*base), (ctypes.c_int * max(1, len(extra)))(*extra)


def _open(cache, structs: list[Layer]) -> bool:
    """Give an empty DynamicCache a zero-length float32 layer per struct, so that a prompt's first
    forward is one stack call too. Why: through update() a 1.5B's prompt cost 28 layers' calls,
    and the next forward copied its keys into a buffer (docs/why.md#cache-open)."""
    if getattr(cache, "layers", None) is None or getattr(cache, "buffers", None) is not None \
            or cache.get_seq_length() != 0 or any(getattr(x, "keys", None) is not None for x in cache.layers):
        return False
    for i, s in enumerate(structs):
        cache.update(torch.zeros(1, s.hkv, 0, s.d), torch.zeros(1, s.hkv, 0, s.d), i)
    return True


def forward_stack(structs: list[Layer], h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache,
                  rows: tuple | None = None, taps: list | None = None) -> bool:
    """Every layer for h (1, n, hidden) in place, as forward() one by one would (same C code in the
    same order: the same bits); False (nothing done) where the cache is not one it can write.
    rows: a tree's (tree_rows), else a chain's (row r sees every key up to its own).
    taps: a list of (layer index, []) whose list gets a copy of h as that layer reads it (the stack
    then runs as one call a segment between taps: the same C code in the same order)."""
    n, nl = h.shape[1], len(structs)
    room = _cache_room(cache, nl, n)
    if room is None and _open(cache, structs):
        room = _cache_room(cache, nl, n)
    if room is None:
        return False
    kb, vb, kr, kh, p, b = room
    ends, base, extra = rows or (None, None, None)
    cuts = [0, *sorted({i for i, _ in taps or () if 0 < i < nl}), nl]
    for a, z in zip(cuts, cuts[1:], strict=False):
        tap(taps, a, h)
        seg_k, seg_v = (kb, vb) if (a, z) == (0, nl) else (
            (ctypes.c_void_p * (z - a))(*kb[a:z]), (ctypes.c_void_p * (z - a))(*vb[a:z]))
        if qgemm.library().layers_forward(_stack(structs[a:z]), z - a, h.data_ptr(), n, cos.data_ptr(),
                                          sin.data_ptr(), seg_k, seg_v, kr, kh, p, ends, base, extra,
                                          torch.get_num_threads()):
            raise MemoryError("no memory for a layer's scratch")
    for i, box in taps or ():
        if i >= nl:  # past the last layer: what the final norm reads
            box.append(h.clone())
    if b is not None:  # the layers' views now end at p + n (a StaticKV's caller moves its pointer)
        views = b.buf[:, :, :, :p + n].unbind(0)
        for i, layer in enumerate(cache.layers):
            layer.keys, layer.values = views[2 * i], views[2 * i + 1]
    return True


def keep_slots(cache, prefix: int, slots: list[int]) -> bool:
    """forward.keep_cache_slots inside a DynamicCache's stack buffer: the kept positions moved down
    in place and the layers' views cut to them, so the next stack call copies nothing back in
    (a tree's accepted path after every round). False (nothing done) where the cache has no
    buffer whose views its layers still are."""
    b = _BUFFERS.get(cache)
    layers = getattr(cache, "layers", None)
    if b is None or not layers or not b.holds(layers, layers[0].keys.shape[-2]):
        return False
    end = prefix + len(slots)
    if slots:
        idx = torch.tensor(slots, dtype=torch.long)
        b.buf[:, :, :, prefix:end] = b.buf.index_select(3, idx)
    views = b.buf[:, :, :, :end].unbind(0)
    for i, layer in enumerate(layers):
        layer.keys, layer.values = views[2 * i], views[2 * i + 1]
    return True
