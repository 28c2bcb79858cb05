"""SpecViz web app: `python app.py` serves the page on http://127.0.0.1:7860.

    python app.py                                  # the embedded default pair
    python app.py --target DIR/target --draft DIR/draft --port 7861
    python app.py --pair smollm2 --device cuda --host 0.0.0.0
    python app.py --host 0.0.0.0 --fixed-pair --max-new-tokens 256 --max-seconds 60   # public / on stage

Per-run limits come from the flags, else from $SPECVIZ_MAX_NEW_TOKENS,
$SPECVIZ_MAX_PROMPT_TOKENS and $SPECVIZ_MAX_SECONDS. Runs queue: one generates
at a time, the others see their place in the queue.

Models load in a background thread; the page shows the progress and enables
Run when they are ready. A loading failure is shown in the page and the app
keeps serving (another pair can be loaded from the page).
"""
from __future__ import annotations

import argparse
import os
import sys

from specviz.models import ModelError, resolve_pair
from specviz.run.flags import add_pair_args
from specviz.run.race import DEFAULT_MODE, MODES
from specviz.run.request import Limits


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python app.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                    help="port to serve on (default: 7860, or $GRADIO_SERVER_PORT)")
    ap.add_argument("--host", default=None,
                    help="interface to listen on (default: 0.0.0.0 on a Hugging Face Space, else 127.0.0.1)")
    ap.add_argument("--share", action="store_true", help="also open a temporary public gradio.live link")
    ap.add_argument("--allow-local-paths", action="store_true",
                    help="let visitors type local folders as custom model ids (off by default; "
                         "--target/--draft given here are always allowed)")
    ap.add_argument("--mode", choices=MODES, default=None,
                    help="default execution mode in the page (default: fair)")
    ap.add_argument("--fixed-pair", action="store_true",
                    help="visitors cannot load another model pair from the page (the pair is shared by "
                         "everyone: use this for a public or on-stage server)")
    ap.add_argument("--no-calibrate", action="store_true",
                    help="never time the models at start: use the cached calibration, else a safe untimed "
                         "default (fp32). By default Run is enabled at once and the calibration runs in the "
                         "background (budget $SPECVIZ_CALIBRATION_BUDGET s, default 300)")
    ap.add_argument("--calibration", metavar="FILE", default=None,
                    help="a stored calibration for the start pair (stage machines): used when FILE exists, "
                         "else this start's measurement is written to it")
    ap.add_argument("--stage", action="store_true",
                    help="stage mode for everyone (large type, explainer and settings collapsed, keyboard "
                         "shortcuts shown); any visitor gets it with ?stage=1")
    limits = ap.add_argument_group("per-run limits for visitors (flags override the environment)")
    for flag, env, kind, default in LIMIT_FLAGS:
        limits.add_argument(flag, type=_positive(kind), default=None, metavar="N",
                            help=f"default: ${env} or {default:g}")
    return ap


# flag, environment variable (read by request.Limits.from_env), type, built-in default
LIMIT_FLAGS = (
    ("--max-new-tokens", "SPECVIZ_MAX_NEW_TOKENS", int, Limits.max_new_tokens),
    ("--max-prompt-tokens", "SPECVIZ_MAX_PROMPT_TOKENS", int, Limits.max_prompt_tokens),
    ("--max-seconds", "SPECVIZ_MAX_SECONDS", float, Limits.max_seconds),
)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {'whole ' if kind is int else ''}number, "
                                             f"got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def limits_from_args(args) -> Limits:
    """The operator's limits: flags win over the environment. Flags given are
    written to the environment too, so every Limits.from_env() in this process
    (the page, replays, anything started later) sees the same limits."""
    for flag, env, _, _ in LIMIT_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value is not None:
            os.environ[env] = str(value)
    return Limits.from_env()


def initial_spec(args, notes: dict | None = None):
    """The pair to load at start (operator paths are always allowed). With no
    pair named: on a GPU host the biggest pair that shows the method (its why
    goes to `notes`, shown in the page), on a Space without the embedded
    packages the same models from the Hub, else the embedded default."""
    if not (args.pair or args.target or args.draft):
        from specviz.hosting.gpu import host_default
        from specviz.hosting.spaces import default_pair
        ours = getattr(args, "engine", "specviz") == "specviz"
        spec, why = host_default(args.device) if ours else (None, "")
        spec = spec or default_pair()
        if notes is not None and why:
            notes[spec.name] = why
        return spec
    return resolve_pair(args.pair, args.target, args.draft, allow_local_paths=True)


def _default_mode(args) -> str:
    """Fair, except with two or more GPUs: each side then has its own (true parallelism)."""
    if getattr(args, "engine", "specviz") == "specviz" and args.device in (None, "", "auto", "cuda"):
        from specviz.hosting.gpu import gpus, placement
        return placement(gpus()).default_mode
    return DEFAULT_MODE


def create_app(args):
    """(demo, manager): the Blocks page and the model manager, loading started."""
    from specviz.engine.cpu.memory import freeze_imports
    from specviz.hosting.gpu import host_loader
    from specviz.hosting.spaces import on_zerogpu
    from specviz.ui.blocks import build_demo
    from specviz.ui.loader import ModelManager
    freeze_imports()  # before the first model: the cycle collector's full walks get cheap
    notes: dict[str, str] = {}
    if getattr(args, "engine", "specviz") == "vllm":
        from specviz.hosting.vllm import vllm_loader
        loader = vllm_loader(args.vllm_url)
    else:
        loader = host_loader(notes)
    manager = ModelManager(device=args.device, quantize=getattr(args, "quantize", None),
                           precision=getattr(args, "precision", None),
                           draft_vocab=getattr(args, "draft_vocab", None), loader=loader,
                           calibration="off" if getattr(args, "no_calibrate", False) else "background",
                           calibration_file=getattr(args, "calibration", None),
                           prewarm=getattr(args, "stage", False))
    spec = None
    try:
        spec = initial_spec(args, notes)
    except ModelError as e:
        manager.error = str(e)  # shown in the page; a pair can still be picked there
    if spec is not None:
        manager.start(spec)
    demo = build_demo(manager, initial=spec, default_mode=args.mode or _default_mode(args),
                      allow_local_paths=args.allow_local_paths, limits=limits_from_args(args),
                      fixed_pair=getattr(args, "fixed_pair", False) or on_zerogpu(),  # see ZEROGPU_FIXED
                      stage_mode=getattr(args, "stage", False))
    demo.queue(default_concurrency_limit=4, max_size=64)
    return demo, manager


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    host = args.host or ("0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1")
    from specviz.ui.render import page_css

    demo, _ = create_app(args)
    lim = Limits.from_env()  # as create_app set them
    print(f"SpecViz: serving on http://{host}:{args.port} (models load in the background); per run at most "
          f"{lim.max_new_tokens} new tokens, {lim.max_prompt_tokens} prompt tokens, {lim.max_seconds:g} s"
          + ("; model pair fixed" if args.fixed_pair else ""), file=sys.stderr)
    demo.launch(server_name=host, server_port=args.port, share=args.share, css=page_css(),
                show_error=True, footer_links=["api", "gradio"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
