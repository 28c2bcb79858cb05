"""Loading a pair: both models and the target's tokenizer, the vocabulary
check, end-of-sequence ids, the speed setup (int8 draft, small-M linear) and
load errors in words a visitor understands."""
from __future__ import annotations

import bisect
import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import machine
from ..engine.costs import CostModel
from ..engine.cpu import kernel_layer, speed
from ..engine.pair import OURS
from ..errors import OOM_LOADING, ModelError, first_line, is_oom
from . import gpu_path, overflow
from .embedded import Progress, cache_root, local_refs
from .registry import PairSpec, _hub_reachable, _looks_like_path, pick_device_dtype

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# "auto": the draft's int8 / float candidates are timed at load and the fastest
# kept (calibration/calibrate.py; int8 made c 0.38 -> 0.13 on the default pair in fp32)
QUANTIZE = (None, "", "none", "auto", "int8", "draft-int8")


@dataclass
class ModelPair:
    target: PreTrainedModel
    draft: PreTrainedModel | None
    tokenizer: PreTrainedTokenizerBase
    spec: PairSpec
    device: torch.device
    dtype: torch.dtype
    eos_ids: list[int]
    precision_label: str = ""  # what both sides run: "float32", "bfloat16", "int8 (dynamic)"
    quantize: str | None = None  # None, "int8" (both models) or "draft-int8"
    costs: CostModel | None = None  # measured plain step, v(k), draft step (calibration/calibrate.py)
    precision_note: str = ""  # what runs and why, e.g. "target bfloat16 (128 ms/step vs 279 ms fp32 ...)"
    choice: object = None  # the calibration's Choice (calibration/calibrate.py): what was timed, what won
    draft_step: object = None  # calibration/draft_compile.DraftStep: the draft's step, eager or compiled
    calibration: str = ""  # "untimed" / "noisy": the page recalibrates in the background (ui/loader.py)
    note: str = ""  # why this pair runs here (hosting/gpu.py's placement)
    unmeasured: tuple = ()  # every Stats field is measured by our engine
    baseline_pair: ModelPair | None = None  # two GPUs: the baseline's own copy (hosting/gpu.py)
    engine: str = OURS

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def max_positions(self) -> int | None:
        """The target's context length (prompt + new tokens), when its config says."""
        return getattr(self.target.config, "max_position_embeddings", None)

    def run_events(self, req, side, prompt_ids, stop=None, clock=None):
        raise NotImplementedError("our engine runs this pair (run/runner.py)")

    def close(self) -> None:
        """Nothing to stop: the models are in this process."""


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


def _loader(dev: torch.device, lean: bool | None):
    """_load_one, then the lean Llama-family swap (engine/cpu/lean.py) unless lean is False
    (None: SPECVIZ_LEAN=0 turns it off)."""
    from ..engine.cpu.lean import defer, make_lean
    on = lean if lean is not None else os.environ.get("SPECVIZ_LEAN", "1") != "0"

    def load(ref: str, dtype: torch.dtype, lowbit_fmt: str | None = None):
        from ..engine.cpu import lowbit
        model, tok = _load_one(ref, dev, dtype)
        if on and dev.type == "cpu" and dtype == torch.float32:  # a low-bit choice loads in fp32 too
            model = defer(model)  # fused as it is converted: calibration holds no fused fp32 copy
        else:
            model = make_lean(model) if on else model
        if lowbit_fmt in lowbit.FORMATS and dev.type == "cpu":
            # a cached low-bit choice: convert now, before the next model loads, so the two fp32
            # checkpoints are never mapped at once (peak RSS of a load 14.9 -> 12.5 GB on the default
            # pair), each layer as soon as it is fused (lowbit.pack: its pages dropped)
            model = lowbit.pack(model, lowbit_fmt)
            _own_memory(model)
        return model, tok
    return load


def load_stock(ref: str, device: torch.device, dtype: torch.dtype):
    """A model as `from_pretrained` gives it: no speed patch, no quantisation
    (the bench's "as shipped" reference)."""
    return _load_one(ref, device, dtype)[0]


def load_pair(spec: PairSpec, device: str | None = None, dtype: torch.dtype | None = None,
              progress: Progress | None = None, load_draft: bool = True,
              quantize: str | None = None, precision: str = "auto",
              draft_vocab: int | None = None, calibration: str = "auto",
              cache_file: Path | None = None, lean: bool | None = None) -> ModelPair:
    """Load target (+ draft) and the target's tokenizer, checking that the vocabularies agree,
    in the precision chosen by measurement on this machine (calibration/calibrate.py).

    precision (both models' float type): "auto" times fp32 and bf16 on a CPU with
    native bf16 (fp32 elsewhere, and for models under 100M parameters; the
    GPU's half type on a GPU), "fp32" or "bf16" force it. quantize (CPU):
    "int8" swaps every Linear of both models for dynamic int8 (a different,
    faster target, used by the baseline and the speculative side alike; needs
    precision auto or fp32); "draft-int8" quantises only the draft (the output
    is unchanged, the draft just guesses faster); "auto" adds int8 to the
    draft's candidates and keeps the fastest; "none"/None: no int8.
    The choice, its reason and the measured CostModel land on pair.costs and
    pair.precision_note; they are cached per pair and machine (or in `cache_file`).
    draft_vocab: the draft's output layer keeps this many most frequent tokens
    (models/vocab_trim.py; lossless); 0 keeps all; None: 32,768 on a CPU for
    vocabularies of 65,536 or more.
    calibration: calibration/calibrate.MODES ("cached": never time anything now).
    lean: fuse the Llama family's q/k/v and gate/up (engine/cpu/lean.py); None: on unless SPECVIZ_LEAN=0."""
    from ..calibration import calibrate
    from ..engine.cpu import lean
    if quantize not in QUANTIZE:
        raise ModelError(f"unknown quantisation '{quantize}': use int8, draft-int8, auto or none")
    if precision not in calibrate.PRECISIONS:
        raise ModelError(f"unknown precision '{precision}': use {', '.join(calibrate.PRECISIONS)}")
    if quantize == "int8" and precision == "bf16":
        raise ModelError("int8 quantisation works on fp32 weights: use precision auto or fp32 with int8")
    progress = progress or (lambda msg, frac: None)
    dev, auto_dtype = pick_device_dtype(device)
    if quantize in ("int8", "draft-int8") and dev.type != "cpu":
        raise ModelError("int8 quantisation is for CPU only")
    half = "fp16" if auto_dtype == torch.float16 else "bf16"
    refs = local_refs(spec, progress)
    if draft_vocab is not None and draft_vocab < 0:
        raise ModelError("the draft vocabulary size must be 0 (all tokens) or positive")
    draft_key = f"{refs['draft']}#vocab={draft_vocab}" if load_draft else None  # trimming changes c
    cache_file = cache_file or calibrate.cache_path(cache_root(), target_ref=refs["target"],
                                                    draft_ref=draft_key, precision=precision,
                                                    quantize=quantize, device=dev.type)
    cached = calibrate.serving(cache_file, calibration)  # float: loaded in it; low-bit: packed at load
    start = {side: calibrate.DTYPES.get(p, torch.float32) if p else None
             for side, p in (("target", cached and cached.target), ("draft", cached and cached.draft))}
    load = _loader(dev, lean)
    progress(f"loading target {spec.target}", 0.0)
    target, tok = load(refs["target"], dtype or start["target"] or auto_dtype,
                       cached.target if cached and dtype is None else None)
    draft = tok_draft = None
    if load_draft:
        progress(f"loading draft {spec.draft}", 0.6)
        draft, tok_draft = load(refs["draft"], dtype or start["draft"] or auto_dtype)
    check_vocab(target, draft, tok, tok_draft)
    keep = _draft_keep(draft_vocab, draft, tok, dev, _eos_ids(target, tok), progress)
    as_loaded = lambda: _trimmed(load(refs["draft"], dtype or start["draft"] or auto_dtype)[0], keep)  # noqa: E731
    fp32 = calibrate.Loaded(lambda: load(refs["target"], torch.float32)[0],
                            lambda: _trimmed(load(refs["draft"], torch.float32)[0], keep))
    # handed over, not passed: this frame must not keep either original alive (calibrate.Handoff)
    target = calibrate.Handoff(target)
    draft = calibrate.Handoff(_trimmed(draft, keep), as_loaded) if draft is not None else None
    target, draft, choice = calibrate.calibrate(
        target, draft, precision=precision if dtype is None else _precision_of(dtype),
        quantize=quantize, device=dev.type, half=half, cache_file=cache_file, reload=fp32,
        progress=progress, mode=calibration)
    lean.settle(target), lean.settle(draft)  # a deferred fusion no conversion made (an fp32 choice)
    costs, step = _warm(target, draft, choice.costs, progress)
    target, draft, why = _guard(target, draft, dev, tok, fp32, progress)  # a GPU's 16-bit overflow
    costs, graphs_note = _gpu_path(target, draft, costs, dev, progress)
    label = _label(choice)
    q = "int8" if choice.target == "int8" else ("draft-int8" if choice.draft == "int8" else None)
    dt = next(target.parameters()).dtype if choice.target != "int8" else torch.float32
    note = choice.note + (f", draft output layer {len(keep):,} of {len(tok):,} tokens" if keep else "")
    note += (f"; {step.note()}" if step else "") + speed.kernel_note(target, draft) + graphs_note
    pair = ModelPair(target, draft, tok, spec, dev, dt, _eos_ids(target, tok), label, q,
                     costs=costs, precision_note=note, choice=choice, draft_step=step)
    pair.calibration = "untimed" if choice.untimed else "noisy" if choice.noisy else ""  # ui/loader.py
    overflow.mark(pair, why)  # fp32 after a 16-bit overflow: the page says why
    return pair


def _gpu_path(target, draft, costs, dev: torch.device, progress):
    """On a GPU: no cuDNN attention, and the graph path (models/gpu_path.py) -> (costs, note)."""
    if dev.type != "cuda":
        return costs, ""
    gpu_path.no_cudnn_attention()
    if not gpu_path.wanted(dev):
        return costs, ""
    # the page's GPU path: captured now, costs timed on it (ZeroGPU: in each GPU call instead)
    per_call = machine.on_zerogpu()
    progress("CUDA graphs: captured in each GPU call" if per_call else "capturing CUDA graphs", 0.97)
    costs, note = gpu_path.graphs_or_eager(target, draft, costs)
    return costs, f"; {note}" if note else ""


def _label(choice) -> str:
    """What both sides run, e.g. "bfloat16", "int8 (dynamic), both models", "target w4a8, draft w4"."""
    from ..calibration.calibrate import NAMES
    if choice.draft in (None, choice.target):
        return NAMES[choice.target] + (", both models" if choice.target == "int8" else "")
    return f"target {NAMES[choice.target]}, draft {NAMES[choice.draft]}"


def _guard(target, draft, dev: torch.device, tok, reload, progress):
    """On a GPU, the warm-up's overflow check (models/overflow.py) -> (target, draft, why)."""
    if dev.type == "cpu":
        return target, draft, ""
    return overflow.guard(target, draft, overflow.probe_ids(tok), reload, progress)


def _warm(target, draft, costs, progress):
    """Own the weights, hold a low-bit model's input table in bfloat16 (engine/cpu/lowbit.HalfEmbedding),
    run each model's shapes once, and compile the draft's step where that
    measures faster (calibration/draft_compile.py) -> (costs with the draft step that will run, DraftStep)."""
    from dataclasses import replace

    from ..calibration import draft_compile
    from ..engine.cpu import lowbit
    from ..engine.cpu.memory import trim_heap
    progress("warming up", 0.95)
    trim_heap()  # calibration's candidates and fp32 originals, before the copies below
    for m in (m for m in (target, draft) if m is not None):
        _own_memory(m)
        if lowbit.lowbit_format(m) or speed.has_int8(m):
            # beside low-bit Linears, a bfloat16 input table; after calibration, which counts a
            # model's parameters and casts whole models
            lowbit.half_embeddings(m)
        speed.warm_up(m)
    step = draft_compile.compile_draft(draft, progress)
    trim_heap()
    if step is not None and step.compiled and costs is not None and costs.draft_step_s is not None:
        costs = replace(costs, draft_step_s=step.compiled_ms / 1e3,
                        notes={**costs.notes, "draft_step": step.note()})
    progress("models ready", 1.0)
    return costs, step


_OWNED: weakref.WeakSet = weakref.WeakSet()  # models _own_memory already copied


def _own_memory(model) -> None:
    """Copy what a CPU model kept from its checkpoint out of the checkpoint's file mapping,
    once per model (a target converted at load is not copied again at the end).
    from_pretrained maps safetensors files; a tensor left as loaded (the fp32 embedding table
    beside low-bit Linears) keeps the whole file mapped, and every page the conversion read
    counts as the process's memory (docs/why.md#own-memory)."""
    if model in _OWNED:
        return
    mapped = _file_mappings()
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type == "cpu" and _inside(mapped, t.untyped_storage().data_ptr()):
            t.data = t.data.clone()
    kernel_layer.moved()
    _OWNED.add(model)


def _file_mappings() -> list[tuple[int, int]] | None:
    """This process's file-backed address ranges, sorted (/proc/self/maps); None where unknown.
    Why only those are copied: copying every tensor (fused, packed and converted ones are already
    the process's own) took most of a pair's load (docs/why.md#own-memory)."""
    try:
        with open("/proc/self/maps") as f:
            rows = [line.split(maxsplit=5) for line in f]
    except OSError:
        return None
    return sorted((int(r[0].split("-")[0], 16), int(r[0].split("-")[1], 16))
                  for r in rows if len(r) == 6 and r[5].startswith("/"))


def _inside(ranges: list[tuple[int, int]] | None, address: int) -> bool:
    if ranges is None:
        return True  # unknown: copy, as a mapped tensor would need
    i = bisect.bisect_right(ranges, (address, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= address < ranges[i][1]


def _draft_keep(draft_vocab, draft, tok, dev, eos, progress) -> list[int] | None:
    """The token ids the draft's output layer keeps, or None to keep them all."""
    from . import vocab_trim
    if draft is None or draft_vocab == 0:
        return None
    n = draft_vocab or (vocab_trim.DEFAULT_KEEP if dev.type == "cpu" and len(tok) >= vocab_trim.MIN_VOCAB
                        else 0)
    if not n or n >= len(tok):
        return None
    progress(f"draft output layer: the {n:,} most frequent tokens", 0.85)
    return vocab_trim.frequent_tokens(tok, n, always=tuple(eos))


def _trimmed(draft, keep):
    from . import vocab_trim
    if draft is not None and keep:
        vocab_trim.trim(draft, keep)
    return draft


def _precision_of(dtype: torch.dtype) -> str:
    """A caller's explicit dtype as a forced precision."""
    from ..calibration.calibrate import DTYPES
    return next((k for k, v in DTYPES.items() if v == dtype), "fp32")
