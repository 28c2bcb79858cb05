"""Held-out acceptance of a trained draft, measured by the engine itself (the card's figures):
greedy speculative runs on prompts the head never saw, and per draft position j the share of
rounds that reached position j whose draft there was accepted.

Chat: the first user turn of ShareGPT conversations the feature pass held out (features.held_out);
code: HumanEval prompts (the bench's code set; the pass read the standard library, never these).
Both through the chat template, as the page sends them; and completion: the same HumanEval prompts
with no chat template, completed as written (the bench's code task, the page's completion preset)."""
from __future__ import annotations

from ..engine.events import RoundEvent
from ..prompts import humaneval_prompts
from ..run.request import encode_prompt, make_request
from ..run.runner import run_events
from .features import conversations, held_out

MAX_CHARS = 1500  # a held-out chat prompt longer than this is skipped (a visitor's prompt is short)


def held_out_prompts(n: int) -> dict[str, list[str]]:
    convs, _ = conversations()
    chat = [c[0]["content"] for i, c in enumerate(convs)
            if held_out(i) and c[0]["role"] == "user" and 20 <= len(c[0]["content"]) <= MAX_CHARS]
    code = [p.text for p in humaneval_prompts(n)]
    return {"chat": chat[:n], "code": code, "completion": code}


def by_position(rounds: list[RoundEvent], gamma: int) -> dict:
    """Per position j: rounds that drafted a token there with every earlier one accepted, and the share
    of those accepted; and τ, the tokens a drafting round wrote."""
    reached, accepted = [0] * gamma, [0] * gamma
    tau = []
    for r in rounds:
        if r.gamma < 1:
            continue
        tau.append(r.n_accepted + 1)
        for j in range(min(r.gamma, r.n_accepted + 1)):
            reached[j] += 1
            accepted[j] += j < r.n_accepted
    return {"acceptance": [round(a / r, 3) if r else None for a, r in zip(accepted, reached, strict=True)],
            "reached": reached, "tau": round(sum(tau) / max(1, len(tau)), 3), "rounds": len(tau)}


def measure(pair, method: str, n: int = 10, gamma: int = 5, new: int = 64, prompts=None) -> dict:
    """{kind: by_position over the kind's held-out prompts} for `method` on `pair`, greedy."""
    out = {}
    for kind, texts in (prompts or held_out_prompts(n)).items():
        rounds: list[RoundEvent] = []
        for text in texts:
            req = make_request(text, method=method, gamma=gamma, max_new_tokens=new,
                               chat_template=kind != "completion")
            ids = encode_prompt(pair.tokenizer, req)
            rounds += [e for e in run_events(pair, req, "speculative", ids) if isinstance(e, RoundEvent)]
        out[kind] = by_position(rounds, gamma) | {"prompts": len(texts)}
    return out
