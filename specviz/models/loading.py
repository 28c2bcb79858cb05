"""Loading a pair: both models and the target's tokenizer, the vocabulary
check, end-of-sequence ids, the speed setup (int8 draft, small-M linear) and
load errors in words a visitor understands."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..engine import speed
from ..errors import OOM_LOADING, ModelError, first_line, is_oom
from .embedded import Progress, local_refs
from .registry import PairSpec, _hub_reachable, _looks_like_path, pick_device_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

QUANTIZE = (None, "", "none", "auto", "int8", "draft-int8")
# "auto": on a CPU, an fp32 draft this big is read from memory at every draft
# step; int8 makes it ~4x cheaper (c 0.38 -> 0.13 on the default pair) while
# the target, and so the output, stays exactly as it is
AUTO_DRAFT_INT8_PARAMS = 100_000_000


@dataclass
class ModelPair:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    spec: PairSpec
    device: torch.device
    dtype: torch.dtype
    eos_ids: list[int]
    precision: str = ""  # what both sides run: "float32", "bfloat16", "int8 (dynamic)"
    quantize: str | None = None  # None, "int8" (both models) or "draft-int8"

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def max_positions(self) -> int | None:
        """The target's context length (prompt + new tokens), when its config says."""
        return getattr(self.target.config, "max_position_embeddings", None)


def _output_size(model) -> int:
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def check_vocab(target, draft, tok_target, tok_draft=None) -> None:
    """ModelError unless the draft's tokens mean the same as the target's.

    Output sizes may differ (checkpoints pad their embeddings differently); what
    matters is an identical token table that both output layers cover.
    """
    n_tok = len(tok_target)

    def mismatch(n_draft: int, n_target: int) -> ModelError:
        return ModelError(f"draft and target use different vocabularies ({n_draft} vs {n_target} tokens): "
                          "pick a draft from the same model family")

    if _output_size(target) < n_tok:
        raise ModelError(f"the target's output layer ({_output_size(target)}) is smaller than its "
                         f"tokenizer ({n_tok} tokens): model and tokenizer do not match")
    if draft is None:
        return
    if tok_draft is not None and tok_draft.get_vocab() != tok_target.get_vocab():
        raise mismatch(len(tok_draft), n_tok)
    if _output_size(draft) < n_tok:
        raise mismatch(_output_size(draft), n_tok)


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    for value in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def _load_error(ref: str, err: BaseException) -> ModelError:
    """Map a loading failure to one line a visitor understands."""
    msg, text = first_line(err), str(err)
    if is_oom(err):
        return ModelError(f"could not load '{ref}': {OOM_LOADING}")
    if "trust_remote_code" in text or "does not recognize this architecture" in text:
        return ModelError(f"could not load '{ref}': its architecture is not supported without remote code, "
                          "which this app never runs")
    local = _looks_like_path(ref)
    if local and ("Unrecognized model" in text or isinstance(err, OSError)):
        return ModelError(f"could not load '{ref}': the folder holds no usable model "
                          "(config.json and weights)")
    if isinstance(err, OSError) or type(err).__module__.startswith("huggingface_hub"):
        if not _hub_reachable():
            return ModelError(f"could not load '{ref}': not found locally and the Hugging Face Hub is "
                              "unreachable (no network)")
        return ModelError(f"could not load '{ref}': not found on the Hugging Face Hub, "
                          f"or gated/private ({msg})")
    return ModelError(f"could not load '{ref}': {msg}")


def _load_one(ref: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = _looks_like_path(ref)
    if local:
        path = Path(ref).expanduser()
        if not path.is_dir():
            raise ModelError(f"local path not found: '{ref}'")
        ref = str(path)
    # offline: don't let huggingface_hub spend ~20 s retrying a dead network
    kw = dict(trust_remote_code=False, local_files_only=local or not _hub_reachable())
    try:
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype, **kw)
        tok = AutoTokenizer.from_pretrained(ref, **kw)
        model.to(device)
    except ModelError:
        raise
    except Exception as err:  # transformers raises OSError/ValueError/KeyError/hub errors
        raise _load_error(ref, err) from err
    model.eval()
    model.requires_grad_(False)
    return model, tok


def load_stock(ref: str, device: torch.device, dtype: torch.dtype):
    """A model as `from_pretrained` gives it: no speed patch, no quantisation
    (the bench's "as shipped" reference)."""
    return _load_one(ref, device, dtype)[0]


def load_pair(spec: PairSpec, device: str | None = None, dtype: torch.dtype | None = None,
              progress: Progress | None = None, load_draft: bool = True,
              quantize: str | None = None) -> ModelPair:
    """Load target (+ draft) and the target's tokenizer, checking that the vocabularies agree.

    quantize="auto": "draft-int8" for a CPU fp32 pair whose draft has 100M+
    parameters, else nothing. quantize="int8" swaps every Linear of both models for dynamic int8 (CPU):
    a different, faster target, used by the baseline and the speculative side
    alike. quantize="draft-int8" quantises only the draft: the target (and so
    the output) is unchanged, the draft just guesses faster."""
    if quantize not in QUANTIZE:
        raise ModelError(f"unknown quantisation '{quantize}': use int8, draft-int8 or none")
    progress = progress or (lambda msg, frac: None)
    dev, auto_dtype = pick_device_dtype(device)
    dtype = dtype or auto_dtype
    refs = local_refs(spec, progress)
    progress(f"loading target {spec.target}", 0.0)
    target, tok = _load_one(refs["target"], dev, dtype)
    draft = tok_draft = None
    if load_draft:
        progress(f"loading draft {spec.draft}", 0.6)
        draft, tok_draft = _load_one(refs["draft"], dev, dtype)
    check_vocab(target, draft, tok, tok_draft)
    precision = str(dtype).removeprefix("torch.")
    if quantize == "auto":
        big = draft is not None and sum(p.numel() for p in draft.parameters()) >= AUTO_DRAFT_INT8_PARAMS
        quantize = "draft-int8" if dev.type == "cpu" and dtype == torch.float32 and big else None
    if quantize in ("int8", "draft-int8") and dev.type != "cpu":
        raise ModelError("int8 quantisation is for CPU only")
    if quantize == "int8":
        progress("quantising both models to int8", 0.9)
        target, draft = (speed.quantize_int8(m) if m is not None else None for m in (target, draft))
        precision = "int8 (dynamic), both models"
    else:
        speed.patch_small_m_linear(target)  # the target's trick serves both paths
        if quantize == "draft-int8" and draft is not None:
            progress("quantising the draft to int8", 0.9)
            draft = speed.quantize_int8(draft)
            precision = f"target {precision}, draft int8 (dynamic)"
        elif draft is not None:
            speed.patch_small_m_linear(draft)
    progress("warming up", 0.95)
    for m in (target, draft):
        if m is not None:
            speed.warm_up(m)
    progress("models ready", 1.0)
    return ModelPair(target, draft, tok, spec, dev, dtype, _eos_ids(target, tok), precision,
                     quantize if quantize in ("int8", "draft-int8") else None)
