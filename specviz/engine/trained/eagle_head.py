"""EAGLE's draft head (Li et al. 2024, EAGLE-1/2): one decoder layer that reads the target's own
last hidden state f_t (post-norm, the row the target's LM head reads) beside the embedding of the
token that followed, e(x_{t+1}), and predicts f_{t+1}; the target's frozen LM head, restricted to the
most frequent tokens, turns that into the draft's q for x_{t+2}. Drafting feeds its own predicted
feature back for the tokens after the first.

    row t:  u_t = fc([e(x_{t+1}); f_t])
            u_t = u_t + attn(u_t)        (causal over rows, rotary at position t, a KV cache of its own)
            f̂_{t+1} = u_t + mlp(norm(u_t))
            q(x_{t+2}) = softmax(lm_head_keep(f̂_{t+1}))      0 outside the kept tokens

As EAGLE-1 the layer has no input norm (its input is fc's). Plain torch, no transformers class: the
same module trains (bf16, no cache, is_causal) and drafts (fp32 or the CPU's low-bit Linears, a cache).
Lossless whatever it proposes: q is 0 outside the kept set, and the engine's modified rejection
sampling verifies over the target's whole vocabulary.

Files (shipped in assets/drafts/ or cached): {"config", "keep", "int8": {name: codes}, "scale": {name:
row scales}, "float": {name: tensor}}: every matrix int8 with one scale a row (a 24M-parameter layer
in ~25 MB, under the repo's 40 MB a file)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..sampling import spread_logits

VERSION = 1


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(dtype)


def config_of(target, intermediate: int = 3072) -> dict:
    """The head's shape from the target's config: its hidden size, attention heads and rotary; the MLP
    narrower than the target's (a file under 40 MB, int8)."""
    c = target.config
    heads = int(c.num_attention_heads)
    return {"hidden": int(c.hidden_size), "heads": heads,
            "kv_heads": int(getattr(c, "num_key_value_heads", None) or heads),
            "head_dim": int(getattr(c, "head_dim", None) or c.hidden_size // heads),
            "intermediate": intermediate, "theta": float(_theta(c)),
            "eps": float(getattr(c, "rms_norm_eps", 1e-6)), "qkv_bias": True}


def _theta(c) -> float:
    rp = getattr(c, "rope_parameters", None) or {}
    return rp.get("rope_theta") or getattr(c, "rope_theta", None) or 10000.0


class KV:
    """The head's own KV cache: (1, kv_heads, n, dim) keys and values, cropped by count."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.shape[2]

    def add(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], 2)
        self.v = v if self.v is None else torch.cat([self.v, v], 2)
        return self.k, self.v

    def crop(self, n: int):
        if self.k is not None and n < self.k.shape[2]:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]

    @staticmethod
    def causal(n: int, past: int, device) -> torch.Tensor | None:
        """The n new rows' mask over the past and themselves (True = attend); None for one row."""
        return torch.ones(n, past + n, dtype=torch.bool, device=device).tril(past) if n > 1 else None


class EagleHead(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = dict(cfg)
        h, nh, nk, d, i = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "intermediate"))
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.q_proj = nn.Linear(h, nh * d, bias=cfg["qkv_bias"])
        self.k_proj = nn.Linear(h, nk * d, bias=cfg["qkv_bias"])
        self.v_proj = nn.Linear(h, nk * d, bias=cfg["qkv_bias"])
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg["eps"])
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        if cfg.get("taps"):  # the inputs of more of the target's layers, added to f_t (FusedTaps)
            self.fuse = FusedTaps(h, len(cfg["taps"]), cfg["eps"])
        inv = 1.0 / (cfg["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def _rotary(self, x, pos):
        """x (1, heads, n, d) rotated at positions pos (n,): rotate_half, as the Llama family."""
        ang = pos.float()[:, None] * self.inv_freq[None]
        emb = torch.cat([ang, ang], -1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor, cache: KV | None = None,
                mask: torch.Tensor | None = None):
        """emb, feat (B, n, H) rows at positions pos (n,) -> (B, n, H) predicted next features.
        cache: the rows attend to it and are appended to it (B = 1); None: causal over the n rows.
        mask (n, len(cache) + n) bool, True = attend: in place of the causal one (a tree's rows).
        feat (B, n, (1 + k)·H): f_t, then the target's k tapped layer inputs (a head with cfg["taps"]);
        rows with no taps (the predicted states of later drafts) are H wide, or have zero taps."""
        w = getattr(self.fc, "weight", None)  # a low-bit Linear has none: it reads float32
        dt = w.dtype if isinstance(w, torch.Tensor) and w.is_floating_point() else torch.float32
        h = self.cfg["hidden"]
        if feat.shape[-1] > h:
            feat, taps = feat[..., :h], feat[..., h:]
            if hasattr(self, "fuse"):
                feat = feat.to(dt) + self.fuse(taps.to(dt))
        x = self.fc(torch.cat([emb, feat], -1).to(dt))
        x = x + attend(self, x, pos, cache, mask)
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class FusedTaps(nn.Module):
    """EAGLE-3's idea on EAGLE-1's head: the inputs of k more of the target's layers (a low and a middle
    one), each RMS-normed, through one Linear added to f_t. Its Linear starts at 0, so a head given
    taps starts as the EAGLE-1 head it was trained from; rows without taps (the predicted states of the
    second and later drafts) skip it, and training drops it on some rows to match (eagle_train.py)."""

    def __init__(self, h: int, k: int, eps: float):
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(h, eps) for _ in range(k))
        self.proj = nn.Linear(k * h, h, bias=False)
        nn.init.zeros_(self.proj.weight)
        self.h = h

    def forward(self, taps: torch.Tensor) -> torch.Tensor:
        parts = taps.split(self.h, -1)
        return self.proj(torch.cat([n(t) for n, t in zip(self.norms, parts, strict=True)], -1))


def attend(layer: nn.Module, x: torch.Tensor, pos: torch.Tensor, cache: KV | None,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """The head layer's self-attention over x (B, n, in) at positions pos: q/k/v_proj, rotary, causal over
    the rows (and all of `cache`, which the rows join; or as `mask` says, a tree's), o_proj. `layer` holds
    the projections, cfg and _rotary (EagleHead here; public_heads.Eagle3Head, whose x is [e; f], twice as
    wide)."""
    c = layer.cfg
    b, n, _ = x.shape
    q = layer.q_proj(x).view(b, n, c["heads"], c["head_dim"]).transpose(1, 2)
    k = layer.k_proj(x).view(b, n, c["kv_heads"], c["head_dim"]).transpose(1, 2)
    v = layer.v_proj(x).view(b, n, c["kv_heads"], c["head_dim"]).transpose(1, 2)
    q, k = layer._rotary(q, pos), layer._rotary(k, pos)
    if cache is None:
        a = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, enable_gqa=True)
    else:
        past = len(cache)
        k, v = cache.add(k, v)
        if mask is None:  # KV: causal over its rows; gpu/head.SlotKV: a fixed buffer's written slots
            mask = cache.causal(n, past, x.device)
        a = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, enable_gqa=True)
    return layer.o_proj(a.transpose(1, 2).reshape(b, n, -1))


# ------------------------------------------------------------------ the file: int8 rows
def pack(head: nn.Module, keep: torch.Tensor, extra: dict | None = None, version: int = VERSION) -> dict:
    """A trained module (its `cfg` and weights) as a file's dict: every matrix int8 (symmetric, one scale
    a row), the rest float; with the kept token ids of its LM head."""
    q8, scale, flt = {}, {}, {}
    for name, t in head.state_dict().items():
        t = t.detach().float()
        if t.dim() == 2:
            s = (t.abs().amax(1, keepdim=True) / 127).clamp_min(1e-12)
            q8[name] = (t / s).round().clamp(-127, 127).to(torch.int8)
            scale[name] = s.to(torch.float16).squeeze(1)
        else:
            flt[name] = t
    return {"version": version, "config": dict(head.cfg), "keep": keep.to(torch.int32), "int8": q8,
            "scale": scale, "float": flt, **(extra or {})}


def unpack(blob: dict, make=EagleHead, version: int = VERSION, what: str = "an EAGLE head"):
    """(the module in fp32, the kept token ids) from pack()'s dict; ValueError if it is not one."""
    if blob.get("version") != version:
        raise ValueError(f"{what} file of version {blob.get('version')}, not {version}")
    head = make(blob["config"])
    state = {n: blob["int8"][n].float() * blob["scale"][n].float()[:, None] for n in blob["int8"]}
    state.update(blob["float"])
    head.load_state_dict(state)
    return head.eval().requires_grad_(False), blob["keep"].long()


def head_weight(lm_head: nn.Module) -> torch.Tensor:
    """The (V, H) float weight of a target's output layer, whatever module holds it (a low-bit one
    dequantised: the w4a8 target's 8-bit codes)."""
    w = getattr(lm_head, "weight", None)
    if isinstance(w, torch.Tensor) and w.is_floating_point() and w.dim() == 2:
        return w.detach()
    if hasattr(lm_head, "dequantized"):
        return lm_head.dequantized().float()
    eye = torch.eye(lm_head.in_features)
    with torch.no_grad():
        return lm_head(eye).float().T.contiguous()


# ------------------------------------------------------------------ the kept tokens' output layer
# The kept LM head beside a w4a8 target, in w4a8's 4-bit codes, not the target's own output layer's 8-bit
# ones: the shipped EAGLE head's step went 2.2 -> 1.5 ms on avx512vnni and 2.3 -> 1.5 ms with the avx2
# kernels (its 32,768 x 1536 rows were 2/3 of the bytes it reads), held-out first-draft acceptance as
# before within noise (chat 0.444 against 0.445, code 0.581 against 0.556, completion 0.601 against
# 0.595; Zen 4, 2 cores, 2026-11-30; docs/trained_drafts.md). q only proposes: the target verifies with
# its own output layer, so the output is the target's either way.
KEPT_LOWBIT = "w4a8"


class KeptHead(nn.Module):
    """The target's LM head over the kept token ids, in the fastest form here (KEPT_LOWBIT's codes
    where the w4a8 kernel runs, else float); logits of every other id are the lowest float."""

    def __init__(self, weight: torch.Tensor, keep: torch.Tensor, vocab: int, lowbit: str | None):
        super().__init__()
        lin = nn.Linear(weight.shape[1], len(keep), bias=False)
        with torch.no_grad():
            lin.weight.copy_(weight[keep].float())
        if lowbit:
            from ..cpu.lowbit import _low
            lin = _low(lin, lowbit)
        self.proj, self.vocab = lin, vocab
        self.register_buffer("keep", keep)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return spread_logits(self.proj(h).float(), self.keep, self.vocab)


def on_target(module: nn.Module, keep: torch.Tensor, target, vocab: int) -> tuple[nn.Module, KeptHead]:
    """A trained module (EAGLE's head, the trained exit's adapter) and its kept LM head, placed as the
    target runs: Linears in its low-bit family where it has one, else its device and (on a GPU) type."""
    low = lowbit_for(target)
    if low:
        from ..cpu.lowbit import swap_linears
        swap_linears(module, low)
    dev = target.device
    module = module.to(dev)
    lm = KeptHead(head_weight(target.get_output_embeddings()), keep, vocab, KEPT_LOWBIT if low else None)
    lm = lm.to(dev)
    if not low and dev.type != "cpu":
        module, lm = module.to(target.dtype), lm.to(target.dtype)
    return module, lm


def lowbit_for(target) -> str | None:
    """The head's Linears in the target's own low-bit family: w4a8's kernel when the target uses it."""
    from ..cpu.lowbit import lowbit_format
    return "w4a8" if target.device.type == "cpu" and lowbit_format(target) == "w4a8" else None
