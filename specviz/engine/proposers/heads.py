"""Medusa heads: K trained residual blocks on the target's last hidden state
propose the next K tokens as a chain (specviz/heads/ trains them; this file holds
the heads' model, their cache and the proposer).

No second model and no extra target forward: the hidden state comes from the
verify forward the engine runs anyway. This proposer runs that forward itself
(verify_logits, in the engine's cache) with a hook on the target's final norm,
which keeps the post-norm states of the positions just read; the row of the
last accepted position is the h the heads read next round. Round 1 drafts
nothing (no state yet): it is the prompt's forward, as plain decoding's.
Per round the heads cost K residual blocks plus one LM-head pass for all K
rows (~1/7 of a 1.5B step by parameter count: the 151936 x 1536 head).

Lossless: head k's q is its softmax after the request's warp, and each token
is drawn from its own head independently of the others, so q_k is exactly the
law of the k-th draft given the drafts before it; the engine's modified
rejection sampling then keeps the target's law (greedy: argmax chains, output
identical to plain decoding). The heads see h_{n-1} (the state that predicted
the last committed token), not that token itself: Medusa's design.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import RequestError
from ..forward import forward_logits, pick
from ..proposer import Proposal, Proposer, register, target_vocab
from ..sampling import warp
from ..trained.store import heads_dir, heads_key, target_dims  # noqa: F401 (re-exported)

# ------------------------------------------------------------------ the heads
# Medusa heads: K small residual blocks on the target's last (post-norm) hidden
# state h. Head k (1..K) predicts the token k positions after the one the target's
# own LM head predicts from h; every head reuses that frozen LM head:
# 
#     logits_k = lm_head(h + SiLU(W_k h + b_k))
# 
# W_k and b_k start at zero, so a fresh head equals the base head (SiLU(0) = 0)
# while its gradient is not zero (SiLU'(0) = 1/2).


class Heads(nn.Module):
    def __init__(self, hidden: int, k: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(k))
        self.keep = None  # the kept token ids of heads trained on the feature pass (heads/medusa_train.py)
        for b in self.blocks:
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)

    @property
    def k(self) -> int:
        return len(self.blocks)

    @property
    def hidden(self) -> int:
        return self.blocks[0].in_features

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) hidden states -> (K, ..., H) head states, in the heads' float type."""
        h = h.to(self.blocks[0].weight.dtype)
        return torch.stack([h + F.silu(b(h)) for b in self.blocks])


def head_logits(heads: Heads, lm_head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """(..., H) -> (K, ..., V) float logits through the shared LM head, in one call
    (the LM head's weights are read once for all K heads)."""
    z = heads(h)
    dtype = h.dtype if h.is_floating_point() else z.dtype  # what the LM head reads in the target
    return lm_head(z.to(dtype)).float()


# ------------------------------------------------------------------ where trained heads live
# Where trained heads live: cache_root()/heads/<key>/heads.pt + report.json.
# 
# The key is the target's identity (pair name, model id or folder, layers,
# hidden size, vocabulary), not its precision or the machine: heads trained once
# serve the bf16, fp32 and int8 target alike, and the hidden-state cache of the
# corpus (data.py) sits in the same folder.

VERSION = 1


def train_command(pair) -> str:
    """The command that trains heads for this pair (shown when none are cached)."""
    name, target = pair.spec.name, pair.spec.target
    if name == "default":
        args = ""
    elif name == "custom" or not name:
        args = f" --target {target} --draft {pair.spec.draft or ''}"
    else:
        args = f" --pair {name}"
    return f"python -m specviz heads train{args}"


def save(pair, heads: Heads, report: dict) -> Path:
    d = heads_dir(pair)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "heads.pt.tmp"
    torch.save({"k": heads.k, "hidden": heads.hidden, "state": heads.state_dict(),
                "version": VERSION}, tmp)
    tmp.replace(d / "heads.pt")
    (d / "report.json").write_text(json.dumps(report, indent=1))
    return d / "heads.pt"


def _missing(pair, why: str) -> RequestError:
    return RequestError(f"{why} Train them once (progress bars show; about an hour on a 2-core CPU) "
                        f"with: {_pass_command(pair, 'medusa')}")


def _pass_command(pair, kind: str) -> str:
    """The two commands that train `kind` (eagle, medusa) for this pair on its own feature pass."""
    args = train_command(pair).split("heads train", 1)[1]
    return f"python -m specviz heads data{args} && python -m specviz heads {kind}{args}"


_LOADED: dict[tuple, Heads] = {}  # a run builds its proposer on every request: read the file once


def load(pair) -> Heads:
    """The shipped or cached heads of this pair's target (engine/trained/store.py), or one RequestError with
    the train command. Heads trained on the feature pass carry `keep`: their kept token ids."""
    from ..trained import store
    path = store.find(pair, "medusa") or heads_dir(pair) / "heads.pt"
    if not path.is_file():
        raise _missing(pair, "No trained multi-token heads are cached for this target.")
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)  # a retrained file is read again
    if key not in _LOADED:
        _LOADED[key] = _read(pair, path)
    return _LOADED[key]


def _read(pair, path: Path) -> Heads:
    from ..trained.store import require
    require(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        heads = Heads(int(blob["hidden"]), int(blob["k"]))
        heads.load_state_dict({n: t.float() for n, t in blob["state"].items()})
        heads.keep = blob["keep"].long() if blob.get("keep") is not None else None
    except Exception as e:  # noqa: BLE001 - zip, pickle, key or shape errors alike: the file is bad
        raise _missing(pair, f"The cached heads file {str(path)!r} cannot be read ({type(e).__name__}).") \
            from None
    if heads.hidden != target_dims(pair.target)[1]:
        raise _missing(pair, f"The cached heads file {str(path)!r} does not fit this target.")
    return heads.eval().requires_grad_(False)


def report(pair) -> dict | None:
    path = heads_dir(pair) / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ the proposer
def final_norm(model):
    body = getattr(model, "model", None)
    return getattr(body, "norm", None)


@dataclass
class HeadsProposer(Proposer):
    reads_target_cache = True
    supplies_verify_logits = True

    model: torch.nn.Module
    heads: torch.nn.Module  # Heads, above
    vocab_size: int
    name: str = "heads"
    cache: object = field(default=None, repr=False)
    h: torch.Tensor | None = field(default=None, repr=False)  # state at the last committed position - 1
    rows: torch.Tensor | None = field(default=None, repr=False)  # states of the last verify's kept rows
    lm: torch.nn.Module | None = None  # eagle.KeptHead over the heads' kept tokens, or the target's LM head

    def reset(self, prompt_ids):
        self.h = self.rows = None
        return 0

    def attach_target_cache(self, cache) -> None:
        self.cache = cache
        if getattr(cache, "compiled", None) is not None:
            cache.compiled = None  # a compiled graph would not run the norm hook: verify eagerly

    def propose(self, committed, gamma, params, generator, eos_ids):
        if self.h is None or gamma < 1:  # round 1: no state yet, the prompt's forward makes one
            return Proposal([], torch.zeros(0, self.vocab_size), forwards=0,
                            info={"heads": self.heads.k, "head_ms": 0.0})
        t0 = time.perf_counter()
        k = min(gamma, self.heads.k)
        if self.lm is not None:  # the kept tokens' rows of the LM head (heads trained on the pass)
            logits = self.lm(self.heads(self.h[None])[:k, 0].float())
        else:
            logits = head_logits(self.heads, self.model.get_output_embeddings(), self.h[None])[:k, 0]
        qs = warp(logits[:, : self.vocab_size], params)
        tokens = []
        for q in qs:
            tokens.append(pick(q, params, generator))
            if tokens[-1] in eos_ids:  # nothing useful follows an end-of-sequence
                break
        info = {"heads": self.heads.k, "head_ms": round((time.perf_counter() - t0) * 1e3, 3)}
        return Proposal(tokens, qs[: len(tokens)], forwards=0, info=info)

    def verify_logits(self, fed, tokens, keep):
        """The engine's verify forward, keeping the post-norm hidden states of its last `keep` rows."""
        box = []
        handle = final_norm(self.model).register_forward_hook(lambda m, i, out: box.append(out))
        try:
            logits = forward_logits(self.model, fed + tokens, self.cache, keep)
        finally:
            handle.remove()
        self.rows = box[-1][0, -keep:] if box else None
        return logits

    def rollback(self, committed, n_accepted, n_drafted):
        # the last accepted position's state predicted the appended token; the heads read it next
        self.h = self.rows[n_accepted] if self.rows is not None else None
        self.rows = None


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: where the heads' guesses rarely pass (each head guesses further ahead "
    "than the one before it): long chains then pay verify rows for tokens that fail.")


@register("heads", "Medusa heads", order=22, loses_when=LOSES,
          note="K trained heads on the target's last hidden state; "
          "shipped for the default pair (trained on its own features: python -m specviz heads data && "
          "python -m specviz heads medusa). γ above K proposes K tokens.",
          description="K trained heads on the target's last hidden state propose the next K tokens")
def _build_heads(pair, req=None):
    if final_norm(pair.target) is None:
        raise RequestError("Medusa heads need a decoder with a final norm (model.norm); this target "
                           "has another layout.")
    heads = load(pair)
    return HeadsProposer(pair.target, heads.to(pair.target.device), target_vocab(pair.target),
                         lm=kept_head(pair, heads))


_KEPT: dict = {}  # (target id, heads id) -> the kept LM head: built once per load


def kept_head(pair, heads):
    """The LM head over the heads' kept tokens (eagle.KeptHead: 4-bit codes beside a w4a8 target, as
    EAGLE's: KEPT_LOWBIT), or None for heads that read the whole vocabulary."""
    keep = getattr(heads, "keep", None)
    if keep is None:
        return None
    from ..trained.eagle_head import KEPT_LOWBIT, KeptHead, head_weight, lowbit_for
    key = (id(pair.target), id(heads))
    if key not in _KEPT:
        _KEPT.clear()
        low = lowbit_for(pair.target)
        _KEPT[key] = KeptHead(head_weight(pair.target.get_output_embeddings()), keep,
                              target_vocab(pair.target), KEPT_LOWBIT if low else None).to(pair.target.device)
    return _KEPT[key]
