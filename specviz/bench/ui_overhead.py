"""Engine speed with the page streaming vs headless, measured side by side.

    python -m specviz ui-overhead                     # default pair, 3 repeats
    python -m specviz ui-overhead --compare-settle    # also the page without its pause

One process loads the pair once, serves the real page (specviz.ui.blocks) on a
local port, and alternates, per repeat:

* headless: `race(pair, req, ids, "fair")` consumed with nothing rendered;
* UI: the same request through the page's `/run` API with gradio_client, which
  receives every streamed update (pane HTML, stats, the four charts) exactly as
  a browser tab would, while the server renders and serialises them.

Both report the engines' own RunSummary (from the race directly, and from the
page's recorded trace), so "engine tok/s" is the same measured quantity on
both sides; "wall" is what a visitor waits from request to last update.
Target: UI engine speed >= 0.95 x headless.

The engines run on a thread of their own and never wait for the page's updates
(ui/live.py); in fair mode the page pauses SPECVIZ_UI_SETTLE seconds (default
0.1) once, after the run's first update (its empty charts), and on until the
machine is back to its load before the update (at most 0.5 s in all:
engine/cpu/threads.settle), before the engines start. `--compare-settle` adds
runs without that pause, in the same interleaved run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ..hosting.vllm_server import free_port
from ..run.flags import add_pair_args, load_from_args
from ..run.race import race
from ..run.request import encode_prompt, make_request

PROMPT = "def quicksort(arr):\n"


def headless(pair, req, ids) -> tuple[dict, float]:
    t = time.perf_counter()
    sums = {side: ev for side, ev in race(pair, req, ids, "fair") if type(ev).__name__ == "RunSummary"}
    return sums, time.perf_counter() - t


def through_ui(client, records, req) -> tuple[dict, float, int]:
    t = time.perf_counter()
    job = client.submit(req.prompt, req.gamma, req.max_new_tokens, req.temperature, req.top_p, req.top_k,
                        req.seed, req.chat_template, "fair", req.method, api_name="/run")
    updates = sum(1 for _ in job)  # every streamed update reaches this client
    job.result()
    wall = time.perf_counter() - t
    return records.latest().summaries(), wall, updates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz ui-overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--compare-settle", action="store_true",
                    help="also run the page with no pause after each update (SPECVIZ_UI_SETTLE=0)")
    args = ap.parse_args(argv)

    from gradio_client import Client

    from ..run.race import on_engine_thread
    from ..ui import handlers
    from ..ui.blocks import build_demo
    from ..ui.loader import ModelManager
    from ..ui.replay import Records
    pair = on_engine_thread(load_from_args, args)  # load where the race decodes
    manager = ModelManager(loader=lambda spec, **_: pair)
    manager.start(pair.spec)
    manager.wait()
    records = Records()
    demo = build_demo(manager, initial=pair.spec, records=records)
    demo.queue(default_concurrency_limit=4)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False)
    req = make_request(args.prompt, method="draft", gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                       temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)

    rows = []
    try:
        through_ui(client, records, req)  # untimed: first request pays gradio's set-up
        kinds = ("headless", "ui") + (("ui-no-settle",) if args.compare_settle else ())
        settle = handlers.SETTLE
        for rep in range(args.repeats):
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]  # rotated each repeat
            for how in order:
                if how == "headless":
                    sums, wall = headless(pair, req, ids)
                    updates = 0
                else:
                    handlers.SETTLE = settle if how == "ui" else 0.0
                    sums, wall, updates = through_ui(client, records, req)
                    handlers.SETTLE = settle
                spec, base = sums["speculative"], sums["baseline"]
                rows.append({"repeat": rep, "how": how, "spec_tok_s": spec.tokens_per_s,
                             "base_tok_s": base.tokens_per_s,
                             "speedup": spec.tokens_per_s / base.tokens_per_s,
                             "wall_s": wall, "updates": updates, "tokens": spec.n_tokens})
                print(f"repeat {rep + 1} {how:12s}: speculative {spec.tokens_per_s:.3f} tok/s, baseline "
                      f"{base.tokens_per_s:.3f} tok/s, wall {wall:.1f} s, {updates} updates", file=sys.stderr)
    finally:
        demo.close()

    med = {how: {k: statistics.median(r[k] for r in rows if r["how"] == how)
                 for k in ("spec_tok_s", "base_tok_s", "speedup", "wall_s")} for how in kinds}
    ratio = med["ui"]["spec_tok_s"] / med["headless"]["spec_tok_s"]
    print(f"pair {pair.spec.label}, precision {pair.precision_label}, γ {args.gamma}, "
          f"{args.max_new_tokens} tokens, "
          f"median of {args.repeats}; the page pauses {settle:g} s after each update (SPECVIZ_UI_SETTLE)")
    for how in kinds:
        m = med[how]
        print(f"  {how:12s}: speculative {m['spec_tok_s']:.3f} tok/s, baseline {m['base_tok_s']:.3f} tok/s, "
              f"speedup {m['speedup']:.2f}x, wall {m['wall_s']:.1f} s")
    print(f"engine speed with the UI streaming / headless: {ratio:.3f} (target >= 0.95)")
    if args.compare_settle:
        print(f"  without the pause: {med['ui-no-settle']['spec_tok_s'] / med['headless']['spec_tok_s']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "median": med, "ui_over_headless": ratio, "settle": settle}, f, indent=1)
    return 0
