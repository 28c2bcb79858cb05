"""Early exit (training-free LayerSkip): the target's first L layers, then its
own final norm and LM head, draft γ tokens; the full target verifies them.

The draft is an ordinary q-draft (q = the warped early-exit distribution), so
the standard verification keeps greedy output identical to plain decoding and
the target's law under sampling. No second model: `--draft` is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ...errors import RequestError
from ..cpu.rowwise_attention import is_rowwise
from ..forward import crop_cache, pick
from ..layers import decoder_parts, drop_last, embed, layers_forward, logits_of, n_layers, run_layers
from ..proposer import FLAG, Option, Proposal, Proposer, check_options, register, target_vocab
from ..sampling import warp


@dataclass
class LayerSubsetProposer(Proposer):
    """Drafts autoregressively with a subset of the target's own layers, with its
    own KV cache (slots of unused layers stay empty)."""

    model: torch.nn.Module
    layers: tuple[int, ...]
    vocab_size: int | None = None
    name: str = "early-exit"
    cache: DynamicCache | None = field(default=None, repr=False)
    seen: int = 0  # positions in the cache (layer 0 may be skipped: count ourselves)
    exit_head: torch.nn.Module | None = field(default=None, repr=False)  # a trained exit (TrainedExit)

    def reset(self, prompt_ids):
        self.cache, self.seen = DynamicCache(), 0
        # the last prompt token is fed with the first propose() call
        if len(prompt_ids) > 1:
            self._logits(prompt_ids[:-1])
            return 1
        return 0

    def _logits(self, ids):
        if self.exit_head is not None:
            h = run_layers(self.model, embed(self.model, ids), self.cache, self.layers, start=self.seen)
            logits = self.exit_head(h[0, -1:])
        else:
            logits = layers_forward(self.model, ids, self.cache, self.layers, start=self.seen, keep=1)
        self.seen += len(ids)
        return logits[..., : self.vocab_size] if self.vocab_size else logits

    def propose(self, committed, gamma, params, generator, eos_ids):
        feed = committed[self.seen:]  # 1 token, or 2 after a bonus round
        tokens, qs = [], []
        for _ in range(gamma):
            q = warp(self._logits(feed)[-1], params)
            x = pick(q, params, generator)
            tokens.append(x)
            qs.append(q)
            if x in eos_ids:  # nothing useful follows an end-of-sequence
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens))

    def rollback(self, committed, n_accepted, n_drafted):
        # keep what is still committed, leaving the last committed token to be fed next round
        extra = self.seen - (len(committed) - 1)
        if extra > 0:
            drop_last(self.cache, extra)
            self.seen -= extra


@dataclass
class SharedCacheExitProposer(Proposer):
    """Early exit that drafts inside the target's own KV cache: layers < L of the
    drafted positions are exactly what the full target computes there, so the
    verify pass runs layers < L only for the last (undrafted) token and layers
    >= L for all of them, from the hidden states the draft kept. The engine
    lends its cache (attach_target_cache) and calls verify_logits."""

    reads_target_cache = True
    supplies_verify_logits = True

    model: torch.nn.Module
    exit_layer: int
    vocab_size: int | None = None
    name: str = "early-exit"
    cache: DynamicCache | None = field(default=None, repr=False)
    hidden: list = field(default_factory=list, repr=False)  # layer-L states of fed positions
    start: int = 0  # position of the first state in `hidden`
    seen: int = 0  # positions whose layers < L are in the cache
    owned: bool = True  # no engine lent its cache: draft in our own (no reuse)
    exit_head: torch.nn.Module | None = field(default=None, repr=False)  # a trained exit (TrainedExit)

    def reset(self, prompt_ids):
        self.cache, self.seen, self.hidden, self.owned = DynamicCache(), 0, [], True
        return 0

    def attach_target_cache(self, cache) -> None:
        self.cache, self.seen, self.hidden, self.owned = cache, 0, [], False

    def _low(self, ids):
        if not self.hidden:
            self.start = self.seen
        h = run_layers(self.model, embed(self.model, ids), self.cache, range(self.exit_layer),
                       start=self.seen)
        self.seen += len(ids)
        self.hidden.append(h)
        return h

    def propose(self, committed, gamma, params, generator, eos_ids):
        feed = committed[self.seen:]  # the prompt in round 1, then the last committed token
        tokens, qs = [], []
        for _ in range(gamma):
            h = self._low(feed)
            head = self.exit_head
            logits = head(h[0, -1:])[-1] if head is not None else logits_of(self.model, h, 1)[-1]
            q = warp(logits[: self.vocab_size] if self.vocab_size else logits, params)
            x = pick(q, params, generator)
            tokens.append(x)
            qs.append(q)
            if x in eos_ids:
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens))

    def verify_logits(self, fed, tokens, keep):
        """Target logits of the last `keep` of fed + tokens, reusing the draft's layers < L."""
        seq = fed + tokens
        done = self.seen - self.start  # positions of seq the draft already ran
        if done < len(seq):
            self._low(seq[done:])
        h = run_layers(self.model, torch.cat(self.hidden, dim=1), self.cache,
                       range(self.exit_layer, n_layers(self.model)), start=self.start)
        self.hidden = []
        return logits_of(self.model, h, keep)

    def rollback(self, committed, n_accepted, n_drafted):
        self.seen, self.hidden = len(committed) - 1, []  # the engine cropped a shared cache
        if self.owned:
            crop_cache(self.cache, self.seen)


OPTIONS = (
    Option("exit_layer", "Exit layer L", "Draft with the target's first L layers (1 up to the target's layer "
           "count). Blank (default): the trained exit's layer where one is shipped for this target, else the "
           "calibrated layer, measured once per pair and cached.", short="L"),
    Option("trained", "Trained exit", "Draft through the exit trained for this target (an adapter from "
           "layer L's state to the last layer's, `python -m specviz heads exit`) where one is shipped or "
           "cached and L is its layer. Off: the target's own final norm and LM head read layer L "
           "(training-free).",
           type=FLAG, default=True, keep=True),
    # on: the draft's layers share the target's KV cache (SharedCacheExitProposer); bench and tests only
    Option("kv_reuse", "kv_reuse", "reuse the target's KV cache for the exit layers", type=FLAG,
           default=True, keep=True, page=False, cli=False),
)


def check_exit_options(options: dict) -> dict:
    return check_options(OPTIONS, options)


def exit_layers(model, exit_layer: int) -> tuple[int, ...]:
    n = n_layers(model)
    if not 1 <= exit_layer <= n:
        raise RequestError(f"Exit layer {exit_layer} is out of range: this target has {n} layers "
                           f"(use 1..{n}; fewer layers draft faster but are accepted less).")
    return tuple(range(exit_layer))


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: untrained (Trained exit unticked, or a target with no trained exit), layer L is "
    "read as if it were the last, and its drafts rarely pass; trained, more pass, but each draft still runs "
    "L of the target's layers and each round a verify pass, and long chains lose (accept less further on).")


@register("early-exit", "early exit (self)", loses_when=LOSES, order=20, options=OPTIONS,
          description="the target's first L layers + its own LM head draft (training-free LayerSkip)")
def _build_early_exit(pair, req=None):
    decoder_parts(pair.target)
    options = check_exit_options(dict(getattr(req, "options", None) or {}))
    exit_layer = options.get("exit_layer")
    if exit_layer is None:  # calibration/selfspec.resolve_options chooses it above the engine (run/runner.py)
        raise RequestError("early-exit needs an exit layer: set exit_layer, or run it through "
                           "specviz.run.runner, which calibrates one for this pair.")
    layers, vocab = exit_layers(pair.target, exit_layer), target_vocab(pair.target)
    trained = load_trained_exit(pair) if options["trained"] else None
    head = trained if trained is not None and trained.layer == exit_layer else None
    # a row-exact target (w8a8) gets its own draft cache: sharing the target's cache makes the upper
    # layers read the prompt and drafts in one call, in another shape than plain's prefill, which
    # flipped 7-bit codes (default pair, 64-token prompts, exit layer 8: greedy differed at γ 2)
    if options["kv_reuse"] and not is_rowwise(pair.target):
        return SharedCacheExitProposer(pair.target, len(layers), vocab_size=vocab, exit_head=head)
    return LayerSubsetProposer(pair.target, layers, vocab_size=vocab, name="early-exit", exit_head=head)


_LOADED: dict = {}  # (target id, file, mtime) -> TrainedExit: read and packed once per target


def load_trained_exit(pair):
    """The trained exit shipped or cached for this target (TrainedExit: its layer, adapter and kept LM
    head, in the target's low-bit family where it has one), or None where there is none; a file that
    cannot be read or was trained for another target is one RequestError line."""
    from ..trained import store
    path = store.find(pair, "exit")
    if path is None:
        return None
    key = (id(pair.target), str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _read_exit(pair, path)
    return _LOADED[key]


def _read_exit(pair, path):
    from ..trained.eagle_head import on_target
    from ..trained.exit_head import TrainedExit, unpack_exit
    from ..trained.store import require
    require(path)
    target = pair.target
    try:
        adapter, keep = unpack_exit(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as e:  # noqa: BLE001 - zip, pickle, key or shape errors alike: the file is bad
        raise RequestError(f"The trained exit file {str(path)!r} cannot be read ({type(e).__name__}: {e}).") \
            from None
    layer = adapter.cfg["layer"]
    if adapter.cfg["hidden"] != target.config.hidden_size or not 1 <= layer <= n_layers(target):
        raise RequestError(f"The trained exit file {str(path)!r} was trained for another target.")
    adapter, lm = on_target(adapter, keep, target, target_vocab(target))
    return TrainedExit(adapter, lm).eval()
