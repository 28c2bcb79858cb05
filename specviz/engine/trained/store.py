"""Where trained drafts live: shipped in the repo (assets/drafts/<target key>/, made by
`python -m specviz heads eagle|medusa --ship`), else trained here (cache_root()/heads/<target key>/).
A shipped file is found first; each has its report.json (what it learned from, held-out acceptance)
and its sha256 in docs/trained_drafts.md. The key is the target's identity, not its precision:
one head serves the w4a8, bf16 and fp32 target alike (heads_key)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import torch

from ...paths import cache_root

SHIPPED = Path(__file__).resolve().parents[3] / "assets" / "drafts"
KEY_VERSION = 1  # in the key: a new one would orphan every trained file
# a target id -> the one whose shipped files it may read: the same model by another name (set by the
# layer that knows both: hosting/spaces.py maps the default pair's Hub target to the embedded one)
ALIASES: dict[str, str] = {}


def target_dims(model) -> tuple[int, int, int]:
    """(layers, hidden, vocab of the output layer)"""
    cfg = model.config
    return (int(cfg.num_hidden_layers), int(cfg.hidden_size),
            int(model.get_output_embeddings().out_features))


def heads_key(pair) -> str:
    """The target's identity (pair name, model id or folder, layers, hidden size, vocabulary), not its
    precision or the machine: a head trained once serves the bf16, fp32 and w4a8 target alike."""
    ident = "|".join([pair.spec.name, pair.spec.target,
                      *map(str, target_dims(pair.target)), str(KEY_VERSION)])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def heads_dir(pair) -> Path:
    return cache_root() / "heads" / heads_key(pair)


FILES = {"eagle": "eagle.pt", "medusa": "heads.pt"}


def features_dir(pair) -> Path:
    return cache_root() / "features" / heads_key(pair)


def shipped_dir(pair) -> Path:
    return SHIPPED / heads_key(pair)


def _shipped_dirs(pair) -> list[Path]:
    """Where shipped files for this target may be: its own key's folder, and for the default pair's
    target from the Hub (a Space without the embedded packages) the embedded target's folder: the
    same model, whose head was trained on the 4-bit GGUF's states."""
    dirs = [shipped_dir(pair)]
    alias = ALIASES.get(getattr(pair.spec, "target", None))
    if alias is not None:
        spec = SimpleNamespace(name=pair.spec.name, target=alias)
        dirs.append(SHIPPED / heads_key(SimpleNamespace(spec=spec, target=pair.target)))
    return dirs


def find(pair, kind: str) -> Path | None:
    """The trained file of `kind` for this target: the shipped one, else the cached one, else None."""
    for d in (*_shipped_dirs(pair), heads_dir(pair)):
        if (d / FILES[kind]).is_file():
            return d / FILES[kind]
    return None


def report(pair, kind: str) -> dict | None:
    path = find(pair, kind)
    if path is None:
        return None
    try:
        return json.loads(path.with_name(f"{kind}-report.json").read_text())
    except (OSError, ValueError):
        return None


def save(pair, kind: str, blob: dict, rep: dict, ship: bool = False) -> Path:
    d = shipped_dir(pair) if ship else heads_dir(pair)
    d.mkdir(parents=True, exist_ok=True)
    path = d / FILES[kind]
    torch.save(blob, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    path.with_name(f"{kind}-report.json").write_text(json.dumps(rep, indent=1))
    return path
