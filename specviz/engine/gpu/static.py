"""The one static KV cache (StaticKV), and a Llama-family causal LM run over it, gpt-fast style
(StaticModel: the GPU's graph path).

StaticKV: every layer's keys and values live in one preallocated buffer of `capacity` positions,
written in place. The cache holds positions [0, pos); rolling back after a rejection is moving
`pos` back: the stale entries past it are never attended to (sliced away, or masked out by the
causal mask) and are overwritten by the next forward. Nothing is reallocated per step, unlike
DynamicCache's cat. Two layouts of the same buffers:
- eager (`full=False`): attention reads the valid prefix k[:, :, :pos+n];
- masked (`full=True`): keys and values are written at `write_pos` (a device tensor) and attention
  reads the whole buffer under a mask, so every shape is fixed: torch.compile (engine/backends/
  compiled.py) and captured CUDA graphs (StaticModel) see the same shapes at every step.
transformers' models call only `update(k, v, layer_idx, ...)` on it (engine/backends/static.py
serves it to them, eager or compiled); StaticModel calls the same update from its own forward.

StaticModel: every forward takes token ids [1, n] and their positions [n] as tensors and writes its
keys and values at those positions (the masked layout); attention reads the whole cache under a
mask built on the device from the positions (a key counts when its position is <= the query's).
Nothing in a forward reads a tensor on the host, so a forward of n rows can be captured once as a
torch.cuda.CUDAGraph and replayed with new ids and positions copied into its input buffers
(gpt-fast's generate.py does the same with torch.compile; this captures the graph itself, as
ZeroGPU has no torch.compile). The model's own modules run the work (embedding, norms, projections,
MLP, rotary table, output layer); only the cache and attention are ours. A layer prefix
(`n_layers`) gives a truncated draft that shares the target's weights.
"""
from __future__ import annotations

import sys
import weakref

import torch
import torch.nn.functional as F

from ..cpu.rotary import STANDARD_ROTARIES, rotary_tables, rotate_joint
from .fuse import fuse_projections, rms_norm

GROW = 512  # positions added when a run outgrows the buffer (a compiled graph then recompiles once)
# forwards of more new tokens (the prompt) run eagerly on a compiled cache: one graph per prompt
# length otherwise
COMPILE_MAX_NEW = 32
# the key spans a forward's attention reads (and the cache's whole length): the smallest that holds
# every position written so far. Why: attention reads its whole span under a mask, and the page's
# 2592-position cache made the 1.5B's graph step 4.84 ms against 3.36 ms at 96 positions (H200,
# 2026-11-28, gpu-check's fusion section); a run that stays within 256 positions reads 256
SPANS = (256, 512, 1024)


class StaticKV:
    """Preallocated per-layer K/V buffers and a position pointer (see module doc)."""

    is_compileable = True
    # per layer in transformers' caches: 5.17's create_causal_mask asks `False in cache.is_sliding`
    # and its index (a bool here failed there: "argument of type 'bool' is not iterable"); 5.23 asks
    # `True in` it for sliding-window masks only. Every layer is full attention (kvcache.supported)
    is_sliding = (False,)

    def __init__(self, capacity: int = 1024, *, full: bool = False, compiled=None,
                 rows: int = COMPILE_MAX_NEW, backend=None):
        self.capacity = capacity
        self.full = full
        self.compiled = compiled  # torch.compile'd forward, or None
        self.rows = rows  # forwards of at most this many new tokens take the compiled call
        self.backend = backend  # the backend that made it (None: bound at its first forward)
        self.pos = 0  # positions held
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_pos: torch.Tensor | None = None  # positions this forward writes (full layout)

    # ---- what the model calls
    def update(self, key, value, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.full:
            k.index_copy_(2, self.write_pos, key)
            v.index_copy_(2, self.write_pos, value)
            return k, v
        end = self.pos + key.shape[-2]
        k[:, :, self.pos:end] = key
        v[:, :, self.pos:end] = value
        return k[:, :, :end], v[:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.pos

    def buffers(self):
        """(keys, values, pos) for a C forward that writes its new entries at pos in place
        (engine/cpu/kernel_layer.py); None in the masked layout, written at write_pos."""
        return None if self.full else (self.keys, self.values, self.pos)

    def crop(self, length: int) -> None:
        # transformers' convention: a negative length removes that many positions
        self.pos = min(self.pos, length if length >= 0 else max(0, self.pos + length))

    def reset(self) -> None:
        self.pos = 0

    # ---- our side
    def allocate(self, model, layers: int | None = None) -> None:
        """The buffers (of the first `layers` layers: a truncated draft), before the first forward
        (never inside a compiled graph)."""
        cfg = model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        for _ in range(layers or cfg.num_hidden_layers):
            for buf in (self.keys, self.values):
                buf.append(torch.zeros((1, heads, self.capacity, dim), dtype=model.dtype,
                                       device=model.device))
        if self.compiled is not None:
            _static_address(*self.keys, *self.values)

    def reserve(self, end: int) -> None:
        if end <= self.capacity:
            return
        new = max(end, self.capacity + GROW)
        for buf in (self.keys, self.values):
            for i, t in enumerate(buf):
                grown = t.new_zeros((*t.shape[:2], new, t.shape[-1]))
                grown[:, :, : self.pos] = t[:, :, : self.pos]
                buf[i] = grown
                if self.compiled is not None:
                    _static_address(grown)
        self.capacity = new


def _static_address(*tensors) -> None:
    # fixed data pointers: CUDA graphs replay without copying the buffers (as transformers' StaticLayer);
    # on a CPU nothing replays, and a static address would make a grown buffer recompile the graph
    if not torch.compiler.is_compiling():
        for t in tensors:
            if t.is_cuda:
                torch._dynamo.mark_static_address(t)


def supported(model) -> bool:
    """The Llama family's layout: model.model.{embed_tokens, layers, norm, rotary_emb} + lm_head."""
    base = getattr(model, "model", None)
    return all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")) and \
        getattr(getattr(model, "config", None), "model_type", None) in ("llama", "qwen2", "mistral")


class StaticModel:
    """One model (or its first `n_layers` layers) over a StaticKV of `max_len` positions, masked layout.

    run(ids, pos0) computes logits for ids at positions pos0.. : a captured graph of that row count
    replays when there is one (capture(n)), else the same forward runs eagerly. The returned logits
    are the graph's output buffer: read (or clone) them before the next replay of that size; so are
    the states it leaves in `states` (forward_states)."""

    def __init__(self, model, max_len: int, n_layers: int | None = None, graphs: bool | None = None,
                 compile=None, weak: bool = False, fuse: bool | None = None, spans=SPANS,
                 fold: bool = True):
        if not supported(model):
            raise ValueError("the static-graph path needs a Llama-family model (llama, qwen2, mistral)")
        # weak: a pool of caches (backends/graphs.py) must not keep a replaced pair alive
        self._model = weakref.ref(model) if weak else (lambda: model)
        base = model.model
        self.n_layers = n_layers or len(base.layers)
        cfg = model.config
        p = next(model.parameters())
        # a multiple of 16: the memory-efficient attention kernel wants its mask's rows aligned
        self.device, self.dtype, self.max_len = p.device, p.dtype, -(-int(max_len) // 16) * 16
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.heads, self.kv_heads, self.head_dim, self.groups = heads, kv, hd, heads // kv
        self.kv = StaticKV(self.max_len, full=True)  # never grows: graphs read its fixed buffers
        self.kv.allocate(model, self.n_layers)
        self.positions = torch.arange(self.max_len, device=self.device)
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        # (rows, span) -> (graph, ids buffer, positions buffer, logits)
        self.graphs: dict[tuple[int, int], tuple] = {}
        # spans captured: all (None), or those up to a run's last position (ZeroGPU captures inside each
        # GPU call what that run reaches: backends/graphs.Graphs.prepare); a longer span runs eagerly
        self.capture_upto: int | None = None
        # this model's own capture stream. Why: cuBLAS keeps a workspace per (handle, stream), and a
        # graph bakes in the workspace of the stream it was captured on. torch.cuda.graph's default
        # capture stream is one per process, so every graph shared one workspace, and two sides replaying
        # at once on two streams ran kernels over the same scratch memory: the suspected cause of the
        # 2026-11-28 H100 race that hung with both threads inside replay. Own stream, own workspace.
        on_gpu = self.use_graphs and self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if on_gpu else None
        # one memory pool for all this model's graphs (a graph per row count and span): they replay one
        # at a time on its stream, and each graph's output stays allocated, so only scratch is shared
        # (vLLM shares one pool across its batch sizes the same way)
        self.pool = torch.cuda.graph_pool_handle() if on_gpu else None
        # compile: a compiler for the forward (backends/compiled.inductor: fuses the norms, rotary and
        # SiLU·mul before capture, as gpt-fast does); the graphs replay its kernels. None: this file
        # never calls torch.compile (ZeroGPU has none)
        self.compiled = compile is not None
        # a compiled forward would compile once per span: one span (the whole cache) there
        shorter = {s for s in (spans or ()) if s < self.max_len and not self.compiled}
        self.spans = sorted(shorter | {self.max_len})
        self._forward = compile(self.forward_states) if compile is not None else self.forward_states
        self.states = None  # the last run's (post-norm state, layer inputs): forward_states
        # fuse: q/k/v as one matrix and gate/up as one (fuse_projections), on by default on CUDA
        # fold: the norms, the q/k rotary (where the projections are joined) and the mask in fewer kernels
        # (fuse.rms_norm, cpu/rotary.rotate_joint; the same bits on a CPU)
        self.fold = bool(fold)
        self.fused = fuse_projections(model, self.n_layers) if (
            self.device.type == "cuda" if fuse is None else fuse) else [None] * self.n_layers

    @property
    def model(self):
        return self._model()

    # ------------------------------------------------------------------ forward

    def _attention(self, i: int, layer, x: torch.Tensor, mask, rope, span: int) -> torch.Tensor:
        # rope: (cos, sin, their rotary_tables or None), made once a forward
        attn = layer.self_attn
        n = x.shape[1]
        fused = self.fused[i]
        rotary = getattr(attn, "_rotary", None) or sys.modules[type(attn).__module__].apply_rotary_pos_emb
        cos, sin, tables = rope
        if fused is not None and tables is not None and rotary in STANDARD_ROTARIES:
            q, k, v = rotate_joint(F.linear(x, fused.qkv, fused.qkv_bias), self.head_dim, self.heads,
                                   self.kv_heads, tables)
        else:
            if fused is not None:
                q, k, v = F.linear(x, fused.qkv, fused.qkv_bias).split(fused.sizes, -1)
            elif hasattr(attn, "qkv_proj"):  # engine/cpu/lean.py's fused projections
                q, k, v = attn.qkv_proj(x).split(attn.sizes, -1)
            else:
                q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
            q = q.view(1, n, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = rotary(q, k, cos, sin)
        keys, values = self.kv.update(k, v, i)  # written at kv.write_pos (forward set it: pos)
        keys, values = keys[:, :, :span], values[:, :, :span]
        # grouped heads folded into the query rows: the cache is read once per kv head, never copied
        q = q.reshape(1, self.kv_heads, self.groups * n, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        out = out.reshape(1, self.heads, n, self.head_dim).transpose(1, 2).reshape(1, n, -1)
        return attn.o_proj(out)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, span: int | None = None) -> torch.Tensor:
        """Logits [1, n, vocab] of ids [1, n] at positions pos [n]; keys/values written at pos;
        attention reads the first `span` positions (default all)."""
        return self.forward_states(ids, pos, span)[0]

    def forward_states(self, ids: torch.Tensor, pos: torch.Tensor, span: int | None = None):
        """(logits, states): forward()'s logits and what a trained draft reads of the target (EAGLE's
        heads, proposers/eagle.py): the post-norm last hidden state [1, n, H] and every layer's input
        (the last entry: the final norm's input). Why all of them: a graph's outputs must be chosen at
        capture, before any method is, and keeping them costs no kernel, only their buffers (29 layers ×
        17 rows × 1536 × 2 bytes = 1.5 MB for the 1.5B's largest verify)."""
        base = self.model.model
        self.kv.write_pos = pos
        x = base.embed_tokens(ids)
        cos, sin = base.rotary_emb(x, pos.view(1, -1))
        # built once a forward, not once a layer (two kernels fewer per layer in a graph): a key counts
        # when its position is <= the query's; grouped heads repeat each query row's mask
        n, g, span = ids.shape[1], self.groups, span or self.max_len
        mask = (self.positions[:span].view(1, -1) <= pos.view(-1, 1)).repeat(g, 1).view(1, 1, g * n, span)
        if self.fold:  # as SDPA turns a bool mask into one in the query's type, in every layer (a kernel)
            mask = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        norm = rms_norm if self.fold else (lambda module, h: module(h))
        rope = (cos, sin, rotary_tables(cos, sin) if self.fold else None)
        inputs = []
        for i, layer in enumerate(base.layers[: self.n_layers]):
            inputs.append(x)
            x = x + self._attention(i, layer, norm(layer.input_layernorm, x), mask, rope, span)
            x = x + self._mlp(i, layer.mlp, norm(layer.post_attention_layernorm, x))
        inputs.append(x)
        h = norm(base.norm, x)
        return self.model.lm_head(h), (h, tuple(inputs))

    def _mlp(self, i: int, mlp, x: torch.Tensor) -> torch.Tensor:
        fused = self.fused[i]
        if fused is None or fused.gate_up is None:
            return mlp(x)
        gate, up = F.linear(x, fused.gate_up, fused.gate_up_bias).chunk(2, -1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    # ------------------------------------------------------------------ graphs

    @torch.no_grad()
    def capture(self, n: int, warmup: int = 2) -> None:
        """Capture the forward of n rows, one graph per span (positions at the cache's end: nothing
        valid is touched, whatever the span)."""
        if not self.use_graphs:
            return
        for span in self.spans:
            if (n, span) in self.graphs or self.capture_upto is not None and span > self.capture_upto:
                continue
            ids = torch.zeros((1, n), dtype=torch.long, device=self.device)
            pos = torch.arange(self.max_len - n, self.max_len, device=self.device)
            with all_attention_kernels():  # the one fixed shape: cuDNN's plan is built once, here
                graph, out = capture_graph(lambda ids=ids, pos=pos, span=span: self._forward(ids, pos, span),
                                           self.device, warmup, stream=self.stream, pool=self.pool)
            self.graphs[(n, span)] = (graph, ids, pos, out)

    def span_for(self, end: int) -> int:
        """The smallest span holding positions [0, end)."""
        return next(s for s in self.spans if s >= end)

    @torch.no_grad()
    def run(self, ids: torch.Tensor, pos0: int) -> torch.Tensor:
        """Logits [1, n, vocab] of ids ([n] or [1, n], on the device) at positions pos0..pos0+n-1;
        self.states: their forward_states (both the graph's buffers: read before its next replay)."""
        ids = ids.view(1, -1)
        n = ids.shape[1]
        if pos0 + n > self.max_len:
            raise ValueError(f"static cache full: {pos0 + n} positions of {self.max_len}")
        span = self.span_for(pos0 + n)
        entry = self.graphs.get((n, span))
        if entry is None:  # eager (a prompt's length): compiled code runs only inside captured graphs
            logits, self.states = self.forward_states(ids, self.positions[pos0:pos0 + n], span)
            return logits
        graph, ids_buf, pos_buf, (logits, self.states) = entry
        ids_buf.copy_(ids)
        pos_buf.copy_(self.positions[pos0:pos0 + n])
        graph.replay()
        return logits


def all_attention_kernels():
    """SDPA free to pick any backend, cuDNN's too, which the app turns off for eager forwards
    (models/gpu_path.no_cudnn_attention: a plan per new key length) but a graph's fixed shape wants."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def capture_graph(fn, device, warmup: int = 2, stream=None, pool=None):
    """(graph, output): fn() run `warmup` times on `stream` (kernels chosen, compiled, workspaces
    allocated), then captured on that same stream as one torch.cuda.CUDAGraph; graph.replay() reruns
    it on the current stream, writing the same output tensor (read or clone it before the next
    replay). One stream per model: see StaticModel.stream."""
    side = stream or torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        out = fn()
    return graph, out
