"""The greedy decode loops over static caches and replayed graphs (gpt-fast's pattern, no torch.compile).

Each loop is a generator that enqueues device work and yields whenever the host could let the
other side of a race run (scheduler.py): after a batch of plain steps, after a speculative round's
drafts, verify and acceptance. It reads the host only after resuming, when the scheduler has seen
that work finish (an event's query()), so a read never blocks the other side. Its value
(StopIteration.value, or drive()'s return) is the tokens.

Plain: one captured 1-token graph replayed per token, the next token chosen on the device; tokens
stay on the device until the end. Speculative: per round γ draft steps (the draft's 1-token graph),
one target verify of exactly γ+1 rows (its own graph: the last token and the γ drafts), and the
acceptance computed on the device (argmax of every verify row against the drafts, the accepted
prefix length by a cumulative product); the host reads the round's verdict once (one sync a round).
A round that accepted every draft feeds the last draft to the draft model (one more 1-token step),
as gpt-fast does, so the draft's cache holds every committed token.

With graphs off (StaticModel(graphs=False), any CPU) the same loop runs the same forwards eagerly:
that is how its exactness against the dynamic-cache path is tested without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .static import StaticModel

PLAIN_BATCH = 8  # plain steps enqueued between two yields: one event and one poll per 8 tokens


@dataclass
class SpecRun:
    """A greedy speculative run: the tokens (exactly as many as asked) and what each round accepted."""

    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # drafts accepted per round (0..γ)
    gamma: int = 0

    @property
    def alpha(self) -> float | None:
        """Accepted ÷ drafted."""
        return sum(self.accepted) / (self.gamma * len(self.accepted)) if self.accepted else None

    @property
    def tokens_per_round(self) -> float | None:
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else None


def _ids(prompt, device) -> torch.Tensor:
    return torch.as_tensor(list(prompt), dtype=torch.long, device=device)


def drive(loop):
    """Run a loop generator alone to its end -> its value."""
    while True:
        try:
            next(loop)
        except StopIteration as done:
            return done.value


@torch.no_grad()
def prefill(model: StaticModel, prompt) -> torch.Tensor:
    """Read the prompt (eager: its length varies) -> the first new token, on the device, shape [1]."""
    logits = model.run(_ids(prompt, model.device), 0)
    return logits[0, -1:].argmax(-1)


@torch.no_grad()
def plain_loop(target: StaticModel, prompt, new: int, batch: int = PLAIN_BATCH):
    """`new` greedy tokens, one 1-token forward each, chained on the device; yields every `batch`."""
    target.capture(1)
    toks = torch.empty(new, dtype=torch.long, device=target.device)
    toks[:1] = prefill(target, prompt)
    pos, i = len(prompt), 1
    yield
    while i < new:
        for _ in range(min(batch, new - i)):
            toks[i:i + 1] = target.run(toks[i - 1:i], pos)[0, -1:].argmax(-1)
            pos, i = pos + 1, i + 1
        yield
    return toks.tolist()


def plain_greedy(target: StaticModel, prompt, new: int) -> list[int]:
    return drive(plain_loop(target, prompt, new))


@torch.no_grad()
def _draft(draft: StaticModel, last: torch.Tensor, pos: int, gamma: int) -> torch.Tensor:
    """γ greedy draft tokens after `last` (at pos), chained on the device -> [γ]."""
    toks = []
    x = last
    for i in range(gamma):
        x = draft.run(x, pos + i)[0, -1:].argmax(-1)
        toks.append(x)
    return torch.cat(toks)


@torch.no_grad()
def accept(target_rows: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """On the device: [n accepted, the target's γ+1 greedy tokens] from the verify's logits
    [γ+1, vocab] and the γ drafts. The accepted drafts equal the target's first n tokens, and
    its token n is the correction (or, all accepted, the bonus): the round commits tokens[:n+1]."""
    best = target_rows.argmax(-1)
    n = (best[:-1] == drafts).to(torch.int32).cumprod(0).sum()
    return torch.cat([n.view(1).to(best.dtype), best])


@torch.no_grad()
def speculative_loop(target: StaticModel, draft: StaticModel, prompt, new: int, gamma: int):
    """Greedy speculative decoding of `new` tokens: the same tokens as plain_greedy by construction
    (every committed token is the target's argmax after its prefix), one host read a round."""
    target.capture(gamma + 1), draft.capture(1)
    last = prefill(target, prompt)
    prefill(draft, prompt)
    yield
    run = SpecRun([], gamma=gamma)
    pos = len(prompt)  # where `last` goes
    run.tokens += last.tolist()  # the prompt's token: read once, as plain's is
    while len(run.tokens) < new:
        drafts = _draft(draft, last, pos, gamma)
        rows = target.run(torch.cat([last, drafts]), pos)[0]
        verdict = accept(rows, drafts).clone()  # rows: the graph's buffer, replayed again next round
        yield  # the scheduler resumes this side once the round's work is done
        host = verdict.tolist()  # the one read of the round
        n = host[0]
        run.tokens += host[1:n + 2]
        run.accepted.append(n)
        if n == gamma:  # the draft never read its last draft: read it now, the bonus follows it
            draft.run(drafts[-1:], pos + gamma)
        last = verdict[n + 1:n + 2]
        pos += n + 1
    run.tokens = run.tokens[:new]
    return run


def speculative_greedy(target: StaticModel, draft: StaticModel, prompt, new: int, gamma: int) -> SpecRun:
    return drive(speculative_loop(target, draft, prompt, new, gamma))


def cache_len(prompt_len: int, new: int, gamma: int) -> int:
    """Positions a static cache needs for a run: the prompt, the tokens, one verify past the end."""
    return prompt_len + new + gamma + 2
