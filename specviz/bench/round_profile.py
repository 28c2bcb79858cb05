"""Where a speculative round's time goes: model forwards vs everything else.

    python -m specviz round-profile [--method draft] [--gamma 4] [--max-new-tokens 64]

Runs the method once untimed (kernels warm), then once measured, with forward hooks on the
target and the draft that add up the time spent inside their forwards (perf_counter; the CPU
forward is synchronous). Decode time = elapsed − prefill (round 1 reads the prompt). The rest,
decode − forwards, is the engine's own work: sampling and acceptance math, cache cropping, event
building, detokenising. cProfile's top entries outside the forwards show what that rest is.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from ..engine.events import RoundEvent, RunSummary

PROMPT = 'def merge_intervals(intervals):\n    """Merge overlapping intervals and return them sorted."""\n'


class ForwardTimer:
    """Sum of wall time inside a module's forward (top-level calls only)."""

    def __init__(self, *models):
        self.total, self.calls, self._t0, self._depth = 0.0, 0, 0.0, 0
        self.active = False  # switched on after round 1 (the prompt's round is prefill)
        self.handles = []
        for m in models:
            if m is not None:
                self.handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]

    def _pre(self, *_):
        if self._depth == 0:
            self._t0 = time.perf_counter()
        self._depth += 1

    def _post(self, *_):
        self._depth -= 1
        if self._depth == 0 and self.active:
            self.total += time.perf_counter() - self._t0
            self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


def run_once(pair, req, ids, timer: ForwardTimer | None = None, prof: cProfile.Profile | None = None):
    """One run; with a timer/profiler, both run from the end of round 1 to the summary."""
    from ..run.runner import run_events
    summary, t_first = None, None
    for ev in run_events(pair, req, "speculative", ids):
        if isinstance(ev, RoundEvent) and t_first is None and timer is not None:
            timer.active, t_first = True, time.perf_counter()
            if prof is not None:
                prof.enable()
        elif isinstance(ev, RunSummary):
            summary = ev
    if prof is not None:
        prof.disable()
    return summary, (time.perf_counter() - t_first) if t_first else None


def profile(pair, *, method: str, gamma: int, max_new_tokens: int, prompt: str = PROMPT) -> dict:
    from ..run.request import encode_prompt, make_request
    req = make_request(prompt, method=method, gamma=gamma, max_new_tokens=max_new_tokens, temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)
    run_once(pair, req, ids)  # warm: AMX/oneDNN build a kernel per shape on first use
    timer = ForwardTimer(pair.target, pair.draft)
    s, decode = run_once(pair, req, ids, timer)
    timer.remove()
    prof = cProfile.Profile()  # a third run under cProfile (its own overhead would skew the split)
    run_once(pair, req, ids, ForwardTimer(), prof)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    return {"method": method, "gamma": gamma, "tokens": s.n_tokens, "rounds": s.rounds,
            "decode_s": decode, "forward_s": timer.total, "forward_calls": timer.calls,
            "outside_share": (decode - timer.total) / decode if decode else None,
            "profile_top": out.getvalue()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="draft")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    from ..run.flags import add_pair_args, load_from_args
    add_pair_args(ap)  # the same pair, precision, int8 and cache flags as the bench and the CLI
    args = ap.parse_args(argv)
    pair = load_from_args(args)
    r = profile(pair, method=args.method, gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    print(r.pop("profile_top"))
    for k, v in r.items():
        print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    return 0
