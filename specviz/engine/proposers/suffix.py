"""Suffix decoding: free drafts copied from text that already exists (SuffixDecoding,
Oliaro et al., arXiv 2411.04975). A suffix tree over this run's prompt and output,
and one over the visitor's own earlier outputs (engine/suffix_tree.Memory), propose
the continuation that most often followed the context's tail. No model runs. Other
visitors' runs of the shipped presets (Memory's PRESETS scope) are read only when the
visitor turned "share memory" on (RunRequest.share_memory; issue 71).

Its q is one-hot, as for prompt lookup: a token is accepted with probability p(x)
and a rejection resamples from p with x removed, so the target's law is kept under
sampling. Which tokens it proposes, and how many, depends on committed tokens only.

How many: the tree's path probabilities are calibrated online, per match-length
bucket, as confirmed ÷ predicted over the positions the committed text decided; the
length k maximises expected tokens (1 + E[accepted]) over the verify's measured
cost v(k) in plain steps, as lookup's does; k = 0 (a plain step) unless some k pays.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..proposer import Proposal, Proposer, register, target_vocab
from ..suffix_tree import DEPTH, MEMORY, PRESETS, Draft, Memory, SuffixTree
from ..theory import MAX_GAMMA

BUCKETS = (1, 2, 4, 8)  # match lengths 1, 2-3, 4-7, 8+: a one-token match is mostly chance
SELF = 0  # the doc id of this run's own sequence in its local tree


def bucket(m: int) -> int:
    return sum(1 for b in BUCKETS if m >= b) - 1


@dataclass
class Calibration:
    """Per bucket: discounted confirmed ÷ predicted conditional probabilities, with a prior."""

    prior: float = 0.8
    weight: float = 3.0
    decay: float = 0.95
    hits: list = field(default_factory=list)
    seen: list = field(default_factory=list)

    def __post_init__(self):
        self.hits = [self.prior * self.weight] * len(BUCKETS)
        self.seen = [self.weight] * len(BUCKETS)

    def ratio(self, m: int) -> float:
        b = bucket(m)
        return self.hits[b] / self.seen[b]

    def add(self, m: int, hit: float, predicted: float) -> None:
        b = bucket(m)
        self.hits[b] = self.decay * self.hits[b] + hit
        self.seen[b] = self.decay * self.seen[b] + predicted

    def expected(self, d: Draft) -> list[float]:
        """E[accepted] for each length k = 1..len: Σ_i Π_j≤i min(1, r · cond_j)."""
        r, out, run, acc, prev = self.ratio(d.match_len), [], 1.0, 0.0, 1.0
        for pr in d.probs:
            run *= min(1.0, r * pr / prev)
            prev = pr
            acc += run
            out.append(acc)
        return out


def conditionals(d: Draft) -> list[float]:
    return [p / (d.probs[i - 1] if i else 1.0) for i, p in enumerate(d.probs)]


@dataclass
class SuffixProposer(Proposer):
    vocab_size: int
    verify_cost: Callable[[int], float] | None = None  # v(k) in plain steps; None: propose the whole chain
    tokenizer: object = None  # for the source's text on the page (None: positions only)
    memory: Memory | None = None  # earlier outputs (None: this run's own text only)
    scope: str | None = None  # whose memory this run reads and writes: the visitor's session
    write_scope: str | None = None  # where its output goes (the session's scope)
    shared_scope: str | None = None  # also written there (PRESETS for a shipped preset's prompt)
    prompt_text: str = ""  # the prompt as the visitor typed it: a source's line is counted in it
    read_memory: bool = True  # False (fresh memory): copy from this run's own text only, still write it
    read_shared: bool = False  # True (share memory): read PRESETS too, every visitor's runs of the presets
    name: str = "suffix"
    chain_formula = False  # a free draft: no γ·c + v(γ) prediction (decoding.speculative)
    cal: Calibration = field(default_factory=Calibration)

    def reset(self, prompt_ids: list[int]) -> int:
        self.tree, self.n_prompt, self.seen = SuffixTree(), len(prompt_ids), 0
        self.cal, self._last = Calibration(), None
        self.mem_doc, self.shared_doc, self._texts, self._nl, self._head = None, None, {}, [0], None
        if self.memory is not None and self.write_scope:
            self.mem_doc = self.memory.new_doc(self.write_scope, scope_label(self.write_scope),
                                               time.monotonic())
        if self.memory is not None and self.shared_scope and self.shared_scope != self.write_scope:
            self.shared_doc = self.memory.new_doc(self.shared_scope, scope_label(self.shared_scope),
                                                  time.monotonic())
        return 0

    def readable(self) -> tuple:
        """The memory scopes this run copies from: its session's, and PRESETS when shared."""
        if self.memory is None or not self.read_memory:
            return ()
        return tuple(dict.fromkeys(s for s in (self.scope, PRESETS if self.read_shared else None) if s))

    # ------------------------------------------------------------ per round
    def propose(self, committed, gamma, params, generator, eos_ids):
        t0 = time.perf_counter()
        d, where = self.lookup(committed, gamma)
        return self.emit(d, where, self.expected_rate(d)[0], committed, eos_ids, t0)

    def lookup(self, committed, gamma) -> tuple[Draft | None, str]:
        """Bring the trees up to `committed`, score last round's draft, find this round's."""
        self._sync(committed)
        self._learn(committed)
        d, where = self.candidate(committed, gamma)
        self._last = (len(committed), d) if d is not None else None
        return d, where

    def emit(self, d: Draft | None, where: str, k: int, committed, eos_ids, t0: float) -> Proposal:
        """The first k tokens of d as a one-hot proposal, with where they came from."""
        tokens = [x for x in d.tokens[:k] if x < self.vocab_size] if d is not None else []
        for i, x in enumerate(tokens):  # nothing useful follows an end-of-sequence
            if x in eos_ids:
                tokens = tokens[: i + 1]
                break
        ms = (time.perf_counter() - t0) * 1e3  # the trees' update and lookup (the one-hot rows: the verify's)
        q = torch.zeros(len(tokens), self.vocab_size)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Proposal(tokens, q, forwards=0, info=self.describe(d, where, len(tokens), committed, ms))

    def candidate(self, committed, gamma) -> tuple[Draft | None, str]:
        """The best chain of the run's own tree and the readable memory, and whose it is."""
        best, where = self.tree.speculate(self.tree.tails(SELF), gamma), "self"
        scopes = self.readable()
        if not scopes:
            return best, where
        tail = committed[-DEPTH:]
        for scope in scopes:
            tree = self.memory.tree(scope)
            if tree is None:
                continue
            with self.memory.lock:
                d = tree.speculate(tree.match(tail), gamma)
            if d is not None and (best is None or d.score > best.score):
                best, where = d, scope
        return best, where

    def _sync(self, committed) -> None:
        new = committed[self.seen:]
        if not new:
            return
        self.tree.add(SELF, new)
        self._count_lines(new)
        out = new[max(0, self.n_prompt - self.seen):]  # memory keeps outputs, never prompts
        if self.mem_doc is not None and out:
            self.memory.extend(self.write_scope, self.mem_doc, out, time.monotonic())
        if self.shared_doc is not None and out:
            self.memory.extend(self.shared_scope, self.shared_doc, out, time.monotonic())
        self.seen = len(committed)

    def _learn(self, seq) -> None:
        """Last round's whole candidate against what was committed since: each position the
        committed text decided (up to and including the first miss) is one observation."""
        if self._last is None:
            return
        at, d = self._last
        got = seq[at:]
        for x, g, cond in zip(d.tokens, got, conditionals(d), strict=False):
            self.cal.add(d.match_len, float(x == g), cond)
            if x != g:
                break
        self._last = None

    def expected_rate(self, d: Draft | None) -> tuple[int, float]:
        """(k, expected tokens per plain-step cost) of the best length of d; (0, 1.0): a plain step."""
        if d is None or self.verify_cost is None:
            return (len(d.tokens), float("inf")) if d is not None else (0, 1.0)
        return best_length(self.cal.expected(d), self.verify_cost)

    # ------------------------------------------------------------ what the page shows
    def describe(self, d: Draft | None, where: str, k: int, committed, ms: float) -> dict:
        """The round's info: which drafter, the lookup's time, and where a draft was copied from
        (the source's text is page bookkeeping, timed apart as describe_ms)."""
        info = {"drafter": "suffix" if k else "none", "source": None,
                "match_len": d.match_len if d is not None else 0,
                "score": round(d.score, 3) if d is not None else 0.0, "lookup_ms": round(ms, 3)}
        if k and d is not None:
            t0 = time.perf_counter()
            info["source"] = self._source(d, where, k, committed)
            info["describe_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        return info

    def _source(self, d: Draft, where: str, k: int, committed) -> dict | None:
        if where == "self" or (d.doc is not None and d.doc in (self.mem_doc, self.shared_doc)):
            start = d.start if where == "self" else self.n_prompt + d.start
            seq, lines = committed, self._nl
            place, label = (("prompt", "the prompt") if start < self.n_prompt else
                            ("output", "this output"))
        else:
            tree = self.memory.tree(where)
            seq = tree.docs.get(d.doc) if tree is not None else None
            if seq is None:
                return None  # forgotten since (evicted): no source to show
            start, place, lines = d.start, "memory", None
            label = self.memory.labels.get((where, d.doc), "an earlier output")
        out = {"where": place, "label": label, "start": start, "end": start + k,
               **self._lines(seq, start, start + k, lines)}
        if out["line_no"] and place != "memory":  # lines of the text the page shows: the prompt as typed
            out["line_no"] -= self._nl[self.n_prompt] if place == "output" else self._template_lines(seq)
        return out

    def _template_lines(self, seq) -> int:
        """Lines a chat template puts before the visitor's prompt text (0 where it is not found)."""
        if self._head is None:
            self._head = 0
            if self.prompt_text and self.tokenizer is not None:
                with contextlib.suppress(Exception):
                    shown = self.tokenizer.decode(seq[: self.n_prompt])
                    at = shown.find(self.prompt_text.strip()[:200])
                    self._head = shown[:at].count("\n") if at > 0 else 0
        return self._head

    def _lines(self, seq, start: int, end: int, lines: list | None) -> dict:
        if self.tokenizer is None:
            return {"line_no": 0, "text": "", "span": ""}
        try:
            before = self.tokenizer.decode(seq[max(0, start - 48):start])
            head = before[before.rfind("\n") + 1:]
            span = self.tokenizer.decode(seq[start:end])
            after = self.tokenizer.decode(seq[end:end + 24]).split("\n")[0]
            line_no = 1 + (lines[start] if lines is not None and start < len(lines) else
                           self.tokenizer.decode(seq[:start]).count("\n"))
        except Exception:  # a tokenizer that cannot decode: positions still say where
            return {"line_no": 0, "text": "", "span": ""}
        return {"line_no": line_no, "text": (head + span + after)[:300], "span": span}

    def _count_lines(self, new) -> None:
        """self._nl[i]: newlines in the committed tokens before position i (one decode per token id)."""
        if self.tokenizer is None:
            return
        nl = self._nl
        for x in new:
            t = self._texts.get(x)
            if t is None:
                try:
                    t = self._texts[x] = self.tokenizer.decode([x]).count("\n")
                except Exception:
                    t = self._texts[x] = 0
            nl.append(nl[-1] + t)


@dataclass
class SuffixTreeProposer(SuffixProposer):
    """Tree mode: the suffix tree's best-first token tree (several continuations of the context
    at once), verified in one forward by the tree verifier (tree_decoding.py), each child a
    one-hot draft (tree_sampling.accept_sampled, q None). Its size is the prefix of the best-first order
    that maximises (1 + E[accepted path]) / v(nodes)."""

    name: str = "suffix-tree"
    budget: int = MAX_GAMMA  # nodes, at most: v(k) is measured up to 16 rows
    shape: tuple = ()  # neither a static shape nor an auto width: the tree prices its own size

    def propose(self, committed, depth, params, generator, eos_ids, width=None):
        t0 = time.perf_counter()
        d, k, _ = self.tree_lookup(committed, depth)
        return self.tree_emit(d, k, committed, t0)

    def tree_lookup(self, committed, depth):
        """(tree draft or None, its priced size k, expected tokens per plain-step cost)."""
        self._sync(committed)
        self._learn(committed)
        d = self.tree.speculate_tree(self.tree.tails(SELF), self.budget, depth)
        if d is None:
            return None, 0, 1.0
        k, rate = ((len(d.tokens), float("inf")) if self.verify_cost is None else
                   best_length(self._tree_expected(d), self.verify_cost))
        k = min([k] + [i for i, x in enumerate(d.tokens) if x >= self.vocab_size])
        chain = Draft([d.tokens[i] for i in d.chain], [d.probs[i] for i in d.chain], d.match_len, d.doc,
                      d.end)
        self._last = (len(committed), chain)  # the most probable path calibrates, as a chain's
        return d, k, rate

    def tree_emit(self, d, k: int, committed, t0: float):
        from .tree import TreeProposal
        tokens, parents = (d.tokens[:k], d.parents[:k]) if k else ([], [])
        ms = (time.perf_counter() - t0) * 1e3
        main = [i for i in d.chain if i < k] if d is not None else []
        info = self.describe(self._last[1] if d is not None else None, "self", len(main), committed, ms)
        info["drafter"] = "suffix" if k else "none"
        return TreeProposal(tokens, parents, None, 0, fixed=True, info=info)

    def _tree_expected(self, d) -> list[float]:
        """E[accepted path] of each best-first prefix: Σ over its nodes of Π (r · cond) to the root."""
        r, reach, out, acc = self.cal.ratio(d.match_len), [], [], 0.0
        for i, (par, pr) in enumerate(zip(d.parents, d.probs, strict=True)):
            up = d.probs[par] if par >= 0 else 1.0
            reach.append(min(1.0, r * pr / up) * (reach[par] if par >= 0 else 1.0))
            acc += reach[i]
            out.append(acc)
        return out

    def rollback_tree(self, committed, path):
        """Nothing to undo: the trees catch up on `committed` at the next propose."""


def best_length(expected: list[float], verify_cost: Callable[[int], float]) -> tuple[int, float]:
    """The k maximising (1 + E[accepted of k]) / v(k); (0, 1.0) when none beats a plain step."""
    best, best_rate = 0, 1.0
    for k, e in enumerate(expected, 1):
        rate = (1.0 + e) / verify_cost(k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best, best_rate


def summarize(infos: list[dict]) -> dict:
    ms = [i.get("lookup_ms", 0.0) for i in infos]
    kinds = [i.get("drafter") for i in infos]
    out = {f"{k}_rounds": kinds.count(k) for k in ("suffix", "model", "none") if k in kinds}
    out["lookup_ms_mean"] = round(sum(ms) / len(ms), 3)
    out["lookup_ms_max"] = round(max(ms), 3)
    return out


def round_note(info: dict) -> str:
    src, read, waits = info.get("source"), info.get("draft_read"), info.get("draft_waits")
    if info.get("drafter") == "model":
        first = f"it first read the {read} tokens it had skipped (the prompt); " if read else ""
        return ("draft model ran this round (the suffix draft was priced lower); " + first + "its chain "
                "stopped where one more token, by the last one's confidence, no longer paid "
                "for a draft step and a verify row")
    if waits:
        return round_note({k: v for k, v in info.items() if k != "draft_waits"}) + (
            f"; the draft model waits: reading the {waits} tokens it skipped would not pay yet")
    if not src:
        return (f"suffix: no draft worth its verify rows (best match {info.get('match_len', 0)} tokens, "
                f"lookup {info.get('lookup_ms', 0)} ms)")
    line = f", line {src['line_no']}" if src.get("line_no") else ""
    return (f"suffix: copied {src['end'] - src['start']} tokens from {src['label']}{line} "
            f"(match {info.get('match_len', 0)} tokens, lookup {info.get('lookup_ms', 0)} ms)")


def scope_label(scope: str) -> str:
    """How the page names an earlier output held in `scope`."""
    return "a preset's earlier output, shared by visitors" if scope == PRESETS else "your earlier run"


def build_suffix(pair, req=None, cls=None) -> SuffixProposer:
    """A session's run reads and writes its own scope; a shipped preset's output (no visitor's text)
    also goes to PRESETS, which a run reads only with share memory on (off by default; issue 71: a new
    session's first suffix run of a preset had copied 78 of 96 tokens from other visitors' runs)."""
    from ...prompts import load_presets
    from ..gamma import monotone
    costs, scope = pair.costs, getattr(req, "scope", None)
    shared = None
    if scope and req is not None and any(p["prompt"] == req.prompt for p in load_presets()):
        shared = PRESETS
    return (cls or SuffixProposer)(target_vocab(pair.target),
                          verify_cost=monotone(costs.verify_cost) if costs is not None else None,
                          tokenizer=pair.tokenizer, memory=MEMORY if scope else None, scope=scope,
                          write_scope=scope, shared_scope=shared,
                          prompt_text=getattr(req, "prompt", "") or "",
                          read_memory=not getattr(req, "fresh_memory", False),
                          read_shared=getattr(req, "share_memory", False) is True)


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: rarely by much: it drafts only where copied text pays for its verify "
    "rows. On text that repeats nothing it runs as plain decoding, plus the suffix tree's lookups.")


@register("suffix", "suffix tree", order=3, own_gamma=True, summarize=summarize, round_note=round_note,
          loses_when=LOSES,
          description="copy what most often followed the context's tail in this prompt, this output or "
                      "your own earlier outputs; only as many tokens as pay for their verify rows")
def _build_suffix(pair, req=None):
    return build_suffix(pair, req)


@register("suffix-tree", "copied-text token tree (suffix)", order=11, own_gamma=True, kind="tree",
          loses_when=LOSES, summarize=summarize, round_note=round_note,
          description="the suffix tree's most frequent continuations of this prompt and output as one "
                      "token tree, verified in one forward; as many nodes as pay for their verify rows")
def _build_suffix_tree(pair, req=None):
    return build_suffix(pair, req, cls=SuffixTreeProposer)
