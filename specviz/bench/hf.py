"""Hugging Face reference runs: `target.generate`, plain or assisted, timed end to end."""
from __future__ import annotations

import contextlib
import time

HF_FAMILIES = ("hf-greedy", "hf-assisted", "hf-heuristic", "hf-stock")


def sync(device) -> None:
    if str(device).startswith("cuda"):
        import torch
        torch.cuda.synchronize()


class _FirstChunk:
    """A generate() streamer that only notes when the first new tokens arrive."""

    def __init__(self, device, t0: float):
        self.device, self.t0, self.calls = device, t0, 0
        self.first_t, self.first_n = None, 0

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            sync(self.device)
            self.first_t, self.first_n = time.perf_counter() - self.t0, int(value.numel())

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _assistant_config(draft, **settings):
    config = draft.generation_config
    old = {k: getattr(config, k, None) for k in settings}
    for k, value in settings.items():
        setattr(config, k, value)
    try:
        yield
    finally:
        for k, value in old.items():
            setattr(config, k, value)


_STOCK: dict[int, object] = {}


def stock_draft(pair):
    """The fp32 draft as `from_pretrained` gives it (loaded once more if ours is int8)."""
    if pair.quantize != "draft-int8":
        return pair.draft  # fp32: the same object, run with speed.unpatched
    if id(pair) not in _STOCK:
        from ..engine import speed
        from ..models import load_stock, local_refs
        _STOCK[id(pair)] = load_stock(local_refs(pair.spec)["draft"], pair.target.device, pair.dtype)
        speed.warm_up(_STOCK[id(pair)])
    return _STOCK[id(pair)]


def _assistant(pair, family: str, gamma: int, ctx: contextlib.ExitStack):
    """The assistant model for an HF family (None: plain greedy), configured inside ctx."""
    if family in ("hf-assisted", "hf-stock"):
        draft = pair.draft
        if family == "hf-stock":
            # what `generate(assistant_model=...)` gives out of the box: fp32 draft,
            # stock nn.Linear kernels in both models (our speed patch removed)
            from ..engine import speed
            draft = stock_draft(pair)
            ctx.enter_context(speed.unpatched(pair.target, draft))
        # constant γ, and no early stop on low draft confidence: γ drafts every round
        ctx.enter_context(_assistant_config(draft, num_assistant_tokens=gamma,
                                            num_assistant_tokens_schedule="constant",
                                            assistant_confidence_threshold=0.0))
        return draft
    if family == "hf-heuristic":
        # HF's defaults: start at 20, +2 after a full accept, -1 otherwise; confidence stop 0.4
        ctx.enter_context(_assistant_config(pair.draft, num_assistant_tokens=20,
                                            num_assistant_tokens_schedule="heuristic",
                                            assistant_confidence_threshold=0.4))
        return pair.draft
    return None


def run_hf(pair, family: str, gamma: int, ids: list[int], max_new_tokens: int) -> dict:
    """One `target.generate` call (greedy, plain or assisted); timed end to end."""
    import torch
    from transformers import GenerationConfig
    device = pair.target.device
    x = torch.tensor([ids], device=device)
    eos = list(pair.eos_ids)
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                               pad_token_id=eos[0] if eos else None)
    kw = dict(attention_mask=torch.ones_like(x), generation_config=gen_cfg)
    ctx = contextlib.ExitStack()
    assistant = _assistant(pair, family, gamma, ctx)
    if assistant is not None:
        kw["assistant_model"] = assistant
    with ctx, torch.inference_mode():
        sync(device)
        t0 = time.perf_counter()
        streamer = _FirstChunk(device, t0)
        out = pair.target.generate(x, streamer=streamer, **kw)
        sync(device)
        elapsed = time.perf_counter() - t0
    new = out[0, len(ids):].tolist()
    return {"token_ids": new, "elapsed": elapsed, "first_t": streamer.first_t,
            "first_n": streamer.first_n,
            "stop_reason": "eos" if new and new[-1] in eos else "max_new_tokens"}
