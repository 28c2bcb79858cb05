"""A second feature pass over the target's OWN answers (self-distillation): what the page asks a draft
to predict is the target's greedy text, not ShareGPT's or the standard library's.

python -m specviz heads answers --minutes M --out DIR asks the target (greedy, through its chat
template, as the page does) questions it was never benchmarked on: the first user turns of ShareGPT's
training conversations (features.held_out's complement) and HumanEval-like tasks cut from the standard
library (a function's signature and docstring, from the pass's training files), and keeps each prompt
and answer with the target's states, in features.py's shard format (ids, h, seg, kind; and ans, the
rows whose next token is the answer's): the EAGLE
trainer reads it beside the first pass (train_eagle's `also`). The answers are written by the draft
model's chain (lossless: greedy speculative output is plain greedy's) and their states are read by the
same prompt read as the first pass (features.states), so the rows are those of the w4a8 target the page
runs. Resumable: each shard records the next prompt's index.

Why: the first head agreed with the target 0.50 / 0.59 (chat / code) on held-out windows of the pass
but 0.41 / 0.52 on the target's own generated text (2026-11-29, docs/trained_drafts.md): the page's
text is the target's, and DistillSpec (Zhou et al. 2024) and Medusa-2 train drafts on it."""
from __future__ import annotations

import ast
import textwrap
import time
from pathlib import Path

import torch

from .features import (
    add_window,
    code_documents,
    conversations,
    held_out,
    open_pass,
    precision_of,
    states,
    write_shard,
)

MAX_CHARS = 1500  # a chat prompt longer than this is skipped (as acceptance.py's held-out prompts)
NEW_TOKENS = 160  # an answer's length at most (the bench writes 128, the held-out runs 64)


def code_tasks(docs, limit: int = 4000, per_file: int = 3) -> list[str]:
    """HumanEval-like prompts from the training files: a documented top-level function's signature and
    docstring, with the file's imports before it; at most `per_file` a file, in the files' order."""
    out = []
    for i, (_, text) in enumerate(docs):
        if held_out(i):
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        imports = [ast.get_source_segment(text, n) for n in tree.body
                   if isinstance(n, ast.Import | ast.ImportFrom)]
        took = 0
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if not doc or len(node.body) < 3 or len(doc) < 40 or node.name.startswith("_"):
                continue
            head = "\n".join(lines[node.lineno - 1: node.body[0].end_lineno])
            out.append("\n".join([*[m for m in imports[:4] if m], "", "", textwrap.dedent(head), ""]))
            took += 1
            if took >= per_file:
                break
        if len(out) >= limit:
            break
    return out


def prompts(limit: int = 6000) -> list[tuple[str, str]]:
    """(kind, text): chat and code prompts interleaved 3 to 2 (the first pass's 60 % chat)."""
    convs, _ = conversations()
    chat = [c[0]["content"] for i, c in enumerate(convs)
            if not held_out(i) and c[0]["role"] == "user" and 20 <= len(c[0]["content"]) <= MAX_CHARS]
    code = code_tasks(code_documents())
    out, a, b = [], 0, 0
    while (a < len(chat) or b < len(code)) and len(out) < limit:
        if b >= len(code) or (a < len(chat) and a * 2 <= b * 3):
            out.append(("chat", chat[a]))
            a += 1
        else:
            out.append(("code", code[b]))
            b += 1
    return out


def answer(pair, text: str, new: int, method: str = "draft", template: bool = True) -> tuple[list[int], int]:
    """(the prompt's ids (through the chat template unless `template` is off) and the target's greedy
    answer (the draft's chain), the prompt's length)."""
    from ..engine.events import RunSummary
    from ..run.request import encode_prompt, make_request
    from ..run.runner import run_events
    req = make_request(text, method=method, gamma="auto", max_new_tokens=new, chat_template=template)
    ids = encode_prompt(pair.tokenizer, req)
    got = [e for e in run_events(pair, req, "speculative", ids) if isinstance(e, RunSummary)]
    return ids + list(got[-1].token_ids), len(ids)


def answer_batch(pair, texts: list[str], new: int, template: bool = True) -> list[tuple[list[int], int]]:
    """answer() for several prompts in one batched greedy generate (left-padded), each answer cut after
    its first stop token: (ids, prompt length) each. Why: a CPU step reads the weights once for every
    row, so 8 prompts at once write 64 tokens/s where one writes 17 through the same module path (2-core
    Zen 4, w4a8, 2026-11-30); a whole pass with its states read ran at 46 tokens/s against the draft's
    chain's 43, one prompt at a time. The padded batch rounds otherwise than one prompt's forward, so
    near-ties break otherwise (3 of 8 answers equalled the chain's over 48 tokens, one parting at a top-2
    gap of 0.02): these are training text, and their states are read again by the pass's prompt read."""
    from ..run.request import encode_prompt, make_request
    tok = pair.tokenizer
    prompts = [encode_prompt(tok, make_request(t, max_new_tokens=new, chat_template=template)) for t in texts]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else pair.eos_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = pair.target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                   eos_token_id=list(pair.eos_ids), pad_token_id=pad, top_p=None, top_k=None,
                                   temperature=None)
    got = []
    for p, row in zip(prompts, out[:, width:].tolist(), strict=True):
        stop = next((i + 1 for i, t in enumerate(row) if t in pair.eos_ids), len(row))
        got.append((p + row[:stop], len(p)))
    return got


def run_answers(pair, out: Path, minutes: float, new: int = NEW_TOKENS, log=print, method: str = "draft",
                items=None, shard_tokens: int | None = None, raw_code: bool = False, batch: int = 1,
                start: int = 0) -> dict:
    """Asks, answers and reads prompts into shards under `out` for about `minutes`, resuming where
    meta.json says. items: (kind, text) prompts (default: prompts(), or with `raw_code` the code tasks
    alone, completed as written, with no chat template: the bench's code task and the page's
    code-completion preset). batch > 1: that many prompts a batched generate (answer_batch), not the
    `method` chain one by one. start: a new folder's first prompt (past those another folder read)."""
    meta = open_pass(out)
    if meta.get("raw_code", raw_code) != raw_code:
        held = "without" if meta["raw_code"] else "with"
        raise RuntimeError(f"{out} holds answers {held} the chat template: use another --out")
    if items is None:
        items = [("code", t) for t in code_tasks(code_documents())] if raw_code else prompts()
    meta.update({"what": "the target's own greedy completions of code, no chat template" if raw_code else
                 "the target's own greedy answers", "raw_code": raw_code, "new_tokens": new,
                 "method": f"batched generate, {batch} prompts" if batch > 1 else method,
                 "precision": precision_of(pair.target), "held_out": "as the first pass"})
    meta.setdefault("shards", [])
    meta.setdefault("start", start)  # the first prompt this folder read
    t_end = time.perf_counter() + minutes * 60
    buf: dict[str, list] = {"ids": [], "h": [], "seg": [], "kind": [], "ans": []}
    t0 = time.perf_counter()
    j = j0 = meta.get("next_window", start)
    tokens0 = meta.get("tokens", 0)
    stretch = {"began_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}  # the card lists each run
    meta["stretches"] = [*meta.get("stretches", []), stretch]
    while j < len(items) and time.perf_counter() < t_end:
        group = items[j: j + batch]
        t1 = time.perf_counter()
        if batch > 1:
            got = answer_batch(pair, [text for _, text in group], new, template=not raw_code)
        else:
            got = [answer(pair, group[0][1], new, method, template=not raw_code)]
        log(f"answers: prompts {j}-{j + len(group) - 1}: {sum(len(g[0]) for g in got)} tokens in "
            f"{time.perf_counter() - t1:.1f} s")
        for (kind, _), (ids, prompt_len) in zip(group, got, strict=True):
            add_window(buf, j, kind, ids, states(pair.target, ids))
            ans = torch.zeros(len(ids), dtype=torch.int8)  # row i's next token is the answer's
            ans[prompt_len - 1: len(ids) - 1] = 1
            buf["ans"].append(ans)
            j += 1
        n = sum(len(x) for x in buf["ids"])
        if n >= (shard_tokens or 8192) or j == len(items) or time.perf_counter() >= t_end:
            stretch.update(prompts=j - j0, tokens=meta.get("tokens", 0) + n - tokens0,
                           minutes=round(minutes - (t_end - time.perf_counter()) / 60, 1))
            t0 = write_shard(out, buf, meta, j, t0)
            buf = {k: [] for k in buf}
            log(f"answers: {meta['tokens']:,} tokens, {j} prompts, {meta['seconds']:.0f} s")
    return meta
