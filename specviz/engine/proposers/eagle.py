"""EAGLE: a trained one-layer head on the target's own features drafts a chain (engine/eagle_head.py
is the head; specviz/heads/ trains it; assets/drafts/ ships the default target's).

No second model: the target's post-norm states come from the verify forward the engine runs anyway
(a hook on its final norm, as Medusa's heads). Round 1 drafts nothing: the prompt's forward gives the
states of every prompt row. Each later round the head first reads the rows the last verify
confirmed, (f_t, e(x_{t+1})) for every position t whose next token is now committed, in one forward
into its own KV cache; its last row predicts the state that gives the first draft. Each further draft
feeds the head's own predicted state back (EAGLE's autoregression at the feature level). The rows
written from predicted states are dropped at the next round, when the verify's true states arrive.

A published head can stand in for ours (option eagle_head: a folder or Hub id; trained/public_heads.py):
EAGLE-1/2's reads the same post-norm states; EAGLE-3's reads the inputs of three of the target's layers,
hooked the same way, and its own draft vocabulary (q 0 outside it). Our head with fused taps (cfg "taps";
tried 2026-11-30, not shipped) reads two layers' inputs beside f_t on the CPU paths (the lean stack copies
them: cpu/lean_forward.tapping); on the graph path it drafts from f_t alone, as its later drafts do.

Lossless: q is the head's softmax over the kept tokens after the request's warp (0 elsewhere), each
draft drawn from it; the engine's modified rejection sampling keeps the target's law, and greedy
drafts are argmax chains, so the output is plain greedy's.
Cost per draft: the head's layer plus the restricted LM head (32,768 of 151,936 rows): about 1/16 of
the 1.5B target's bytes in w4a8."""
from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from ...errors import RequestError
from ..forward import forward_logits, pick
from ..proposer import TEXT, Option, Proposal, Proposer, check_options, register, target_vocab
from ..sampling import greedy_rows, warp
from ..trained import public_heads
from ..trained.eagle_head import KV, on_target, unpack
from .heads import final_norm


@dataclass
class Drafter:
    """A loaded head for one target: the layer, the kept LM head, the target's embedding."""

    head: nn.Module
    lm: nn.Module  # h -> logits over the target's vocabulary: KeptHead, or a public head's (public_heads)
    embed: nn.Module
    step_s: float | None = None  # one draft step (the layer over one row + the kept LM head), timed at load
    taps: tuple[int, ...] | None = None  # EAGLE-3: the target layers whose inputs it reads; None: final norm
    statics: list = field(default_factory=list, repr=False)  # graph-path heads not in use (gpu/head.py)
    fused: tuple[int, ...] | None = None  # our head's FusedTaps: the target layers whose inputs it adds

    def take_static(self, capacity: int, graphs: bool):
        """A StaticHead of at least `capacity` rows for one run (captured once, then pooled: give_static)."""
        from ..gpu.head import StaticHead
        for i, st in enumerate(self.statics):
            if st.capacity >= capacity and st.use_graphs == graphs:
                return self.statics.pop(i)
        return StaticHead(self, capacity, graphs=graphs, widths=self.widths())

    def give_static(self, st) -> None:
        st.reset()
        self.statics.append(st)

    def widths(self) -> tuple[int, ...]:
        """The states' widths the head reads: the target's (EAGLE-3: three layers joined), then its own."""
        h = int(self.embed.embedding_dim)
        return (h,) if self.taps is None else (h * len(self.taps), int(self.head.cfg["hidden"]))

    @torch.inference_mode()
    def time_step(self, dev, rows: int = 64, tries: int = 7) -> float:
        """The median seconds of one draft step after `rows` cached rows: what γ = auto prices."""
        h = self.head.cfg["hidden"]
        kv = KV()
        self.head(torch.zeros(1, rows, h, device=dev), torch.zeros(1, rows, h, device=dev),
                  torch.arange(rows, device=dev), kv)
        times = []
        for i in range(tries):
            t0 = time.perf_counter()
            f = self.head(torch.zeros(1, 1, h, device=dev), torch.zeros(1, 1, h, device=dev),
                          torch.tensor([rows + i], device=dev), kv)
            self.lm(f[0])
            times.append(time.perf_counter() - t0)
        return sorted(times)[tries // 2]


_LOADED: dict = {}  # (target id, file, mtime) -> Drafter: the head's packing runs once per target


def load_drafter(pair) -> Drafter:
    from ..trained import store
    path = store.find(pair, "eagle")
    if path is None:
        raise RequestError("No trained EAGLE head is shipped or cached for this target. Train one with: "
                           f"{train_command(pair)}")
    st = path.stat()
    key = (id(pair.target), str(path), st.st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _read(pair, path)
    return _LOADED[key]


def _read(pair, path) -> Drafter:
    from ..trained.store import require
    target = pair.target
    require(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        head, keep = unpack(blob)
    except Exception as e:  # noqa: BLE001 - zip, pickle, key or shape errors alike: the file is bad
        raise RequestError(f"The EAGLE head file {str(path)!r} cannot be read ({type(e).__name__}: {e}).") \
            from None
    if head.cfg["hidden"] != target.config.hidden_size:
        raise RequestError(f"The EAGLE head file {str(path)!r} was trained for another target.")
    fused = tuple(head.cfg.get("taps") or ()) or None
    if fused and max(fused) >= target.config.num_hidden_layers:
        raise RequestError(f"The EAGLE head file {str(path)!r} reads layers {list(fused)} the target lacks.")
    head, lm = on_target(head, keep, target, target_vocab(target))
    return _timed(Drafter(head, lm, target.get_input_embeddings(), fused=fused), target)


def _timed(d: Drafter, target) -> Drafter:
    """d with its step timed as runs will take it: on the graph path (a target on captured graphs) its
    own graphs, captured now, at load, and pooled for the first run; else eagerly."""
    from ..backends.graphs import CAPACITY
    from ..forward import cache_kind
    dev = target.device
    if dev.type == "cuda" and cache_kind(target)[0] == "graphs":
        st = d.take_static(CAPACITY, graphs=True)
        d.step_s = st.time_step()
        d.give_static(st)
    else:
        d.step_s = d.time_step(dev)
    return d


_PUBLIC: dict = {}  # (target id, folder) -> Drafter: a named public head, loaded once per target


def load_public(pair, name: str) -> Drafter:
    """A published EAGLE-1/2/3 head (engine/trained/public_heads.py) from a folder or Hub id, for this
    target; RequestError in the visitor's words if it cannot be found, read or does not fit."""
    target = pair.target
    folder = public_heads.resolve(name)
    stamps = tuple((folder / f).stat().st_mtime_ns for f in public_heads.FILES if (folder / f).is_file())
    key = (id(target), str(folder.resolve()), stamps)  # a folder written anew is read anew
    if key not in _PUBLIC:
        _PUBLIC.clear()
        head, lm, taps = public_heads.build(name, folder, target)
        _PUBLIC[key] = _timed(Drafter(head, lm, target.get_input_embeddings(), taps=taps), target)
    return _PUBLIC[key]


def head_cost(pair, req=None) -> float | None:
    """c of the EAGLE head the request names (else the shipped or trained one): its draft step over the
    target's plain step, both measured here (the head's at load, the target's at calibration); None
    where either is missing."""
    costs = getattr(pair, "costs", None)
    try:
        step = drafter_for(pair, (getattr(req, "options", None) or {}).get("eagle_head")).step_s
    except RequestError:
        return None
    return step / costs.plain_step_s if costs is not None and step else None


def drafter_for(pair, name) -> Drafter:
    """The published head `name` names (a folder or Hub id), else the target's shipped or trained one."""
    name = name.strip() if isinstance(name, str) else ""
    return load_public(pair, name) if name else load_drafter(pair)


def train_command(pair) -> str:
    from .heads import _pass_command
    return _pass_command(pair, "eagle")


def _check_head(value) -> str:
    if not isinstance(value, str):
        raise RequestError("The EAGLE head must be a folder or a Hub id (owner/name).")
    return value.strip()


# The chain stops once the product of its drafts' probabilities under the head (EAGLE-2's node value:
# a draft's confidence tracks its acceptance) falls below this share: a further draft would be verified
# for a small chance of being kept, each verified token costing a share of a plain step (v(k)'s slope).
# Bench, 2-core Zen 4, 2026-11-29 (docs/trained_drafts.md): γ 5 went from 0.82x to 1.09x plain on code
# and from 0.85x to 1.12x on chat with the stop at 30 %; γ 1 (1.15x, 1.23x) stays the best.
STOP_PCT = 30
OPTIONS = (
    Option("confidence", "Stop below confidence (%)", "The chain stops drafting once the product of its "
           "drafts' probabilities under the head falls below this percentage (0: always γ drafts). "
           f"Default {STOP_PCT}.", lo=0, hi=100, default=STOP_PCT, keep=True, page=False),
    # CLI and API only, as rest's datastore: a page visitor must not make the server fetch any Hub repo
    Option("eagle_head", "EAGLE head", "a published EAGLE-1/2/3 head for this target: a local folder or "
           "a Hub id such as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (default: the head shipped or trained here)",
           type=TEXT, parse=_check_head, page=False),
)


@dataclass
class EagleProposer(Proposer):
    reads_target_cache = True
    supplies_verify_logits = True
    reads_graph_cache = True  # on a graph cache the states come from the cache (attach_target_cache)

    model: nn.Module  # the target
    drafter: Drafter
    name: str = "eagle"
    cache: object = field(default=None, repr=False)  # the target's cache (attach_target_cache)
    kv: KV = field(default_factory=KV, repr=False)  # the head's own cache
    static: object = field(default=None, repr=False)  # the graph path's head (gpu/head.StaticHead), or None
    true_rows: int = 0  # rows of kv read from the target's states (the rest: from predicted ones)
    pend: torch.Tensor | None = field(default=None, repr=False)  # confirmed states not yet read
    pend_at: int = 0  # the position of pend's first row
    rows: tuple | None = field(default=None, repr=False)  # the last verify's states and first position
    stop_below: float = STOP_PCT / 100  # the chain's confidence under which it stops (OPTIONS)

    def reset(self, prompt_ids):
        self.kv, self.true_rows, self.pend, self.rows = KV(), 0, None, None
        if self.static is not None:
            self.static.reset()
        return 0

    def attach_target_cache(self, cache) -> None:
        self.cache = cache
        if getattr(cache, "compiled", None) is not None:
            cache.compiled = None  # a compiled graph would not run the norm hook: verify eagerly
        if hasattr(cache, "states") and self.static is None:
            # the graph path (gpu/cache.GraphCache): no hook fires inside a replayed graph, so the target's
            # states come from the cache, and the head runs over its own fixed buffers (gpu/head.py)
            sm = cache.static
            self.static = self.drafter.take_static(sm.max_len, sm.use_graphs)
            weakref.finalize(self, self.drafter.give_static, self.static)
            self.kv = self.static.kv

    def _step(self, ids: list[int], feats: torch.Tensor, at: int) -> torch.Tensor:
        """The head over rows at positions at.. (token ids x_{t+1}, states f_t): the last row's output."""
        return self._rows(ids, feats, list(range(at, at + len(ids))))[-1]

    def _draft_step(self, ids: list[int], feats: torch.Tensor, at: int) -> tuple[torch.Tensor, torch.Tensor]:
        """_step and the kept LM head over its output -> (the last row's state (H,), its logits (V,));
        on the graph path one replay of the head's graph, which ends in the LM head."""
        if self.static is None:
            f = self._step(ids, feats, at)
            return f, self.drafter.lm(f[None])[0]
        f, logits = self.static.run(ids, feats, list(range(at, at + len(ids))))
        return f[-1], logits[-1]

    def _rows(self, ids: list[int], feats: torch.Tensor, pos: list[int], mask=None) -> torch.Tensor:
        """The head over rows (token ids x_{t+1}, states f_t (n, H)) at positions pos, into its KV
        (causal, or as mask says): every row's predicted next state (n, H)."""
        d = self.drafter
        dev = feats.device
        e = d.embed(torch.tensor([ids], device=dev))
        dtype = e.dtype if e.is_floating_point() else torch.float32
        return d.head(e.to(dtype), feats[None].to(dtype), torch.tensor(pos, device=dev), self.kv, mask)[0]

    def propose(self, committed, gamma, params, generator, eos_ids):
        if self.pend is None or gamma < 1:  # round 1: no states yet, the prompt's forward makes them
            return Proposal([], torch.zeros(0, target_vocab(self.model)), info={"head_ms": 0.0})
        t0 = time.perf_counter()
        self.kv.crop(self.true_rows)
        m = len(self.pend)
        ids = committed[self.pend_at + 1: self.pend_at + m + 1]
        f, logits = self._draft_step(ids, self.pend, self.pend_at)
        self.true_rows += m
        at, self.pend = self.pend_at + m, None
        tokens, qs, raw = [], [], []
        sure = 1.0  # the chain's confidence: the product of its drafts' probabilities under the head
        while True:
            if params.greedy:
                q, x = greedy_rows(logits)
                raw.append(logits)
                # the token and its probability in one read (one device sync a draft on a GPU)
                x, px = torch.stack([x.float(), torch.softmax(logits.float(), -1)[x]]).tolist()
                x = int(x)
                sure *= px
            else:
                q = warp(logits, params)
                x = pick(q, params, generator)
                sure *= float(q[x])
            tokens.append(x)
            qs.append(q)
            if len(tokens) >= gamma or x in eos_ids or sure < self.stop_below:
                break
            f, logits = self._draft_step([x], f[None], at)
            at += 1
        info = {"head_ms": round((time.perf_counter() - t0) * 1e3, 3), "stopped_short": len(tokens) < gamma}
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens), info=info,
                        raw=raw if params.greedy else None)

    def verify_logits(self, fed, tokens, keep):
        """The engine's verify forward, keeping the states the head reads (_hooks) of every row it read."""
        start = self.cache.get_seq_length()
        if self.static is not None:  # the graph path: the cache kept the last forward's states
            logits = forward_logits(self.model, fed + tokens, self.cache, keep)
            h = self.cache.states(self.drafter.taps)
        else:
            with self.states() as boxes:
                logits = forward_logits(self.model, fed + tokens, self.cache, keep)
            if not all(boxes):
                if self.drafter.taps is not None or not boxes[0]:
                    return logits
                boxes = boxes[:1]  # fused taps not read (a path that neither hooks nor taps): f_t alone
            if self.drafter.fused and len({box[-1].shape[-2] for box in boxes}) > 1:  # no output layer read
                boxes = boxes[:1]
            h = torch.cat([box[-1][0] for box in boxes], -1)
        # a prompt read in two parts: the states are of its last part only
        self.rows = (h, start + len(fed) + len(tokens) - h.shape[0], start + len(fed) - 1)
        return logits

    @contextlib.contextmanager
    def states(self):
        """While a target forward runs: the states the head reads (_hooks), one list of outputs per tap."""
        boxes, handles = self._hooks()
        d = self.drafter
        try:
            if d.fused or d.taps:  # the lean forward fills the same lists as the layers' pre-hooks
                from ..cpu.lean_forward import tapping
                with tapping(self.model, d.fused or d.taps, boxes[1:] if d.fused else boxes):
                    yield boxes
            else:
                yield boxes
        finally:
            for handle in handles:
                handle.remove()

    def _hooks(self):
        """EAGLE-1/2: the final norm's output (post-norm states); our head with fused taps, then the inputs
        of those layers too. EAGLE-3: the inputs of its tapped decoder layers (a tap past the last
        layer: the final norm's input), in layer order."""
        layers = self.model.model.layers if self.drafter.fused or self.drafter.taps else None
        if self.drafter.taps is None:
            box = []
            boxes = [box] + [[] for _ in self.drafter.fused or ()]
            handles = [final_norm(self.model).register_forward_hook(lambda m, i, out: box.append(out))]
            # the module path (model(...)) calls the layers: their pre-hooks fill the taps' lists;
            # the lean path does not call them, and fills them itself (states(): tapping)
            handles += [layers[i].register_forward_pre_hook(
                lambda m, args, kw, b=b: b.append(args[0] if args else kw["hidden_states"]), with_kwargs=True)
                for i, b in zip(self.drafter.fused or (), boxes[1:], strict=True)]
            return boxes, handles
        boxes = [[] for _ in self.drafter.taps]
        handles = [(layers[i] if i < len(layers) else final_norm(self.model)).register_forward_pre_hook(
            lambda m, args, kw, box=box: box.append(args[0] if args else kw["hidden_states"]),
            with_kwargs=True) for i, box in zip(self.drafter.taps, boxes, strict=True)]
        # The lean forward (backends lean.py, static.py: cpu/lean_forward.run) runs the layers' parts or
        # one C call, never the layer modules, so their hooks do not fire there: it fills the same lists
        # itself (states(): tapping; test_eagle3_drafts_on_the_lean_forward)
        return boxes, handles

    def rollback(self, committed, n_accepted, n_drafted):
        # confirmed: the rows up to the last fed token's plus the accepted drafts'; each one's next
        # token is committed now. The head reads them at the next propose.
        if self.rows is None:
            return
        h, first, last_fed = self.rows
        end = last_fed + n_accepted + 1 - first
        self.pend, self.pend_at, self.rows = (h[:end], first, None) if end > 0 else (None, 0, None)


def _summary(infos: list[dict]) -> dict:
    ms = [i.get("head_ms", 0.0) for i in infos]
    short = sum(1 for i in infos if i.get("stopped_short"))
    return {"head_ms": round(sum(ms), 1), "rounds_stopped_short": short} if ms else {}


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: where its head's drafts rarely pass (text unlike the little it was "
    "trained on): each round still pays the head's step and the verify pass.")


@register("eagle", "EAGLE head", loses_when=LOSES, order=21, summarize=_summary, cost=head_cost,
          options=OPTIONS,
          note="A one-layer head trained on this target's own features drafts from the target's last "
               f"hidden state, and stops its chain once its confidence falls below {STOP_PCT} %.",
          description="EAGLE: a trained one-layer head reads the target's own last hidden state and "
                      "drafts a chain (lossless: the target verifies every token)")
def _build_eagle(pair, req=None):
    drafter, options = request_drafter(pair, req, OPTIONS)
    return EagleProposer(pair.target, drafter, stop_below=options["confidence"] / 100)


def request_drafter(pair, req, options_spec) -> tuple[Drafter, dict]:
    """(the head a request names, or the target's own; its checked options), for eagle and eagle-tree."""
    if final_norm(pair.target) is None:
        raise RequestError("EAGLE needs a decoder with a final norm (model.norm); this target has "
                           "another layout.")
    options = check_options(options_spec, dict(getattr(req, "options", None) or {}))
    return drafter_for(pair, options.get("eagle_head")), options
