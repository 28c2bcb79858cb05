"""RunRequest: validated settings for one run, built once from UI/CLI/API input.

Validation errors are raised here as RequestError, in words a visitor
understands; the engines can then trust every field.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from ..engine.proposers import method_names, method_spec
from ..engine.sampling import SamplingParams
from ..engine.theory import MAX_GAMMA
from ..errors import RequestError

METHODS = method_names()  # every proposer registered in engine/proposers/
AUTO_GAMMA = "auto"  # γ chosen each round from the measured costs (engine/gamma.py)
PROMPT_CHARS_PER_TOKEN = 32  # a prompt longer than this many characters per allowed token is refused unread


def clean_text(text: str) -> str:
    """`text` with lone surrogates (JSON lets an API caller send them; tokenizers
    and UTF-8 refuse them) replaced by U+FFFD; valid pairs become their character."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _env_num(name: str, default, kind=int):
    """A positive number from the environment; the default if unset, malformed or not positive."""
    try:
        value = kind(float(os.environ.get(name, default)))
    except (TypeError, ValueError, OverflowError):
        return default
    return value if math.isfinite(value) and value > 0 else default


@dataclass(frozen=True)
class Limits:
    """Operator limits (flags or env) that visitors cannot exceed."""

    max_new_tokens: int = 512
    max_prompt_tokens: int = 2048
    max_seconds: float = 300.0

    @classmethod
    def from_env(cls) -> "Limits":
        return cls(_env_num("SPECVIZ_MAX_NEW_TOKENS", 512), _env_num("SPECVIZ_MAX_PROMPT_TOKENS", 2048),
                   _env_num("SPECVIZ_MAX_SECONDS", 300.0, float))


@dataclass(frozen=True)
class RunRequest:
    prompt: str
    method: str = "draft"
    gamma: int = 4  # with gamma_auto: the largest γ the policy may pick
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    chat_template: bool = False
    # method-specific settings (e.g. tree shape, exit layer), already validated
    # by the method's MethodSpec.check_options; empty for the chain methods
    options: dict = field(default_factory=dict, compare=False, hash=False)
    gamma_auto: bool = False  # γ = "auto": chosen each round from pair.costs and the running α̂
    # whose memory of earlier outputs a run may read and add to (suffix, hybrid): the page's session
    # hash; None (CLI, bench, API without a session): this run's own text only
    scope: str | None = field(default=None, compare=False)
    # fresh memory (the page's "fresh memory" box): the suffix drafters copy from this run's prompt and
    # output only, never from earlier runs' memory (its output is still remembered for later runs)
    fresh_memory: bool = field(default=False, compare=False)
    # share memory (the page's "share memory" box, off by default): also copy from every visitor's runs
    # of the shipped presets (suffix_tree.PRESETS); off, a run copies from its own session's runs only
    share_memory: bool = field(default=False, compare=False)

    @property
    def gamma_label(self) -> str:
        return AUTO_GAMMA if self.gamma_auto else str(self.gamma)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


# Below this, sampling is greedy in all but name (a logit gap of 0.1 is already odds of e^10) and
# logits / T heads for fp32 overflow (inf - inf = NaN at T ~ 1e-37): refused, 0 means greedy.
MIN_TEMPERATURE = 0.01


def _number(name, value, kind, lo, hi):
    """Coerce value (possibly a string from an API call) to kind in [lo, hi]."""
    try:
        if isinstance(value, bool) or value is None or value == "":
            raise TypeError
        if kind is int and (isinstance(value, int) or str(value).strip().lstrip("+-").isdigit()):
            x = int(value)  # exact: a float would round a seed above 2^53
        else:
            x = kind(float(value)) if kind is int else float(value)
            if kind is int and float(value) != x:
                raise TypeError
    except (TypeError, ValueError, OverflowError):
        what = "whole number" if kind is int else "number"
        raise RequestError(f"{name} must be a {what}, got {value!r}.") from None
    if isinstance(x, float) and not math.isfinite(x):
        raise RequestError(f"{name} must be a finite number, got {value!r}.")
    if not lo <= x <= hi:
        top = "2^63 - 1" if hi == 2**63 - 1 else hi  # a seed's range, as torch takes it
        span = f"between {lo} and {top}" if hi < 2**53 or hi == 2**63 - 1 else f"at least {lo}"
        raise RequestError(f"{name} must be {span}, got {value!r}.")
    return x


def make_request(prompt, *, method="draft", gamma=4, max_new_tokens=64, temperature=0.0,
                 top_p=1.0, top_k=0, seed=0, chat_template=False,
                 limits: Limits | None = None, options: dict | None = None,
                 scope: str | None = None, fresh_memory: bool = False,
                 share_memory: bool = False) -> RunRequest:
    limits = limits or Limits.from_env()
    if not isinstance(prompt, str) or not prompt.strip():
        raise RequestError("The prompt is empty: type something or pick a preset.")
    # refuse a huge paste before spending time and memory tokenising it (no
    # tokenizer makes tokens this long on average)
    if len(prompt) > PROMPT_CHARS_PER_TOKEN * limits.max_prompt_tokens:
        raise RequestError(f"The prompt is too long: {len(prompt)} characters, the limit here is "
                           f"{limits.max_prompt_tokens} tokens. Shorten it.")
    prompt = clean_text(prompt)
    if method not in METHODS:
        raise RequestError(f"Unknown method {method!r}: choose one of {', '.join(METHODS)}.")
    if seed is not None and seed != "":
        seed = _number("Seed", seed, int, 0, 2**63 - 1)
    else:
        seed = None
    temperature = _number("Temperature", temperature, float, 0.0, 2.0)
    if 0 < temperature < MIN_TEMPERATURE:
        raise RequestError(f"Temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, "
                           f"got {temperature!r}.")
    if temperature > 0 and method_spec(method).greedy_only:
        raise RequestError(f"The {method_spec(method).label} method is greedy only here: set temperature "
                           f"to 0, or pick another method.")
    gamma_auto = isinstance(gamma, str) and gamma.strip().lower() == AUTO_GAMMA
    return RunRequest(
        prompt=prompt,
        method=method,
        gamma=MAX_GAMMA if gamma_auto else _number("γ (draft length)", gamma, int, 1, MAX_GAMMA),
        gamma_auto=gamma_auto,
        max_new_tokens=_number("Max new tokens", max_new_tokens, int, 1, limits.max_new_tokens),
        temperature=temperature,
        top_p=_number("Top-p", top_p, float, 0.01, 1.0),
        top_k=_number("Top-k", top_k, int, 0, 1000),
        seed=seed,
        chat_template=bool(chat_template),
        options=method_spec(method).check_options(dict(options or {})),
        scope=str(scope) if scope else None,
        fresh_memory=fresh_memory is True,
        share_memory=share_memory is True,
    )


def encode_prompt(tokenizer, req: RunRequest, max_positions: int | None = None,
                  limits: Limits | None = None) -> list[int]:
    """Token ids of the prompt (through the chat template if asked), checked
    against the operator's limit and the model's context length."""
    limits = limits or Limits.from_env()
    if req.chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": req.prompt}], tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = tokenizer.encode(req.prompt)
    if not ids:
        raise RequestError("The prompt encodes to no tokens: type some text.")
    if len(ids) > limits.max_prompt_tokens:
        raise RequestError(f"The prompt is too long: {len(ids)} tokens, the limit here is "
                           f"{limits.max_prompt_tokens}. Shorten it.")
    if max_positions and len(ids) + req.max_new_tokens + MAX_GAMMA + 1 > max_positions:
        raise RequestError(f"Prompt ({len(ids)} tokens) plus {req.max_new_tokens} new tokens does not "
                           f"fit the model's context of {max_positions} tokens. Shorten the prompt "
                           f"or lower max new tokens.")
    return ids
