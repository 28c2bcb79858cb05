"""Public EAGLE heads (issue 70): a folder or Hub repo in the EAGLE authors' layout (SafeAILab/EAGLE's
eagle/model/cnets1.py and cnets.py; SGLang's LlamaForCausalLMEagle and LlamaForCausalLMEagle3 read the
same files) mapped onto plain torch modules that method `eagle` drafts with. Two layouts:

EAGLE-1/2 (`layers.0.*`, `fc`): our EagleHead's layer exactly. cnets1.py computes
fc(cat(inputs_embeds, hidden_states)), embedding first, as EagleHead does; layer 0 has no input norm;
its state feeds the target's own LM head (the whole vocabulary, nothing kept out).

EAGLE-3 (`midlayer.*`, `fc` over 3 hidden sizes, `norm`, `lm_head`, `d2t`): cnets.py's Model. The
target's states are the inputs of its layers 2, L//2 and L-3 (modeling_llama_kv.py appends
hidden_states before those layers run, in layer order; vLLM and SGLang capture the same three, or
`eagle_config.eagle_aux_hidden_state_layer_ids` + 1 where a config names them), concatenated and fc'd
to one hidden size. The layer reads [input_layernorm(e(x)); hidden_norm(u)] (q/k/v over 2 hidden
sizes) with u as its residual; logits = lm_head(norm(out)) over the draft vocabulary, draft id i being
target id i + d2t[i]. Later drafts feed the layer's own output back, pre-norm (cnets.py topK_genrate:
input_hidden = out_hidden, with fc skipped since it is one hidden size wide).

The files' own embed_tokens are ignored: the target's embedding is used, as SGLang shares it. No
remote code runs: config.json is read as JSON, weights as safetensors or a weights-only torch.load."""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import RequestError
from ..sampling import spread_logits
from .eagle_head import KV, EagleHead, RMSNorm, attend, head_weight

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
FILES = ["config.json", "model.safetensors", "pytorch_model.bin"]


# ------------------------------------------------------------------ where the files are
def resolve(name: str) -> Path:
    """A local folder as is; else a Hub id fetched (or found in the Hub's cache) by snapshot_download."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if not HUB_ID.fullmatch(name):
        raise RequestError(f"The EAGLE head {name!r} is neither a folder here nor a Hub id (owner/name).")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(name, allow_patterns=FILES))
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated, refused: one message
        raise RequestError(f"The EAGLE head {name!r} is not a folder here and could not be fetched from the "
                           f"Hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}).") from None


def read(folder: Path) -> tuple[dict, dict]:
    """(config.json as a dict, the weights with any leading `model.` dropped)."""
    cfg_path, st, pt = folder / "config.json", folder / "model.safetensors", folder / "pytorch_model.bin"
    if not cfg_path.is_file() or not (st.is_file() or pt.is_file()):
        raise RequestError(f"{str(folder)!r} is not an EAGLE head folder: it needs config.json and "
                           "model.safetensors or pytorch_model.bin.")
    try:
        cfg = json.loads(cfg_path.read_text())
        if st.is_file():
            from safetensors.torch import load_file
            state = load_file(str(st))
        else:
            state = torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - bad JSON, a truncated or pickled-code file alike
        raise RequestError(f"The EAGLE head in {str(folder)!r} cannot be read ({type(e).__name__}: {e}).") \
            from None
    return cfg, {k.removeprefix("model."): v for k, v in state.items()}


def layout(state: dict) -> str:
    if "midlayer.self_attn.q_proj.weight" in state:
        return "eagle3"
    if "layers.0.self_attn.q_proj.weight" in state and "fc.weight" in state:
        return "eagle"
    raise RequestError("Not an EAGLE head: its weights have neither EAGLE-1/2's layers.0.* and fc nor "
                       "EAGLE-3's midlayer.*.")


# ------------------------------------------------------------------ shapes
def _shape(cfg: dict) -> dict:
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    return {"hidden": h, "heads": heads, "kv_heads": int(cfg.get("num_key_value_heads") or heads),
            "head_dim": int(cfg.get("head_dim") or h // heads), "intermediate": int(cfg["intermediate_size"]),
            "theta": float(cfg.get("rope_theta") or 10000.0), "eps": float(cfg.get("rms_norm_eps") or 1e-6)}


def inv_freq(cfg: dict) -> torch.Tensor:
    """The rotary frequencies the head was trained with, from its config (rope_theta, and rope_scaling
    such as Llama 3.1's "llama3"), through transformers' own Llama rotary: no code of the head's."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta",
            "rope_scaling", "rope_parameters", "max_position_embeddings")
    c = LlamaConfig(**{k: cfg[k] for k in keys if cfg.get(k) is not None})
    return LlamaRotaryEmbedding(c).inv_freq.float()


def _fits(name: str, cfg: dict, fc: torch.Tensor, wide: int, target) -> None:
    """RequestError unless the head reads this target's hidden size (fc over `wide` of them) and vocab."""
    th, tv = int(target.config.hidden_size), int(target.config.vocab_size)
    h_in = int(cfg.get("target_hidden_size") or cfg["hidden_size"])
    if h_in != th or tuple(fc.shape) != (int(cfg["hidden_size"]), wide * th):
        raise RequestError(f"The EAGLE head {name!r} reads hidden states of size {h_in} "
                           f"(fc {tuple(fc.shape)}); this target's are {th}: it was made for another model.")
    if int(cfg["hidden_size"]) != th:  # EAGLE-3 with target_hidden_size: its own, narrower embedding
        raise RequestError(f"The EAGLE head {name!r} works at hidden size {cfg['hidden_size']}, not its "
                           f"target's {th}; only heads at their target's hidden size are supported.")
    if cfg.get("vocab_size") is not None and int(cfg["vocab_size"]) != tv:
        raise RequestError(f"The EAGLE head {name!r} has a vocabulary of {cfg['vocab_size']} tokens; this "
                           f"target's is {tv}: it was made for another model.")


def _only_one_layer(name: str, cfg: dict) -> None:
    if int(cfg.get("num_hidden_layers") or 1) != 1:
        raise RequestError(f"The EAGLE head {name!r} has {cfg['num_hidden_layers']} layers; only the "
                           "published one-layer heads are supported.")


# ------------------------------------------------------------------ EAGLE-1/2: our own layer
def eagle1(name: str, cfg: dict, state: dict, target) -> EagleHead:
    _only_one_layer(name, cfg)
    _fits(name, cfg, state["fc.weight"], 2, target)
    shape = _shape(cfg)
    head = EagleHead({**shape, "qkv_bias": "layers.0.self_attn.q_proj.bias" in state})
    sd = {"fc.weight": state["fc.weight"],
          "fc.bias": state.get("fc.bias", torch.zeros(shape["hidden"]))}  # cnets1's bias=True default
    for k, v in state.items():
        if k.startswith("layers.0.") and "rotary_emb" not in k:  # old .bin files kept inv_freq
            sd[k.removeprefix("layers.0.").removeprefix("self_attn.").removeprefix("mlp.")] = v
    sd.pop("input_layernorm.weight", None)  # layer 0 has none in cnets1; a stray one is never read
    _load(name, head, sd)
    head.inv_freq = inv_freq(cfg)
    return head


def _load(name: str, module: nn.Module, sd: dict) -> None:
    try:
        module.load_state_dict({k: v.float() for k, v in sd.items()})
    except RuntimeError as e:
        raise RequestError(f"The EAGLE head {name!r} does not fit the layout it names "
                           f"({str(e).splitlines()[0]}).") from None
    module.eval().requires_grad_(False)


# ------------------------------------------------------------------ EAGLE-3
class Eagle3Head(nn.Module):
    """cnets.py's Model without its embedding and tree search: fc over the three states, the midlayer,
    and (apart, in DraftVocabHead) norm and lm_head. forward returns the pre-norm output state."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = dict(cfg)
        h, nh, nk, d, i = (cfg[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "intermediate"))
        self.fc = nn.Linear(3 * cfg["target_hidden"], h, bias=cfg["fc_bias"])
        self.input_layernorm = RMSNorm(h, cfg["eps"])  # on e(x)
        self.hidden_norm = RMSNorm(h, cfg["eps"])  # on the state u
        self.q_proj = nn.Linear(2 * h, nh * d, bias=False)
        self.k_proj = nn.Linear(2 * h, nk * d, bias=False)
        self.v_proj = nn.Linear(2 * h, nk * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h, cfg["eps"])
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.register_buffer("inv_freq", torch.ones(d // 2), persistent=False)

    _rotary = EagleHead._rotary

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor, cache: KV | None = None,
                mask: torch.Tensor | None = None):
        """emb (B, n, H), feat (B, n, 3 H_target) target states or (B, n, H) its own outputs -> (B, n, H);
        mask as EagleHead.forward's."""
        dt = self.fc.weight.dtype
        u = feat.to(dt)
        if u.shape[-1] == self.fc.in_features and u.shape[-1] != self.cfg["hidden"]:
            u = self.fc(u)
        x = torch.cat([self.input_layernorm(emb.to(dt)), self.hidden_norm(u)], -1)
        u = u + attend(self, x, pos, cache, mask)
        y = self.post_attention_layernorm(u)
        return u + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class DraftVocabHead(nn.Module):
    """EAGLE-3's output: norm, then logits over its draft vocabulary written at their target ids; every
    other target id gets the lowest float, so q is 0 there after softmax (the engine's rejection sampling
    over the whole vocabulary keeps the target's law)."""

    def __init__(self, norm: RMSNorm, weight: torch.Tensor, ids: torch.Tensor, vocab: int):
        super().__init__()
        self.norm = norm
        self.proj = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(weight.float())
        self.vocab = vocab
        self.register_buffer("ids", ids.long())
        self.eval().requires_grad_(False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return spread_logits(self.proj(self.norm(h.to(self.proj.weight.dtype))).float(), self.ids, self.vocab)


def draft_ids(name: str, state: dict, rows: int, vocab: int) -> torch.Tensor:
    """Target ids of the draft vocabulary's rows: i + d2t[i] (SGLang's hot_token_id), or i where the
    draft vocabulary is the target's. RequestError unless they are distinct ids of this target."""
    d2t = state.get("d2t")
    ids = torch.arange(rows) + (d2t.long() if d2t is not None else 0)
    if len(ids) != rows or ids.min() < 0 or ids.max() >= vocab or len(ids.unique()) != rows:
        raise RequestError(f"The EAGLE head {name!r} maps its {rows}-token draft vocabulary outside this "
                           f"target's {vocab} tokens (d2t): it was made for another model.")
    return ids


def taps_of(cfg: dict, layers: int) -> tuple[int, ...]:
    """The target layers whose inputs the head reads, in layer order (the concatenation's order)."""
    named = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    taps = [i + 1 for i in named] if named else [2, layers // 2, layers - 3]
    if len(set(taps)) != 3 or min(taps) < 0 or max(taps) > layers:
        raise RequestError(f"An EAGLE-3 head reads the target's layers {taps}; this target has {layers} "
                           "(three distinct ones needed).")
    return tuple(sorted(taps))


def eagle3(name: str, cfg: dict, state: dict, target, vocab: int):
    """(Eagle3Head, DraftVocabHead, the target layers it reads)."""
    _only_one_layer(name, cfg)
    _fits(name, cfg, state["fc.weight"], 3, target)
    shape = _shape(cfg)
    head = Eagle3Head({**shape, "target_hidden": int(target.config.hidden_size),
                       "fc_bias": "fc.bias" in state})
    sd = {k: v for k, v in state.items() if k.startswith("fc.")}
    for k, v in state.items():
        if k.startswith("midlayer.") and "rotary_emb" not in k:
            sd[k.removeprefix("midlayer.").removeprefix("self_attn.").removeprefix("mlp.")] = v
    _load(name, head, sd)
    head.inv_freq = inv_freq(cfg)
    norm = RMSNorm(shape["hidden"], shape["eps"])
    _load(name, norm, {"weight": state["norm.weight"]})
    w = state.get("lm_head.weight")
    if w is None:  # no lm_head of its own: SGLang loads the target's
        w = head_weight(target.get_output_embeddings())
    lm = DraftVocabHead(norm, w, draft_ids(name, state, w.shape[0], vocab), vocab)
    return head, lm, taps_of(cfg, int(target.config.num_hidden_layers))


class TargetHead(nn.Module):
    """The target's own output layer, whole, as the authors' EAGLE-1/2 drafting uses it: float logits over
    its vocabulary. Held, not copied (an 8B target's is 0.5 G parameters), and never moved or cast."""

    def __init__(self, target):
        super().__init__()
        self.dtype = target.dtype
        object.__setattr__(self, "out", target.get_output_embeddings())  # no submodule: .to() skips it

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h.to(self.dtype)).float()


def build(name: str, folder: Path, target) -> tuple[nn.Module, nn.Module, tuple[int, ...] | None]:
    """(the head, its output layer h -> logits over the target's vocabulary, EAGLE-3's tapped layers or
    None) on the target's device: float32 on a CPU, the target's dtype elsewhere."""
    cfg, state = read(folder)
    vocab = int(target.get_output_embeddings().out_features)
    dev = target.device
    dtype = target.dtype if dev.type != "cpu" else torch.float32
    try:
        if layout(state) == "eagle3":
            head, lm, taps = eagle3(name, cfg, state, target, vocab)
            return head.to(dev, dtype), lm.to(dev, dtype), taps
        return eagle1(name, cfg, state, target).to(dev, dtype), TargetHead(target), None
    except (KeyError, TypeError, ValueError) as e:  # a weight or config field missing or malformed
        raise RequestError(f"The EAGLE head {name!r} lacks what its layout needs "
                           f"({type(e).__name__}: {e}).") from None
