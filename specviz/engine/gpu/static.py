"""A Llama-family causal LM (Llama, Qwen2, Mistral) run over its own static KV cache, gpt-fast style.

Every forward takes token ids [1, n] and their positions [n] as tensors and writes its keys and
values at those positions; attention reads the whole preallocated cache under a mask built on the
device from the positions (a key counts when its position is <= the query's). Nothing in a forward
reads a tensor on the host, so a forward of n rows can be captured once as a torch.cuda.CUDAGraph
and replayed with new ids and positions copied into its input buffers (gpt-fast's generate.py does
the same with torch.compile; this captures the graph itself, as ZeroGPU has no torch.compile).

A rollback is free: entries past the accepted length are never attended (the mask) and are
overwritten before any later query can see them. The model's own modules run the work (embedding,
norms, projections, MLP, rotary table, output layer); only the cache and attention are ours.
A layer prefix (`n_layers`) gives a truncated draft that shares the target's weights.
"""
from __future__ import annotations

import sys
import weakref

import torch
import torch.nn.functional as F


def supported(model) -> bool:
    """The Llama family's layout: model.model.{embed_tokens, layers, norm, rotary_emb} + lm_head."""
    base = getattr(model, "model", None)
    return all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")) and \
        getattr(getattr(model, "config", None), "model_type", None) in ("llama", "qwen2", "mistral")


class StaticModel:
    """One model (or its first `n_layers` layers) over a static cache of `max_len` positions.

    run(ids, pos0) computes logits for ids at positions pos0.. : a captured graph of that row count
    replays when there is one (capture(n)), else the same forward runs eagerly. The returned logits
    are the graph's output buffer: read (or clone) them before the next replay of that size."""

    def __init__(self, model, max_len: int, n_layers: int | None = None, graphs: bool | None = None,
                 compile=None, weak: bool = False):
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
        shape = (1, kv, self.max_len, hd)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        self.keys = torch.arange(self.max_len, device=self.device)
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        self.graphs: dict[int, tuple] = {}  # rows -> (graph, ids buffer, positions buffer, logits)
        # this model's own capture stream. Why: cuBLAS keeps a workspace per (handle, stream), and a
        # graph bakes in the workspace of the stream it was captured on. torch.cuda.graph's default
        # capture stream is one per process, so every graph shared one workspace, and two sides replaying
        # at once on two streams ran kernels over the same scratch memory: the suspected cause of the
        # 2026-11-28 H100 race that hung with both threads inside replay. Own stream, own workspace.
        on_gpu = self.use_graphs and self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if on_gpu else None
        # compile: a compiler for the forward (backends/compiled.inductor: fuses the norms, rotary and
        # SiLU·mul before capture, as gpt-fast does); the graphs replay its kernels. None: this file
        # never calls torch.compile (ZeroGPU has none)
        self.compiled = compile is not None
        self._forward = compile(self.forward) if compile is not None else self.forward

    @property
    def model(self):
        return self._model()

    # ------------------------------------------------------------------ forward

    def _attention(self, i: int, layer, x: torch.Tensor, pos: torch.Tensor, cos, sin) -> torch.Tensor:
        attn = layer.self_attn
        n = x.shape[1]
        if hasattr(attn, "qkv_proj"):  # engine/cpu/lean.py's fused projections
            q, k, v = attn.qkv_proj(x).split(attn.sizes, -1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(1, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        rotary = getattr(attn, "_rotary", None) or sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k = rotary(q, k, cos, sin)
        self.k[i].index_copy_(2, pos, k)
        self.v[i].index_copy_(2, pos, v)
        # grouped heads folded into the query rows: the cache is read once per kv head, never copied
        g = self.groups
        q = q.reshape(1, self.kv_heads, g * n, self.head_dim)
        mask = (self.keys.view(1, -1) <= pos.view(-1, 1)).repeat(g, 1).view(1, 1, g * n, self.max_len)
        out = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask, scale=attn.scaling)
        out = out.reshape(1, self.heads, n, self.head_dim).transpose(1, 2).reshape(1, n, -1)
        return attn.o_proj(out)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [1, n, vocab] of ids [1, n] at positions pos [n]; keys/values written at pos."""
        base = self.model.model
        x = base.embed_tokens(ids)
        cos, sin = base.rotary_emb(x, pos.view(1, -1))
        for i, layer in enumerate(base.layers[: self.n_layers]):
            x = x + self._attention(i, layer, layer.input_layernorm(x), pos, cos, sin)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.lm_head(base.norm(x))

    # ------------------------------------------------------------------ graphs

    @torch.no_grad()
    def capture(self, n: int, warmup: int = 2) -> None:
        """Capture the forward of n rows (positions at the cache's end: nothing valid is touched)."""
        if not self.use_graphs or n in self.graphs:
            return
        ids = torch.zeros((1, n), dtype=torch.long, device=self.device)
        pos = torch.arange(self.max_len - n, self.max_len, device=self.device)
        with all_attention_kernels():  # the one fixed shape: cuDNN's plan is built once, here
            graph, out = capture_graph(lambda: self._forward(ids, pos), self.device, warmup,
                                       stream=self.stream)
        self.graphs[n] = (graph, ids, pos, out)

    @torch.no_grad()
    def run(self, ids: torch.Tensor, pos0: int) -> torch.Tensor:
        """Logits [1, n, vocab] of ids ([n] or [1, n], on the device) at positions pos0..pos0+n-1."""
        ids = ids.view(1, -1)
        n = ids.shape[1]
        if pos0 + n > self.max_len:
            raise ValueError(f"static cache full: {pos0 + n} positions of {self.max_len}")
        entry = self.graphs.get(n)
        if entry is None:  # eager (a prompt's length): compiled code runs only inside captured graphs
            return self.forward(ids, self.keys[pos0:pos0 + n])
        graph, ids_buf, pos_buf, out = entry
        ids_buf.copy_(ids)
        pos_buf.copy_(self.keys[pos0:pos0 + n])
        graph.replay()
        return out


def all_attention_kernels():
    """SDPA free to pick any backend, cuDNN's too, which the app turns off for eager forwards
    (models/gpu_path.no_cudnn_attention: a plan per new key length) but a graph's fixed shape wants."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                        SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def capture_graph(fn, device, warmup: int = 2, stream=None):
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
    with torch.cuda.graph(graph, stream=side):
        out = fn()
    return graph, out
