"""Run-level totals of the method-specific RoundEvent.info fields (lookahead,
REST, staged), for the CLI, bench and page. Empty for the chain methods."""
from __future__ import annotations


def summarize(rounds) -> dict:
    infos = [r.info for r in rounds if getattr(r, "info", None)]
    if not infos:
        return {}
    out: dict = {}
    if "won" in infos[0]:  # lookahead
        won = [i for i in infos if i["won"] >= 0]
        out["ngram_rounds_won"] = len(won)
        out["ngram_tokens_won"] = sum(max(i["accepted_per_guess"]) for i in won)
        out["guesses_verified"] = sum(len(i["guesses"]) for i in infos)
        out["input_tokens_per_forward"] = round(sum(i["input_tokens"] for i in infos) / len(infos), 2)
        out["pool_ngrams"] = infos[-1]["pool"]
    if "lookup_ms" in infos[0]:  # REST
        ms = [i["lookup_ms"] for i in infos]
        out["retrieval_hits"] = sum(1 for i in infos if i["match_len"])
        out["lookup_ms_mean"] = round(sum(ms) / len(ms), 3)
        out["lookup_ms_max"] = round(max(ms), 3)
    if "draft_forwards_saved" in infos[0]:  # staged
        for key in ("draft_forwards_saved", "lookup_guessed", "lookup_kept"):
            out[key] = sum(i[key] for i in infos)
    return out


def describe(d: dict) -> str:
    """One line from summarize()'s dict."""
    return "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in d.items())


def round_note(info: dict) -> str:
    """One round's method-specific story, for a tooltip (empty for chain methods)."""
    if not info:
        return ""
    if "won" in info:
        n = len(info["guesses"])
        head = (f"lookahead: n-gram guess {info['won'] + 1} of {n} won "
                f"({max(info['accepted_per_guess'])} tokens)" if info["won"] >= 0 else
                f"lookahead: none of {n} n-gram guesses matched" if n else
                "lookahead: no n-gram in the pool for the last token")
        return (f"{head}; Jacobi window {info['window']}×{info['levels']}, pool {info['pool']} n-grams, "
                f"{info['input_tokens']} tokens in the forward")
    if "lookup_ms" in info:
        if not info["match_len"]:
            return f"REST: no match in the datastore (lookup {info['lookup_ms']} ms)"
        return (f"REST: longest match {info['match_len']} tokens at {info['matches']} places, "
                f"lookup {info['lookup_ms']} ms")
    if "draft_forwards_saved" in info:
        return (f"staged: lookup guessed {info['lookup_guessed']}, the draft kept {info['lookup_kept']}: "
                f"{info['draft_forwards_saved']} draft forwards saved")
    return ""
