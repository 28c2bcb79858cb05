"""Where trained drafts live: shipped in the repo (assets/drafts/<target key>/, made by
`python -m specviz heads eagle|medusa --ship`), else trained here (cache_root()/heads/<target key>/).
A shipped file is found first; each has its report.json (what it learned from, held-out acceptance)
and its sha256 in docs/trained_drafts.md. The key is the target's identity, not its precision:
one head serves the w4a8, bf16 and fp32 target alike (heads_key)."""
from __future__ import annotations

import hashlib
import json
import time
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


FILES = {"eagle": "eagle.pt", "medusa": "heads.pt", "exit": "exit.pt"}


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
    """Writes a trained file and its report (cache, or with `ship` the repo's assets, its sha256 into
    SHA256SUMS and the file it replaces summed up in the report's history, which the card reads)."""
    d = shipped_dir(pair) if ship else heads_dir(pair)
    d.mkdir(parents=True, exist_ok=True)
    path = d / FILES[kind]
    rep = {**rep, "saved_utc": rep.get("saved_utc") or time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    torch.save(blob, path.with_suffix(".tmp"))
    digest = sha256_of(path.with_suffix(".tmp"))
    if ship:
        rep = with_history(d, kind, rep, digest)
    path.with_suffix(".tmp").replace(path)
    path.with_name(f"{kind}-report.json").write_text(json.dumps(rep, indent=1))
    if ship:
        sums = _sums(d)
        sums[path.name] = digest
        (d / SUMS).write_text("".join(f"{h}  {n}\n" for n, h in sorted(sums.items())))
    return path


# what a report keeps of each shipped file it replaced (the card's table of training stretches)
HISTORY_KEYS = ("saved_utc", "stretch_s", "tokens_seen", "lr", "p_weight", "note", "trained_on",
                "held_out_first_draft_agreement")


def summary(rep: dict, digest: str) -> dict:
    """A report as one row of the card's table of stretches (and of a later report's history): its
    stretch, the file's sha256, and its held-out position-1 acceptance and τ by kind."""
    runs = {k: v for k, v in (rep.get("held_out_runs") or {}).items() if isinstance(v, dict)}
    return {k: rep[k] for k in HISTORY_KEYS if k in rep} | {
        "sha256": digest, "tau": {k: v.get("tau") for k, v in runs.items()},
        "position_1": {k: (v.get("acceptance") or [None])[0] for k, v in runs.items()}}


def with_history(d: Path, kind: str, rep: dict, digest: str) -> dict:
    """rep with the shipped file it replaces in `d` (if another: its sha256 is not `digest`) appended
    to that file's own history (summary)."""
    old_path, old_digest = d / f"{kind}-report.json", _sums(d).get(FILES[kind])
    if not old_path.is_file() or old_digest in (None, digest):
        return rep
    old = json.loads(old_path.read_text())
    kept = {"findings": old["findings"]} if old.get("findings") else {}  # measured on the heads before
    return {**kept, **rep, "history": [*old.get("history", []), summary(old, old_digest)]}


# ------------------------------------------------------------------ a shipped file's sha256, checked at load
SUMS = "SHA256SUMS"  # beside the shipped files, in sha256sum's format (`sha256sum -c SHA256SUMS` reads it)
_CHECKED: dict = {}  # (path, size, mtime) -> the file's sha256: hashed once per version of the file


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sums(d: Path) -> dict[str, str]:
    try:
        lines = (d / SUMS).read_text().splitlines()
    except OSError:
        return {}
    parts = (ln.partition(" ") for ln in lines)
    return {name.strip().lstrip("*"): digest for digest, _, name in parts if name}


def require(path: Path) -> None:
    """check(), raised as the one RequestError line a loader (EAGLE, Medusa, the trained exit) shows."""
    bad = check(path)
    if bad:
        from ...errors import RequestError
        raise RequestError(bad)


def check(path: Path) -> str | None:
    """None if `path` may be loaded; else the one line that says why not: a shipped file (assets/drafts/)
    whose sha256 is not the one its folder's SHA256SUMS lists (a damaged or half-fetched checkout, a
    Git LFS pointer). A file trained here (the cache) is not checked: this machine made it."""
    path = Path(path)
    if path.resolve().parent.parent != SHIPPED.resolve():
        return None
    want = _sums(path.parent).get(path.name)
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = sha256_of(path)
    if want is None:
        return f"The shipped file {path} has no sha256 in {path.parent / SUMS}: not one the project made."
    if _CHECKED[key] != want:
        return (f"The shipped file {path} is damaged: its sha256 is {_CHECKED[key][:12]}…, not the "
                f"{want[:12]}… its {SUMS} lists. Restore it with `git checkout -- {path.name}` in that "
                "folder (or fetch its Git LFS object).")
    return None
