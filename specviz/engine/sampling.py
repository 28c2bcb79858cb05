"""Sampling math for speculative decoding: pure functions on tensors.

Everything here works on probability vectors of shape (..., vocab) and knows
nothing about models, time or I/O, so it can be tested exhaustively.

Greedy (temperature 0) is handled as the argmax special case: the warped
distribution is one-hot, which makes the accept test and the residual draw
reduce exactly to "keep the draft token iff it is the target's argmax, else
take the target's argmax".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Below this total mass the residual max(0, p - q) is numerically empty
# (p == q up to rounding); we fall back to p, which is then the same law.
RESIDUAL_EPS = 1e-9


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits (..., V) into probabilities (..., V), float32.

    The same warp is applied to the target's p and the draft's q, so the
    speculative output follows exactly the warped target distribution.
    """
    logits = logits.float()
    if params.greedy:
        return greedy_rows(logits)[0]
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p;
        # the most likely token is always kept
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, sorted_idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


class Gap(float):
    """A greedy row's top-1 minus top-2 logit: a plain float to every reader (JSON,
    charts), which also remembers the two tokens and the top logit, so
    run/equality.py can check a differing token against the row that chose it."""

    def __new__(cls, gap: float, top: int, second: int, top_logit: float):
        g = super().__new__(cls, gap)
        g.top, g.second, g.top_logit = top, second, top_logit
        return g

    def __reduce__(self):  # copy/deepcopy/pickle keep the tokens
        return (Gap, (float(self), self.top, self.second, self.top_logit))


def greedy_rows(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy p (one-hot at each row's argmax) and those argmaxes: ties broken by the lowest
    index, as torch.argmax does in plain decoding."""
    idx = logits.float().argmax(dim=-1, keepdim=True)
    return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0), idx.squeeze(-1)


def top2_gap(logits: torch.Tensor) -> list[Gap]:
    """Per row of logits (..., V): top-1 minus top-2 logit, in the logits' own
    precision (a gap of 0.0 in bf16 is an exact tie there), with both tokens."""
    top = logits.reshape(-1, logits.shape[-1]).topk(2, dim=-1)
    return gaps_of(top.values.float().tolist(), top.indices.tolist())


def gaps_of(values, indices) -> list[Gap]:
    """top2_gap from its rows read to the host: [[top-1, top-2 logit], ...] and their token ids."""
    # an exact tie: torch.argmax (the token the run took) is the lower index, topk's order is not fixed
    return [Gap(a - b, *((int(t), int(s)) if a > b else sorted((int(t), int(s)))), a)
            for (a, b), (t, s) in zip(values, indices, strict=True)]


def greedy_row(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """On the device, nothing read: a plain greedy step's token [1] (torch.argmax: ties go to the
    lowest index) and its row [token, top-2 ids, top-2 logits] in float64 (exact for every id and
    for the logits of any float type), for greedy_of once read."""
    x = logits.argmax().view(1)
    top = logits.topk(2)
    return x, torch.cat([x.double(), top.indices.double(), top.values.double()])


def greedy_of(row) -> tuple[int, Gap]:
    """A greedy_row read to the host -> (token, its top2_gap)."""
    return int(row[0]), gaps_of([row[3:5]], [row[1:3]])[0]


def greedy_pick(logits: torch.Tensor) -> tuple[int, Gap]:
    """A plain greedy step from one row of logits (V,): torch.argmax's token (ties: the lowest
    index) and the row's top2_gap, read from the device at once. Why: on a GPU every read is a sync,
    and warp's one-hot, pick's argmax, p[x] and the gap were four (2026-11-28 H200: plain at
    149-153 tok/s on a 3.9 ms graph step)."""
    return greedy_of(greedy_row(logits)[1].tolist())


def plain_row(logits: torch.Tensor, params: SamplingParams, generator=None):
    """On the device, nothing read: a plain step's token [1] (fed to the next forward as it is) and
    its row for plain_of: greedy_row's, or [token, p(token)] sampled (drawn as pick draws it, so a
    seeded run gives the same tokens)."""
    if params.greedy:
        return greedy_row(logits)
    p = warp(logits, params)
    x = sample(p, generator).view(1)
    return x, torch.cat([x.double(), p[x].double()])


def plain_of(row, params: SamplingParams) -> tuple[int, float, Gap | None]:
    """A plain_row read to the host -> (token, p(token), gap): greedy p is 1 (one-hot) with its gap."""
    if params.greedy:
        x, gap = greedy_of(row)
        return x, 1.0, gap
    return int(row[0]), row[1], None


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row from probs (..., V). Returns shape (...)."""
    flat = probs.reshape(-1, probs.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(probs.shape[:-1])


def draw_uniform(n: int, generator: torch.Generator | None = None, device="cpu") -> torch.Tensor:
    if generator is not None:
        device = generator.device  # a generator only feeds its own device
    return torch.rand(n, generator=generator, device=device)


def accept_mask(p_x: torch.Tensor, q_x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accept draft token x iff u < p(x) / q(x).

    Written as u * q < p so q(x) == 0 never divides; with q(x) == 0 the draft
    could not have proposed x, and u * 0 < p(x) is false only when p(x) == 0,
    so we reject explicitly for q(x) == 0 to be safe.
    """
    return (u * q_x < p_x) & (q_x > 0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p when the residual mass is ~0."""
    r = (p - q).clamp_min(0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > RESIDUAL_EPS, r / mass.clamp_min(RESIDUAL_EPS), p)


def accept_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)), the probability that the accept test passes."""
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(1e-30)).clamp_max(1.0), torch.zeros_like(p_x))


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Σ_x min(p(x), q(x)) per row: the exact acceptance probability of a draft
    token given the prefix (1 - total variation). Its mean over drafted positions is
    α̂, the expected acceptance (Leviathan et al.'s α)."""
    return torch.minimum(p, q).sum(dim=-1)


@dataclass
class Verdict:
    """Outcome of verifying one round of γ drafted tokens."""

    n_accepted: int  # how many drafted tokens were kept (prefix length)
    token: int  # the token appended after them
    resampled: bool  # True: drawn from the residual after a rejection; False: bonus
    u: list[float]  # uniforms used for each tested draft position
    p_x: list[float]  # p(x) for each drafted token
    q_x: list[float]  # q(x) for each drafted token
    overlap: list[float]  # Σ min(p, q) for each drafted position


def verify(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
) -> Verdict:
    """Modified rejection sampling for one round.

    draft_tokens: (γ,) long; q: (γ, V) draft distributions they were drawn from;
    p: (γ + 1, V) target distributions at the same positions plus one more.
    greedy: p and q are one-hot (warp of greedy params); the residual and the
    bonus are point masses, so argmax replaces a multinomial draw over V (same token).
    """
    draw = (lambda probs: int(probs.argmax())) if greedy else (lambda probs: int(sample(probs, generator)))
    gamma, p_x, q_x, u, ok = _tested(draft_tokens, q, p, generator)
    # first rejected position, or γ when all accepted
    rejected = (~ok).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else gamma
    if n < gamma:
        token = draw(residual(p[n], q[n]))
        resampled = True
    else:
        token = draw(p[gamma])
        resampled = False
    return Verdict(
        n_accepted=n,
        token=token,
        resampled=resampled,
        u=u[: n + 1 if n < gamma else gamma].tolist(),
        p_x=p_x.tolist(),
        q_x=q_x.tolist(),
        overlap=overlap(p[:gamma], q).tolist(),
    )


def _tested(draft_tokens, q, p, generator):
    """The accept test of every draft: (γ, p(x), q(x), the uniforms drawn, accepted)."""
    gamma = draft_tokens.shape[0]
    idx = draft_tokens.view(-1, 1)
    p_x = p[:gamma].gather(-1, idx).squeeze(-1)
    q_x = q.gather(-1, idx).squeeze(-1)
    u = draw_uniform(gamma, generator, device=p.device).to(p.device)
    return gamma, p_x, q_x, u, accept_mask(p_x, q_x, u)


def verify_device(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                  generator: torch.Generator | None = None, *, greedy: bool = False):
    """verify's work with nothing read from the device: the same draws from the generator, in the
    same order, from the same rows, so verdict_of(its parts, read) is verify's Verdict. -> (parts,
    residual row): parts n, token, u, p_x, q_x, overlap and p_token (p at the appended token, at
    row n); the residual norm(max(0, p - q)) at row min(n, γ-1), (1, V) (the inspector's)."""
    gamma, p_x, q_x, u, ok = _tested(draft_tokens, q, p, generator)
    n = ok.to(torch.long).cumprod(0).sum()  # first rejected position, or γ
    if gamma:
        row = n.clamp(max=gamma - 1).view(1)
        r = residual(p.index_select(0, row), q.index_select(0, row))
        law = torch.where(n < gamma, r, p[gamma:gamma + 1])
    else:
        r, law = p[:0], p[:1]
    token = law.argmax(-1) if greedy else sample(law, generator)
    parts = dict(n=n, token=token, u=u, p_x=p_x, q_x=q_x, overlap=overlap(p[:gamma], q),
                 p_token=p[n.view(1), token.view(1)])
    return parts, r


def verdict_of(h: dict, gamma: int) -> Verdict:
    """verify_device's parts as read to the host -> the Verdict verify gives."""
    n = int(h["n"])
    return Verdict(n_accepted=n, token=int(h["token"][0]), resampled=n < gamma,
                   u=h["u"][: n + 1 if n < gamma else gamma], p_x=h["p_x"], q_x=h["q_x"],
                   overlap=h["overlap"])


def spread_logits(part: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """Logits over `ids` (..., len(ids)) written at those ids of a `vocab`-wide row; every other id gets
    the dtype's lowest value, so q is 0 there after softmax (a restricted output layer: the draft's
    trimmed one, a trained head's kept tokens, EAGLE-3's draft vocabulary)."""
    out = part.new_full((*part.shape[:-1], vocab), torch.finfo(part.dtype).min)
    return out.index_copy_(-1, ids, part)
