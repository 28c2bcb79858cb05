"""Why a run lost, or gained little, in one plain sentence chosen by its own measured numbers, never by
the method's name (issue 71: lookahead at 0.30-0.36× and REST at 0.80× gave no reason; layer skip said
"its drafts pass less often" at α̂ 0.935, when its cost was the cause, c 0.89-1.13). And, for staged,
what prompt lookup added to the draft model's chain (it showed exactly the draft model's numbers).

A round costs d·c + v plain target steps (d draft steps of cost c, one verify pass of cost v) and keeps
τ tokens; a plain step costs 1 and keeps 1. The cause named is the one whose removal would have gained
the most by that account: a verify pass of one plain step, a free draft, or every draft kept. Where the
rounds themselves gained and the run did not, the time went outside them, and the sentence says so.
Pure functions of numbers and events, like render.py.
"""
from __future__ import annotations

# below this measured speedup a finished run gets the sentence ("gained little")
GAINED_LITTLE = 1.10
# the rounds' own account above this ratio while the run measured clearly less: the loss was elsewhere
ROUNDS_GAIN = 1.10


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def cause(speedup, tau, v, c, gamma_mean, *, alpha=None, alpha_hat=None, draft_steps=None,
          most=None, rows=None) -> str:
    """One sentence naming the measured cause of a loss (speedup < 1) or a small gain (< GAINED_LITTLE),
    with its figures; '' when the run gained more, or a figure it needs was not measured.

    tau: tokens per round; v: a verify pass in plain steps; c: a draft step in plain steps (0: no draft
    model); gamma_mean: tokens drafted per round; draft_steps: draft forwards per round (default
    gamma_mean); most: the most tokens a round could keep (default gamma_mean + 1: every draft and the
    target's own); rows: tokens per verify pass where they are not the drafts + 1 (lookahead)."""
    spd, tau, v, c, g = (_num(x) for x in (speedup, tau, v, c, gamma_mean))
    if spd is None or spd >= GAINED_LITTLE or None in (tau, v, c, g) or tau <= 0 or v <= 0:
        return ""
    steps = _num(draft_steps)
    drafting = (g if steps is None else steps) * c  # plain steps spent drafting, per round
    cost = drafting + v
    head = "Why it lost" if spd < 1 else "Why it gained little"
    by_rounds = tau / cost
    if by_rounds >= ROUNDS_GAIN and spd < 0.85 * by_rounds:
        return (f"{head}: not its rounds. Each kept {tau:.2f} tokens for {cost:.2f} plain steps of cost "
                f"({by_rounds:.2f}× by its rounds); the time went outside them: reading the prompt, a short "
                "run, or other work on this machine.")
    top = _num(most) or g + 1
    gains = {"verify": cost / (drafting + 1) if v > 1 else 1.0,
             "draft": cost / v if drafting > 0 else 1.0,
             "accept": max(top, tau) / tau}
    why = max(gains, key=gains.get)
    if why == "verify":
        wide = f" ({_num(rows):.0f} tokens at once)" if _num(rows) else ""
        return (f"{head}: a costly check. Each round's verify pass{wide} cost {v:.2f} plain steps and kept "
                f"{tau:.2f} tokens, where a plain step costs 1 for 1 token.")
    if why == "draft":
        how = "about as much as a target step" if c >= 0.8 else f"{c:.0%} of a target step"
        return (f"{head}: its draft costs {how}. One draft step cost {c:.2f} plain steps, {drafting:.2f} a "
                f"round with the check's {v:.2f}, for {tau:.2f} tokens a round.")
    kept = _num(alpha)
    share = f"{kept:.0%} of its drafted tokens were kept" if kept is not None else "few drafts were kept"
    exp = f" (α̂ {_num(alpha_hat):.2f})" if _num(alpha_hat) is not None else ""
    return (f"{head}: its drafts rarely pass. {share[0].upper() + share[1:]}{exp}, so each round kept "
            f"{tau:.2f} tokens for {cost:.2f} plain steps of cost.")


def cause_of(stats: dict, tree: bool = False, gamma: int | None = None) -> str:
    """cause() from a run's stats (RunView.stats: speedup, τ, v, c, γ drafted, accepted ÷ drafted, α̂,
    draft forwards per round, verify rows). A token tree keeps at most its depth + 1 (`gamma`: the
    depth asked for), however many nodes it drafted."""
    g = _num(stats.get("gamma_mean"))
    most = (min(g, gamma) + 1) if tree and g is not None and gamma else None
    return cause(stats.get("speedup"), stats.get("tau"), stats.get("verify_cost"), stats.get("c"), g,
                 alpha=stats.get("alpha"), alpha_hat=stats.get("alpha_hat"),
                 draft_steps=stats.get("draft_steps"), most=most, rows=stats.get("verify_rows"))


# ------------------------------------------------------------------ staged: lookup's part


def staged_share(rounds) -> dict | None:
    """What prompt lookup contributed to a staged run (RoundEvent.info of engine/proposers/staged.py):
    drafted tokens in all, those that were lookup's guesses (kept by the draft's own test), how many of
    each the target accepted, lookup's guesses in all and the draft forwards saved. Accepted-from-lookup
    is None for a recording made before rounds said which positions were lookup's (lookup_at)."""
    rounds = [r for r in rounds if isinstance(getattr(r, "info", None), dict) and "lookup_kept" in r.info]
    if not rounds:
        return None
    out = dict(drafted=sum(r.gamma for r in rounds), accepted=sum(r.n_accepted for r in rounds),
               guessed=sum(int(r.info.get("lookup_guessed") or 0) for r in rounds),
               saved=sum(int(r.info.get("draft_forwards_saved") or 0) for r in rounds))
    if all(isinstance(r.info.get("lookup_at"), list) for r in rounds):
        out["lookup"] = sum(len(r.info["lookup_at"]) for r in rounds)
        out["lookup_accepted"] = sum(1 for r in rounds for p in r.info["lookup_at"] if p < r.n_accepted)
    else:
        out["lookup"] = sum(min(int(r.info.get("lookup_kept") or 0), r.gamma) for r in rounds)
        out["lookup_accepted"] = None
    return out


def staged_text(share: dict | None, greedy: bool = False) -> str:
    """Lookup's part of a staged run, in words, from staged_share()."""
    if not share:
        return ""
    d, n, g = share["drafted"], share["lookup"], share["guessed"]
    same = (" Under greedy decoding the chain is the draft model's own either way: lookup can only save "
            "draft forwards, not change what passes." if greedy else "")
    if not n:
        return (f"Prompt lookup's part: none. It guessed {g} tokens and the draft model kept none of them, "
                f"so all {d} drafted tokens were the draft model's own, as in a draft-model run." + same)
    la = share.get("lookup_accepted")
    acc = (f" ({la} accepted by the target)" if la is not None else
           " (how many the target accepted: not recorded in this recording)")
    rest = (f" ({share['accepted'] - la} accepted)" if la is not None else "")
    return (f"Prompt lookup's part: {n} of {d} drafted tokens were its guesses, checked by the draft model "
            f"in one forward{acc}; the draft model drafted the other {d - n}{rest}. Lookup guessed {g} in "
            f"all; {share['saved']} draft forwards saved." + same)
