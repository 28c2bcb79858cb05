"""Where trained heads live: cache_root()/heads/<key>/heads.pt + report.json.

The key is the target's identity (pair name, model id or folder, layers,
hidden size, vocabulary), not its precision or the machine: heads trained once
serve the bf16, fp32 and int8 target alike, and the hidden-state cache of the
corpus (data.py) sits in the same folder."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ..errors import RequestError
from .model import Heads

VERSION = 1


def target_dims(model) -> tuple[int, int, int]:
    """(layers, hidden, vocab of the output layer)"""
    cfg = model.config
    return (int(cfg.num_hidden_layers), int(cfg.hidden_size),
            int(model.get_output_embeddings().out_features))


def heads_key(pair) -> str:
    spec = getattr(pair, "spec", None)
    ident = "|".join([getattr(spec, "name", ""), getattr(spec, "target", ""),
                      *map(str, target_dims(pair.target)), str(VERSION)])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def heads_dir(pair) -> Path:
    from ..paths import cache_root
    return cache_root() / "heads" / heads_key(pair)


def train_command(pair) -> str:
    """The command that trains heads for this pair (shown when none are cached)."""
    spec = getattr(pair, "spec", None)
    name, target = getattr(spec, "name", "default"), getattr(spec, "target", "")
    if name == "default":
        args = ""
    elif name == "custom" or not name:
        args = f" --target {target} --draft {getattr(spec, 'draft', '')}"
    else:
        args = f" --pair {name}"
    return f"python -m specviz.heads train{args}"


def save(pair, heads: Heads, report: dict) -> Path:
    d = heads_dir(pair)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / "heads.pt.tmp"
    torch.save({"k": heads.k, "hidden": heads.hidden, "state": heads.state_dict(),
                "version": VERSION}, tmp)
    tmp.replace(d / "heads.pt")
    (d / "report.json").write_text(json.dumps(report, indent=1))
    return d / "heads.pt"


def _missing(pair, why: str) -> RequestError:
    return RequestError(f"{why} Train them once (a progress bar shows; about 30 minutes on a 2-core CPU) "
                        f"with: {train_command(pair)}")


_LOADED: dict[tuple, Heads] = {}  # a run builds its proposer on every request: read the file once


def load(pair) -> Heads:
    """The cached heads of this pair's target, or one RequestError with the train command."""
    path = heads_dir(pair) / "heads.pt"
    if not path.is_file():
        raise _missing(pair, "No trained multi-token heads are cached for this target.")
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)  # a retrained file is read again
    if key not in _LOADED:
        _LOADED[key] = _read(pair, path)
    return _LOADED[key]


def _read(pair, path: Path) -> Heads:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        heads = Heads(int(blob["hidden"]), int(blob["k"]))
        heads.load_state_dict(blob["state"])
    except Exception as e:  # noqa: BLE001 - zip, pickle, key or shape errors alike: the file is bad
        raise _missing(pair, f"The cached heads file {str(path)!r} cannot be read ({type(e).__name__}).") \
            from None
    if heads.hidden != target_dims(pair.target)[1]:
        raise _missing(pair, f"The cached heads file {str(path)!r} does not fit this target.")
    return heads.eval().requires_grad_(False)


def report(pair) -> dict | None:
    path = heads_dir(pair) / "report.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
