"""The Llama family's chain forward without transformers' per-call machinery, bit for bit.

A batch-1 step on a CPU spent a quarter of its time outside the weight matmuls
(docs/why.md#lean-forward), and part of that is the orchestration around the maths: output
capturing and kwargs merging decorators, the mask builder, the attention-interface
lookup, per-layer module calls with their keyword plumbing. This forward runs the
same modules (norms, fused projections, MLP, rotary table, embeddings, output layer)
in the same order with the same aten calls, so its logits are bit-identical to
`model(...)`'s; only the Python around them goes. Row-wise attention
(engine/cpu/rowwise_attention.py) is inlined: row j of an n-token forward attends to the
first kv - n + j + 1 keys through the one SDPA call a one-token step makes.

It serves chain forwards of at most ROWWISE_MAX new tokens (steps, verifies, a short
prompt) of a fused (engine/cpu/lean.py), row-wise Llama-family model with no forward
hooks on it; everything else (trees' masks, long prompts, compiled caches, other
architectures, a model someone is timing through hooks) keeps `model(...)`. Because
the two paths agree to the bit, mixing them inside one run changes nothing.
Where every layer is on the C kernels (w4a8: engine/cpu/kernel_layer.py) each layer is two C
calls around the cache's update instead, bit-identical too.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from . import kernel_layer, qgemm
from .lean import FusedAttention, FusedMLP, supported
from .rotary import STANDARD_ROTARIES, rotary_tables, rotate_joint
from .rowwise_attention import ROWWISE_MAX, is_rowwise, visible_keys

PROMPT_MAX = 2048  # a prompt's rows in one C stack call, at most (its scratch grows with them)


def eligible(model, n: int) -> bool:
    """Whether an n-token chain forward of `model` can take this path: up to ROWWISE_MAX tokens on
    any fused row-wise model, a prompt of up to PROMPT_MAX where every layer is on the C kernels.
    Why prompts too: they read faster there (docs/why.md#lean-prompt), and each row then has the
    bits a one-token step would give it."""
    if n <= 0 or model._forward_hooks or model._forward_pre_hooks:
        return False
    return n <= _rows(model)


def _rows(model) -> int:
    """The most rows a chain forward of `model` may have on this path (0: none), hooks aside."""
    if not supported(model) or not is_rowwise(model):
        return 0
    cfg = model.config
    if set(getattr(cfg, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        return 0
    if _structs(model.model) is not None:  # kernel layers are fused ones (only those carry the flag)
        return PROMPT_MAX
    return ROWWISE_MAX if all(isinstance(layer.self_attn, FusedAttention) and isinstance(layer.mlp, FusedMLP)
                              for layer in model.model.layers) else 0


def plan(model) -> tuple[int, list | None, bool]:
    """What eligible() and forward() ask of `model` at every call, asked once (a backend holds it
    until kernel_layer.moved() is said: engine/backends/lean.py): (the most rows a chain forward
    takes this path, 0 for none; the layer structs where the one-call stack serves, else None;
    whether q and k rotate as one)."""
    rows = _rows(model)
    if not rows:
        return 0, None, False
    body = model.model
    stack = _structs(body) if _stack_serves(body) else None
    return rows, stack, all(layer.self_attn._rotary in _STANDARD for layer in body.layers)


def rows_exact(model, n: int) -> bool:
    """Whether an n-token chain forward of `model` runs every layer on the C kernels (forward's
    one-call branch), where a row's bits never depend on the other rows: a prompt read whole gives
    its last row the bits of a one-token step, and its keys those of any split."""
    return eligible(model, n) and _stack_serves(model.model)


def _stack_serves(body) -> bool:
    """Whether forward's one-call branch takes this body: every layer on the C kernels, fed float32
    rows on the CPU (a HalfEmbedding hands its rows on in out_dtype)."""
    emb = body.embed_tokens
    return (_structs(body) is not None and emb.weight.device.type == "cpu"
            and getattr(emb, "out_dtype", emb.weight.dtype) == torch.float32)


def _structs(body) -> list | None:
    """Every layer of a model body as kernels/qgemm.c's layer_t, or None unless all of them are on the
    C kernels with the family's standard rotary (the one-call branch of forward, forward_masked).
    Kept on the body until kernel_layer.moved() is said (eligible() and forward() both ask, each
    forward: docs/why.md#struct-epoch)."""
    if kernel_layer.is_off():
        return None
    n, held = kernel_layer.epoch(), body.__dict__.get("_specviz_structs")
    if held is not None and held[0] == n:
        return held[1]
    layers = getattr(body, "layers", None)
    structs = [kernel_layer.layer_struct(layer) for layer in layers or ()]
    if not structs or any(s is None for s in structs):
        structs = None  # a kernel layer's attention is a FusedAttention: it has a _rotary
    elif not all(layer.self_attn._rotary in _STANDARD for layer in layers):
        structs = None
    body.__dict__["_specviz_structs"] = (n, structs)
    return structs


def _attend(attn, q, k, v) -> torch.Tensor:
    """Row-wise causal attention over the cache (keys k hold the n new ones last):
    (1, heads, n, dim) -> (1, n, heads, dim), each row as its own one-query SDPA call
    (what rowwise_attention makes through transformers' sdpa_attention_forward), or all rows
    in one C call where the layer's kernel flag is set (the same call rowwise_attention makes)."""
    n, kv, scaling = q.shape[2], k.shape[2], attn.scaling
    if attn.kernel and qgemm.attends(q, k, v):
        return qgemm.attend(q, k, v, [kv - n + j + 1 for j in range(n)], scaling)
    rows = []
    for j in range(n):
        end = kv - n + j + 1
        rows.append(F.scaled_dot_product_attention(
            q[:, :, j:j + 1], k[:, :, :end], v[:, :, :end], attn_mask=None, dropout_p=0.0,
            scale=scaling, is_causal=False, enable_gqa=True).transpose(1, 2).contiguous())
    return rows[0] if n == 1 else torch.cat(rows, dim=1)


_STANDARD = STANDARD_ROTARIES


def _rotate_joint(qkv, attn, tables):
    hd = attn.head_dim
    return rotate_joint(qkv, hd, attn.sizes[0] // hd, attn.sizes[1] // hd, tables)


def forward(model, ids: list[int], cache, keep: int) -> torch.Tensor | None:
    """One KV-cached forward of `ids` (positions from the cache's length); returns the
    (1, keep, vocab) logits `model(...).logits` would, or None for keep=0 (the keys alone: no
    output layer). The cache is a DynamicCache or an eager StaticKV (whose caller moves its
    pointer); both are written through update()."""
    body = model.model
    stack = _structs(body) if _stack_serves(body) else None
    joint = stack is None and all(layer.self_attn._rotary in _STANDARD for layer in body.layers)
    return run(model, ids, cache, keep, stack, joint)


def run(model, ids: list[int], cache, keep: int, stack: list | None, joint: bool) -> torch.Tensor | None:
    """forward() with plan()'s answers given: `stack` the layer structs of the one-call branch (None:
    layer by layer), `joint` whether q and k rotate as one."""
    n, p = len(ids), cache.get_seq_length()
    body = model.model
    dev = body.embed_tokens.weight.device  # model.device walks every module's parameters
    x = torch.tensor([ids], device=dev)
    h = body.embed_tokens(x)
    cos, sin = body.rotary_emb(h, torch.arange(p, p + n, device=dev).unsqueeze(0))
    taps = body.__dict__.get("_specviz_taps")
    if stack is not None:
        h, cos, sin = h.contiguous(), cos[0].contiguous(), sin[0].contiguous()
        if not kernel_layer.forward_stack(stack, h, cos, sin, cache, taps=taps):
            for i, s in enumerate(stack):
                kernel_layer.tap(taps, i, h)
                kernel_layer.forward(s, h, cos, sin, cache, i)
            kernel_layer.tap(taps, len(stack), h)
        return model.lm_head(body.norm(h)[:, -keep:]) if keep else None
    tables = rotary_tables(cos, sin) if joint else None
    for i, layer in enumerate(body.layers):
        kernel_layer.tap(taps, i, h)
        attn = layer.self_attn
        qkv = attn.qkv_proj(layer.input_layernorm(h))
        if joint:
            q, k, v = _rotate_joint(qkv, attn, tables)
        else:
            q, k, v = (t.view(1, n, -1, attn.head_dim).transpose(1, 2) for t in qkv.split(attn.sizes, -1))
            q, k = attn._rotary(q, k, cos, sin)
        k, v = cache.update(k, v, i)
        out = _attend(attn, q, k, v)
        h = h + attn.o_proj(out.reshape(1, n, -1).contiguous())
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    kernel_layer.tap(taps, len(body.layers), h)  # a tap past the last layer: what the final norm reads
    return model.lm_head(body.norm(h)[:, -keep:]) if keep else None


@contextlib.contextmanager
def tapping(model, layers, boxes=None):
    """While a forward of `model` runs on this path: a copy of h (1, n, hidden) as each of `layers`
    reads it, one list a layer (`boxes`, or new ones; EAGLE's fused taps: proposers/eagle.py). The
    module path's forwards never look here: a forward pre-hook on those layers serves them (one of the
    two fills the lists)."""
    body = getattr(model, "model", None)
    taps = list(zip([int(i) for i in layers], boxes or [[] for _ in layers], strict=True))
    if body is None:  # not the Llama family's layout: never this path
        yield [box for _, box in taps]
        return
    body.__dict__["_specviz_taps"] = taps
    try:
        yield [box for _, box in taps]
    finally:
        body.__dict__.pop("_specviz_taps", None)


def forward_masked(model, ids: list[int], positions: list[int], bias: torch.Tensor, cache,
                   keep: int) -> torch.Tensor | None:
    """A masked forward (a token tree, lookahead's guesses: forward.masked_forward's arguments) as
    one C call of the whole layer stack, each row attending to the keys its mask row allows, in
    cache order: the bits `model(...)` gives through row-wise attention. Float logits of the last
    `keep` inputs, or None where this path does not serve (then nothing was done).
    Why: through `model(...)` a tree's verify cost far more than a chain's of as many rows
    (docs/why.md#lean-masked)."""
    n = len(ids)
    body = getattr(model, "model", None)
    if body is None or not eligible(model, n) or bias.shape[-1] != cache.get_seq_length() + n:
        return None
    visible = visible_keys(bias, n, bias.shape[-1])
    if visible is None or not _stack_serves(body):
        return None
    structs = _structs(body)
    h = body.embed_tokens(torch.tensor([ids], device=model.device))
    cos, sin = body.rotary_emb(h, torch.tensor([positions], device=model.device))
    h = h.contiguous()
    if not kernel_layer.forward_stack(structs, h, cos[0].contiguous(), sin[0].contiguous(), cache,
                                      kernel_layer.tree_rows(visible), body.__dict__.get("_specviz_taps")):
        return None
    return model.lm_head(body.norm(h)[:, -keep:])[0].float()
