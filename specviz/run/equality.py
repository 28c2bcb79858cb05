"""Greedy equality, honestly: speculative output must equal plain output, but in
bf16 a verify forward of k+1 tokens is not bit-identical to k+1 single steps
(other kernel blocking), so at an exact or near tie the argmax may flip.

compare_greedy() finds the first differing position and judges it from both
runs' own rows there (TokenEvent.gap is a sampling.Gap: the top-2 gap, the two
tokens and the top logit). It is a near-tie only when all of these hold:
1. each run's token is the top of its own row (a run that emits anything else,
   e.g. accepts the target's runner-up, is wrong whatever the numbers say);
2. both gaps are within the threshold: FACTOR × eps(dtype) × max(1, |top logit|);
3. the two tokens are each other's runner-up (a swap of the top two), or, when
   the caller can recompute the position in fp32, the fp32 row decides:
4. (with a recompute callback, low-precision targets) the target's fp32 logits
   at that position agree with both runs' recorded top-2 logits within the
   threshold, and both tokens lie within the threshold of the fp32 top. A run
   whose rows were computed wrongly (a stale cache entry, a missing scaling)
   fails here even when its flip happened to land on a near-tie.
Anything else is a mismatch, i.e. a bug.

A near-tie clears only the position where the runs part; after it each run goes
on from its own prefix, and a bug that acts later would hide behind the excused
flip (seen 2026-11-24 on an AVX-512-bf16 EPYC with native bf16: an injected
runner-up acceptance was called a near-tie once in four prompts). So after a
near-tie the speculative continuation is judged on its own:
5. every later token must be the top of its own recorded row (both runs);
6. (with a recompute) every later speculative token must lie within the
   threshold of the fp32 top on its own prefix, and its recorded top-2 logits
   must agree with that fp32 row within the threshold.

FACTOR, measured 2026-11-23 in units of eps × max(1, |top logit|) (bf16 eps
2^-7, fp16 2^-10) on random tiny Qwen2 models (vocab 96 / 3 layers, 151,936 / 2,
96 / 8, 1000 / 24; 6 prompts × 32 positions each): verify rows (5 tokens) vs
single steps drift at most 3.9 in a top-2 gap and 2.9 in one logit; bf16/fp16
rows vs the same weights upcast to fp32 at most 6.8 in one logit. FACTOR = 16
keeps a margin of 2 over the worst. (The default pair, 28 layers, is not
measured yet: if its honest flips exceed this, the CLI says "bug" with the
numbers, and FACTOR is the one constant to revisit.)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from ..engine.cpu import kernel_layer
from ..engine.events import RoundEvent, TokenEvent
from ..engine.sampling import Gap

FACTOR = 16
EPS = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -23}
LOW_PRECISION = (torch.bfloat16, torch.float16)


def near_tie_threshold(dtype: torch.dtype, top_logit: float = 1.0) -> float:
    """The largest logit difference rounding can explain at this magnitude, for logits computed in
    `dtype` (the target's float type: engine/pair.dtype_of reads one from a label)."""
    return FACTOR * EPS.get(dtype, EPS[torch.float32]) * max(1.0, abs(top_logit))


@dataclass
class Equality:
    verdict: str  # "identical" | "near-tie" | "mismatch"
    position: int | None = None  # first differing output position (0-based)
    base_token: int | None = None
    spec_token: int | None = None
    gap_base: float | None = None  # the target's top-2 logit gap there, in each run
    gap_spec: float | None = None
    threshold: float = 0.0
    reason: str = ""  # why it is (or is not) a near-tie

    @property
    def ok(self) -> bool:
        return self.verdict != "mismatch"

    @property
    def gap(self) -> float | None:
        gaps = [float(g) for g in (self.gap_base, self.gap_spec) if g is not None]
        return max(gaps) if gaps else None

    def message(self) -> str:
        if self.verdict == "identical":
            return "identical to plain decoding"
        where = f"first difference at token {self.position}"
        if self.gap is None:
            return f"DIFFERENT from plain decoding ({where}, no logit gap recorded): a bug"
        detail = (f"{where}, tokens {self.base_token} vs {self.spec_token}, target top-2 logit gap "
                  f"{self.gap:.3g} (near-tie threshold {self.threshold:.3g}); {self.reason}")
        if self.verdict == "near-tie":
            return f"differs from plain decoding at a numerical near-tie ({detail})"
        return f"DIFFERENT from plain decoding ({detail}): a bug, not rounding"


def output_tokens(events) -> list[TokenEvent]:
    """The output tokens of a run's events (plain TokenEvents or RoundEvents)."""
    out = []
    for ev in events:
        if isinstance(ev, RoundEvent):
            out += [t for t in ev.tokens if t.in_output]
        elif isinstance(ev, TokenEvent) and ev.in_output:
            out.append(ev)
    return out


Recompute = Callable[[list[int]], "torch.Tensor | None"]


def judge(pos: int, b: int, s: int, gb, gs, dtype: torch.dtype,
          fp32_row: Callable[[], "torch.Tensor | None"] | None = None) -> Equality:
    """A near-tie or a bug, at the first position where baseline token b and
    speculative token s differ; gb, gs: each run's Gap there; fp32_row(): the
    target's fp32 logits at that position, or None, asked for only when the
    records leave it open (see the module docstring)."""
    def verdict(v: str, reason: str, thr: float = 0.0) -> Equality:
        return Equality(v, pos, b, s, gb, gs, thr, reason)
    if not (isinstance(gb, Gap) and isinstance(gs, Gap)):
        return verdict("mismatch", "no record of which tokens the rows ranked top")
    if gb.top != b or gs.top != s:
        side = "plain" if gb.top != b else "speculative"
        return verdict("mismatch", f"the {side} run's token is not the top of its own logits")
    thr = near_tie_threshold(dtype, max(abs(gb.top_logit), abs(gs.top_logit)))
    if max(gb, gs) > thr:
        return verdict("mismatch", "a gap beyond rounding", thr)
    swapped = gb.second == s and gs.second == b
    row = fp32_row() if fp32_row is not None else None
    if row is None:
        return verdict("near-tie", "the top two swapped", thr) if swapped else \
            verdict("mismatch", "the tokens are not each other's runner-up", thr)
    return _fp32_decides(row.float(), b, s, gb, gs, thr, verdict)


def _fp32_off(row: torch.Tensor, gaps: list[Gap]) -> float:
    """How far the recorded top-2 logits of these rows lie from the fp32 row."""
    recorded = [(t, v) for g in gaps for t, v in ((g.top, g.top_logit), (g.second, g.top_logit - g))]
    return max(abs(float(row[t]) - v) for t, v in recorded)


def _fp32_decides(row: torch.Tensor, b, s, gb: Gap, gs: Gap, thr: float, verdict) -> Equality:
    """Both runs' recorded top-2 logits must match the fp32 row, and both tokens
    must lie within rounding of its top."""
    off = _fp32_off(row, [gb, gs])
    if off > thr:
        return verdict("mismatch", f"a run's logits differ from the fp32 recompute by {off:.3g}", thr)
    below = float(row.max()) - min(float(row[b]), float(row[s]))
    if below > thr:
        return verdict("mismatch", f"fp32 puts a token {below:.3g} below its top", thr)
    return verdict("near-tie", f"the fp32 recompute agrees (both within {below:.3g} of its top)", thr)


def _after_tie(tie: Equality, base: list[TokenEvent], spec: list[TokenEvent], dtype: torch.dtype,
               rows: torch.Tensor | None) -> Equality:
    """Rules 5 and 6: the tokens after an excused flip, each run on its own prefix."""
    def bug(j: int, side: str, reason: str, thr: float = 0.0) -> Equality:
        t = (spec if side == "speculative" else base)[j]
        b = base[j].token_id if j < len(base) else None
        s = spec[j].token_id if j < len(spec) else None
        return Equality("mismatch", j, b, s, base[j].gap if j < len(base) else None,
                        spec[j].gap if j < len(spec) else None, thr,
                        f"after a near-tie at token {tie.position}, the {side} run's token {j} "
                        f"({t.token_id}) {reason}")
    for side, run in (("plain", base), ("speculative", spec)):
        for j in range(tie.position + 1, len(run)):
            g = run[j].gap
            if isinstance(g, Gap) and g.top != run[j].token_id:
                return bug(j, side, "is not the top of its own logits")
    for j in range(tie.position + 1, len(spec) if rows is not None else 0):
        g, row = spec[j].gap, rows[j].float()
        thr = near_tie_threshold(dtype, float(row.max()))
        below = float(row.max()) - float(row[spec[j].token_id])
        if below > thr:
            return bug(j, "speculative", f"lies {below:.3g} below the fp32 top on its own prefix", thr)
        off = _fp32_off(row, [g]) if isinstance(g, Gap) else 0.0
        if off > thr:
            return bug(j, "speculative", f"was chosen from logits {off:.3g} off the fp32 recompute", thr)
    return tie


def _first_difference(i: int, base: list[TokenEvent], spec: list[TokenEvent], dtype: torch.dtype,
                      recompute: Recompute | None) -> Equality:
    """Rules 1-6 at the first differing position i."""
    low = recompute is not None and dtype in LOW_PRECISION

    @functools.cache
    def rows():  # one fp32 forward over the speculative run's tokens, only if a verdict needs it
        return recompute([t.token_id for t in spec]) if low else None
    eq = judge(i, base[i].token_id, spec[i].token_id, base[i].gap, spec[i].gap, dtype,
               lambda: None if rows() is None else rows()[i])
    return eq if eq.verdict == "mismatch" else _after_tie(eq, base, spec, dtype, rows())


def compare_greedy(base: list[TokenEvent], spec: list[TokenEvent], dtype: torch.dtype = torch.float32,
                   recompute: Recompute | None = None) -> Equality:
    """Compare two greedy outputs token by token (see the module docstring).
    recompute(ids): the target's fp32 logits (len(ids), V) on prompt + ids, row j
    predicting ids[j] (fp32_recompute builds one), or None."""
    for i, (b, s) in enumerate(zip(base, spec, strict=False)):
        if b.token_id != s.token_id:
            return _first_difference(i, base, spec, dtype, recompute)
    if len(base) != len(spec):  # one stopped early with the same prefix: nothing numerical explains that
        i = min(len(base), len(spec))
        return Equality("mismatch", i, reason="one run stopped early")
    return Equality("identical")


def fp32_recompute(model, prompt_ids: list[int]) -> Recompute | None:
    """compare_greedy's recompute for a low-precision target: one forward of
    prompt + ids with the model's own weights upcast to fp32 for that call only
    (the low-precision tensors are put back untouched; memory: one fp32 copy
    meanwhile). None for an fp32 target: nothing finer to ask.
    Not thread-safe: call it when no other run uses the model."""
    if model.dtype not in LOW_PRECISION:
        return None

    @torch.inference_mode()
    def rows(ids: list[int]) -> torch.Tensor:
        saved = [(t, t.data) for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
        try:
            kernel_layer.moved()
            for t, d in saved:
                t.data = d.float()
            x = torch.tensor([list(prompt_ids) + list(ids[:-1])], device=model.device)
            return model(input_ids=x, logits_to_keep=len(ids)).logits[0].float()
        finally:
            for t, d in saved:
                t.data = d
            kernel_layer.moved()
    return rows
