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
    # the draft's own generate() fills unset fields from its defaults too: a clean config
    with clean_defaults(draft):
        for k, value in settings.items():
            setattr(draft.generation_config, k, value)
        yield


_STOCK: dict[int, object] = {}


def stock_draft(pair):
    """The fp32 draft as `from_pretrained` gives it (loaded once more if ours is int8)."""
    if pair.quantize != "draft-int8":
        return pair.draft  # fp32: the same object, run with speed.unpatched
    if id(pair) not in _STOCK:
        from ..engine.cpu import speed
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
            from ..engine.cpu import speed
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


# transformers fills every field left unset (None) from the model's own generation_config
# (this pair's ships repetition_penalty 1.1, which changes greedy output). So every field
# that changes the output or the cost is set here, and the model's defaults are swapped
# for a clean GenerationConfig during the call (fields whose "off" is None: forced_*,
# dola_layers, penalty_alpha, sequence_bias, cache_implementation, stop_strings, …).
GREEDY = dict(
    do_sample=False, num_beams=1, num_beam_groups=1, diversity_penalty=0.0, num_return_sequences=1,
    temperature=1.0, top_k=50, top_p=1.0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
    repetition_penalty=1.0, encoder_repetition_penalty=1.0, length_penalty=1.0, no_repeat_ngram_size=0,
    encoder_no_repeat_ngram_size=0, min_length=0, min_new_tokens=0, renormalize_logits=False,
    remove_invalid_values=False, early_stopping=False, use_cache=True, output_scores=False,
    output_logits=False, output_attentions=False, output_hidden_states=False, return_dict_in_generate=False,
)


@contextlib.contextmanager
def clean_defaults(model):
    """model.generation_config = a clean GenerationConfig (token ids kept) for the call."""
    from transformers import GenerationConfig
    old = model.generation_config
    model.generation_config = GenerationConfig(bos_token_id=old.bos_token_id, eos_token_id=old.eos_token_id,
                                               pad_token_id=old.pad_token_id)
    try:
        yield
    finally:
        model.generation_config = old


def greedy_config(max_new_tokens: int, eos: list[int]):
    from transformers import GenerationConfig
    return GenerationConfig(**GREEDY, max_new_tokens=max_new_tokens, eos_token_id=eos,
                            pad_token_id=eos[0] if eos else None)


def run_hf(pair, family: str, gamma: int, ids: list[int], max_new_tokens: int) -> dict:
    """One `target.generate` call (greedy, plain or assisted); timed end to end."""
    import torch
    device = pair.target.device
    x = torch.tensor([ids], device=device)
    eos = list(pair.eos_ids)
    kw = dict(attention_mask=torch.ones_like(x), generation_config=greedy_config(max_new_tokens, eos))
    ctx = contextlib.ExitStack()
    ctx.enter_context(clean_defaults(pair.target))
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
