"""Which precision wins, from measured timings: pure functions, no model (calibration/calibrate.py
times the candidates and calls these; tests inject timings)."""
from __future__ import annotations

from ..engine.costs import MAX_VERIFY_TOKENS, CostModel
from ..engine.cpu import lowbit

SMALL_MODEL_PARAMS = 100_000_000  # below this auto keeps fp32 and nothing is timed
PROMPT_N = 64  # a prompt's forward, as the target choice times it
# forwards the target choice compares: a plain step, a γ=4 verify and a prompt (see _score)
CHOICE_N = (1, 5, PROMPT_N)
# The target's score is what one request of the page costs it: the plain run AND the speculative
# run, both of which really run. A 64-token request: 64 plain steps, ~16 verify rounds (τ ≈ 4),
# and a ~100-token prompt (1.6 of the timed 64) read by each run; per 8 steps that is
# PLAIN_WEIGHT steps + VERIFY_WEIGHT verifies + 0.4 prompts (1 / PROMPT_SPREAD).
# Why both runs: scoring the speculative round alone could keep a target whose plain step is twice
# another's, a speedup shown over a baseline slowed for it (docs/why.md#request-score).
PLAIN_WEIGHT = 8
VERIFY_WEIGHT = 2
PROMPT_SPREAD = 2.5
# ... and once for ~64 draft steps: a 64-token request at γ 4-5 (τ ≈ 4: 16 rounds × 4-5 steps)
DRAFT_PROMPT_SPREAD = 64
NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8 (dynamic)", **lowbit.NAMES}
# A candidate whose lower bound (see _score) is already PRUNE x the best full score is not timed
# further: timing a candidate already beaten was a third of a calibration (docs/why.md#prune).
PRUNE = 1.15


def candidates(*, precision: str, quantize: str | None, device: str, native_bf16: bool,
               n_target: int, n_draft: int | None, half: str = "bf16",
               min_params: int = SMALL_MODEL_PARAMS,
               lowbit_candidates: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(target candidates, draft candidates) to time, in timing order.

    precision: auto|fp32|bf16 sets the float type of both models; quantize:
    none|auto|draft-int8|int8 adds dynamic int8 (CPU only): int8 = both models,
    draft-int8 = the draft, auto = the draft if it measures fastest.
    lowbit_candidates: the low-bit formats this CPU runs (lowbit.available());
    under auto they join the timing; a forced low-bit precision runs alone.
    `half` is the GPU's half type (bf16, or fp16 without bf16 support)."""
    quantize = quantize or "none"
    cpu = device == "cpu"
    # low-bit weights (engine/cpu/lowbit.py) are timed beside the floats on a CPU: which wins
    # differs by CPU class (AVX2 EPYC: w8a8 174 ms/step, w16 282, fp32 644 for the 1.5B)
    lowbit_auto = [f for f in lowbit_candidates if f != precision] if precision == "auto" and cpu else []
    lowbit_target = [f for f in lowbit_auto if f in lowbit.row_exact()]  # a target must be row-exact
    if precision != "auto":
        floats = [precision]
    elif not cpu:
        floats = [half]  # on a GPU the half type is the natural choice: nothing to time
    else:
        floats = ["fp32", "bf16"] if native_bf16 else ["fp32"]
    small_t = n_target < min_params
    target = ["int8"] if quantize == "int8" else (["fp32"] if small_t and precision == "auto" and cpu
                                                   else floats + lowbit_target)
    if n_draft is None:
        return target, []
    small_d = n_draft < min_params
    if quantize in ("int8", "draft-int8"):
        draft = ["int8"]
    elif small_d and precision == "auto" and cpu:
        draft = ["fp32"]
    else:
        draft = (["int8"] if quantize == "auto" and cpu else []) + floats + lowbit_auto
    return target, draft


def _score(t: dict[int, float]) -> float:
    """A request's plain steps, γ=4 verifies and prompt reads (see PLAIN_WEIGHT). Why the
    prompt: kernels differ most there, and the step alone picked a kernel that lost a request's
    time reading prompts (docs/why.md#prompt-score)."""
    if set(t) == {1}:  # timed on its step alone (pruned): a verify of 5 costs at least a step
        return (PLAIN_WEIGHT + VERIFY_WEIGHT) * t[1]
    score = (PLAIN_WEIGHT * t.get(1, 0.0) + VERIFY_WEIGHT * t.get(5, 0.0)
             + t.get(PROMPT_N, 0.0) / PROMPT_SPREAD)
    return score or t[min(t)]


def pruned(t: dict[int, float], timings: dict[str, dict[int, float]]) -> bool:
    """Stop timing a candidate (t so far) whose lower bound cannot come near the best full score."""
    full = [_score(v) for v in timings.values() if all(n in v for n in CHOICE_N)]
    return bool(full) and _score(t) > PRUNE * min(full)


def choose_target(timings: dict[str, dict[int, float]]) -> str:
    """Fastest precision by the score; on a tie the first candidate (fp32: the exact one)."""
    return min(timings, key=lambda p: (_score(timings[p]), list(timings).index(p)))


def draft_score(step: float, prompt: float | None = None) -> float:
    """A draft step plus its prompt read spread over a request's draft steps (why the prompt:
    docs/why.md#prompt-score)."""
    return step + (prompt or 0.0) / DRAFT_PROMPT_SPREAD


def choose_draft(timings: dict[str, float], prompts: dict[str, float] | None = None) -> str:
    prompts = prompts or {}
    return min(timings, key=lambda p: (draft_score(timings[p], prompts.get(p)), list(timings).index(p)))


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms"


def note(target: str, draft: str | None, timings: dict, where: str) -> str:
    """'target bfloat16 (128 ms/step vs 279 ms fp32 on this CPU), draft int8 (dynamic) (18 ms vs ...)'."""
    tt, dt = timings.get("target", {}), timings.get("draft", {})
    parts = [f"target {NAMES[target]}"]
    if target in tt and 1 in tt[target]:
        others = ", ".join(f"{_ms(tt[p][1])} {p}" for p in tt if p != target and 1 in tt[p])
        vs = f" vs {others}" if others else ""
        parts[0] += f" ({_ms(tt[target][1])}/step{vs} on this {where}"
        if PROMPT_N in tt[target]:
            others = ", ".join(f"{_ms(tt[p][PROMPT_N])} {p}" for p in tt if p != target and PROMPT_N in tt[p])
            parts[0] += (f"; a {PROMPT_N}-token prompt {_ms(tt[target][PROMPT_N])}"
                         + (f" vs {others}" if others else ""))
        parts[0] += ")"
    if draft is not None:
        d, dp = f"draft {NAMES[draft]}", timings.get("draft_prompt", {})
        if draft in dt:
            others = ", ".join(f"{_ms(dt[p])} {p}" for p in dt if p != draft)
            d += f" ({_ms(dt[draft])}/step" + (f" vs {others}" if others else "")
            if draft in dp:
                others = ", ".join(f"{_ms(dp[p])} {p}" for p in dp if p != draft)
                d += f"; a {PROMPT_N}-token prompt {_ms(dp[draft])}" + (f" vs {others}" if others else "")
            d += ")"
        parts.append(d)
    return ", ".join(parts)


def cost_model(timings: dict, target: str, draft: str | None, machine: str) -> CostModel | None:
    """The chosen precision's timings as a CostModel (None without the full verify curve)."""
    t = timings.get("target", {}).get(target, {})
    if any(n not in t for n in range(1, MAX_VERIFY_TOKENS + 1)):
        return None
    d = timings.get("draft", {}).get(draft) if draft else None
    return CostModel(plain_step_s=t[1], verify_s=tuple(t[n] for n in range(1, MAX_VERIFY_TOKENS + 1)),
                     draft_step_s=d, target_precision=NAMES[target],
                     draft_precision=NAMES[draft] if draft else "", machine=machine)


def class_default(cands: list[str], native_bf16: bool) -> str:
    """What a CPU of this class runs when timing cannot tell (a ranking that flips under load,
    or no time to measure): w4a8 where our kernel builds, the fastest on every class where it was
    timed, else bf16 where it is native, else w8a8 where fbgemm runs, else fp32
    (docs/why.md#class-default)."""
    for p in ("w4a8",) + (("bf16",) if native_bf16 else ()) + ("w8a8", "fp32"):
        if p in cands:
            return p
    return cands[0]


def draft_default(cands: list[str], target: str | None = None) -> str | None:
    """What a draft runs untimed: w4a8 where it runs (docs/why.md#class-default), else int8, fp32,
    the target's format; timed first when timing."""
    return next((p for p in ("w4a8", "int8", "fp32", target) if p in cands), cands[0]) if cands else None
