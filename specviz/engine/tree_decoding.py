"""Tree speculative decoding: the proposer drafts a token tree, the target
verifies every node in ONE forward (tree attention mask), and the longest
acceptable path plus one target token is committed. Yields the same events as
decoding.speculative; each RoundEvent also carries a small `tree` record.

Cache invariant as in decoding.py: the target's KV cache holds every committed
token but the last. After verification it keeps exactly the accepted path's
entries (gathered, then cropped); no rejected node survives the round.
"""
from __future__ import annotations

import threading
from typing import Iterator

import torch
from transformers import DynamicCache

from .events import Outcome, RoundEvent, RunSummary, commit_round, round_tokens
from .forward import crop_cache, keep_cache_slots, path_extra
from .proposer import TreeProposer
from .rounds import Clock, cut_at_eos, drive_rounds, make_generator, new_summary, pad_to
from .sampling import SamplingParams, greedy_rows, overlap, top2_gap, warp
from .text import TextStream
from .tree_forward import tree_forward_logits
from .tree_sampling import accept_greedy, accept_sampled, depths_of, describe_tree


def _verify(target, cache, fed, prop, params, gen, forward=tree_forward_logits):
    """One target forward over fed + tree; returns (p rows, verdict, q rows, gaps, argmaxes).
    forward: tree_forward_logits, or the proposer's verify_tree (supplies_verify_logits) that runs it
    and keeps what it reads of the target's states."""
    depths = depths_of(prop.parents)
    logits = forward(target, cache, fed=fed, tokens=prop.tokens, parents=prop.parents,
                     depths=depths, keep=len(prop.tokens) + 1)
    if prop.fixed:  # copied children: no draft law, each child a one-hot draft
        return _verify_fixed(logits, prop, params, gen)
    q = pad_to(prop.q.to(logits.device), logits.shape[-1])
    if params.greedy:  # gaps: the bench tells a bf16 near-tie from a bug with them
        p, best = greedy_rows(logits)
        best = best.tolist()
        return p, accept_greedy(prop.tokens, prop.parents, p, best), q, top2_gap(logits), best
    p = warp(logits, params)
    return p, accept_sampled(prop.tokens, prop.parents, p, q, gen), q, None, None


def _verify_fixed(logits, prop, params, gen):
    if params.greedy:
        p, best = greedy_rows(logits)
        best = best.tolist()
        return p, accept_greedy(prop.tokens, prop.parents, p, best), None, top2_gap(logits), best
    p = warp(logits, params)
    return p, accept_sampled(prop.tokens, prop.parents, p, None, gen), None, None, None


def _node_stats(prop, p, q, best: list[int] | None):
    """q(x), p(x) and Σ min(p, q) of each node, read at its parent's row (gathered at the nodes,
    the overlap once per parent: a copy of a full row per node costs time). Greedy p is one-hot
    at its row's argmax (`best`), so Σ min(p, q) is q there."""
    if not prop.tokens:
        return [], [], []
    if q is None:  # copied children: q(x) = 1, Σ min(p, one-hot x) = p(x) (greedy: 1 at the argmax)
        p_x = [float(p[par + 1, x]) for x, par in zip(prop.tokens, prop.parents, strict=True)]
        ov = p_x if best is None else [float(best[par + 1] == x)
                                        for x, par in zip(prop.tokens, prop.parents, strict=True)]
        return [1.0] * len(p_x), p_x, ov
    rows = torch.tensor([par + 1 for par in prop.parents], dtype=torch.long)
    x = torch.tensor(prop.tokens, dtype=torch.long)
    at = torch.tensor(sorted(set(prop.parents)), dtype=torch.long) + 1
    if best is not None:
        ov = q[at, torch.tensor(best)[at]]
    else:
        ov = overlap(p[at], q[at])
    ov = dict(zip((at - 1).tolist(), ov.tolist(), strict=True))
    return q[rows, x].tolist(), p[rows, x].tolist(), [ov[u] for u in prop.parents]


def _tested(prop, v, n_path: int, ov: list[float], greedy: bool) -> list[float]:
    """Σ min(p, q) along the accepted path, then at the path end's first tested child: the
    positions a chain's γ policy learns from. Greedy: 1 for a kept node, 0 for the failed one, as
    a chain's one-hot q gives (a tree ranks its children by the draft's soft q, whose overlap with
    p would read as a lower acceptance than the tree gets)."""
    end = v.path[n_path - 1] if n_path else -1
    failed = [c for c in v.tested if prop.parents[c] == end and c not in v.path[:n_path]][:1]
    if greedy:
        return [1.0] * n_path + [0.0] * len(failed)
    return [ov[i] for i in v.path[:n_path]] + [ov[c] for c in failed]


def _width_rows(prop, v, q, best: list[int] | None) -> list[tuple[float, list[bool]]]:
    """What gamma.TreeWidth learns from: each row whose children were tested, its draft doubt
    (1 - max q) and the outcomes by child order. Greedy: up to the rank in q of the target's
    choice (the row's argmax, `best`), whatever children the tree had."""
    out = []
    for w in dict.fromkeys(prop.parents[c] for c in v.tested):  # each was opened: its doubt is read
        if best is not None:
            qrow = q[w + 1]
            rank = int((qrow > qrow[best[w + 1]]).sum())  # elder choices the target passed over
            out.append((prop.doubt[w], [False] * rank + [True]))
        else:
            out.append((prop.doubt[w], [c in v.path for c in v.tested if prop.parents[c] == w]))
    return out


def _round_tokens(stream, prop, v, new, n_path, appended, p, p_x, q_x, r, t, gaps):
    """TokenEvents of a round in display order: path, first rejected child, appended.
    A node's token was chosen at its parent's row (row 0: the last committed token)."""
    gap = (lambda row: gaps[row]) if gaps else (lambda row: None)
    accepted = [(new[i], dict(p=p_x[node], q=q_x[node], gap=gap(prop.parents[node] + 1)))
                for i, node in enumerate(v.path[:n_path])]
    rejected = last = None
    if appended:
        parent = v.path[-1] if v.path else -1
        rej = next((c for c in v.tested if prop.parents[c] == parent), None) if v.resampled else None
        if rej is not None:
            rejected = (prop.tokens[rej], len(v.path) + 1, dict(p=p_x[rej], q=q_x[rej]))
        row = (v.path[-1] + 1) if v.path else 0
        kind = Outcome.RESAMPLED if v.resampled else Outcome.BONUS
        last = (v.token, kind, dict(p=float(p[row, v.token]), gap=gap(row)))
    return round_tokens(stream, t, r, accepted, rejected, last)


@torch.inference_mode()
def tree_speculative(target, proposer: TreeProposer, tokenizer, prompt_ids: list[int], max_new_tokens: int,
                     depth: int, params: SamplingParams, eos_ids=(), seed: int | None = None,
                     stop: threading.Event | None = None, clock: Clock | None = None, *,
                     policy=None, width=None) -> Iterator[RoundEvent | RunSummary]:
    """Tree speculation; `depth` is the deepest tree level (the page's γ; see proposers/tree.py).
    The summary's gamma records it. policy: γ auto's (engine/gamma.py) picks each round's depth, at
    most `depth`, and learns from the overlaps along the accepted path and the child that failed.
    width (gamma.TreeWidth, an auto budget): sizes each tree from measured costs, its depth too
    (at most `depth`), and learns from every tested row."""
    eos = frozenset(eos_ids)
    gen = make_generator(target.device, seed)
    clock = clock or Clock(target.device)
    cache = DynamicCache()
    stream = TextStream(tokenizer)
    # Leviathan's chain formula does not model a tree (on the default pair it predicted 0.94× for a
    # 16-node tree that measured 1.83×): no prediction or best γ is shown; τ is the tree's measure
    s = new_summary(proposer.name, depth, target.device, unmeasured=["predicted"],
                    gamma_policy=getattr(policy, "name", ""))
    s.extra.update(path_extra(target, cache))  # the model is on graphs: this run is not
    if width is not None:  # the width rule sizes the tree, its depth too: the γ policy is not asked
        policy = None
    committed = list(prompt_ids)
    proposer.reset(prompt_ids)
    forward = tree_forward_logits
    if getattr(proposer, "supplies_verify_logits", False):
        forward = proposer.verify_tree

    def one_round(r: int, remaining: int) -> RoundEvent:
        t_start = clock.now()
        d = policy.next_gamma(depth) if policy is not None else depth
        proposer.remaining = remaining
        prop = proposer.propose(committed, min(d, max(1, remaining - 1)), params, gen, eos, width=width)
        t_drafted = clock.now()
        n_prefix = len(committed)
        fed = committed[cache.get_seq_length():]
        p, v, q, gaps, best = _verify(target, cache, fed, prop, params, gen, forward)
        t_end = clock.now()
        # EOS or the budget can end the output inside the path
        new, ended = cut_at_eos([prop.tokens[i] for i in v.path] + [v.token], eos, remaining)
        n_path = min(len(v.path), len(new))
        appended = len(new) == len(v.path) + 1
        committed.extend(new)
        keep_cache_slots(cache, prefix=n_prefix, slots=[n_prefix + i for i in v.path[:n_path]])
        crop_cache(cache, len(committed) - 1)
        proposer.rollback_tree(committed, v.path[:n_path])

        q_x, p_x, ov = _node_stats(prop, p, q, best)
        if width is not None:
            width.observe(_width_rows(prop, v, q, best))
        if policy is not None:
            policy.observe(_tested(prop, v, n_path, ov, params.greedy), n_path)
        tokens = _round_tokens(stream, prop, v, new, n_path, appended, p, p_x, q_x, r, t_end, gaps)
        texts = [stream.token_text(x) for x in prop.tokens + [v.token]]
        commit_round(s, new, drafted=len(prop.tokens), accepted=n_path, draft_forwards=prop.forwards,
                     overlap_sum=sum(ov), prompt_tokens=len(fed) - 1, t_draft=t_drafted - t_start,
                     t_verify=t_end - t_drafted, t_end=t_end, hit_eos=ended)
        tree = describe_tree(prop.tokens, prop.parents, q_x, p_x, v, v.token if appended else -1,
                             texts=texts[:-1], appended_text=texts[-1])
        tree["path"] = tree["path"][:n_path]
        return RoundEvent(
            index=r, gamma=len(prop.tokens), draft_ids=list(prop.tokens), q=q_x, p=p_x, u=list(v.u),
            overlap=ov, n_accepted=n_path, appended_id=v.token if appended else -1,
            resampled=v.resampled and appended, t_start=t_start, t_draft=t_drafted - t_start,
            t_verify=t_end - t_drafted, t_end=t_end, draft_forwards=prop.forwards, tokens=tokens,
            total_tokens=len(s.token_ids), total_drafted=s.drafted, total_accepted=s.accepted,
            target_forwards=s.target_forwards, prompt_tokens=len(fed) - 1, tree=tree,
            info=dict(getattr(prop, "info", None) or {}))

    yield from drive_rounds(s, stream, clock, max_new_tokens, stop, one_round)

