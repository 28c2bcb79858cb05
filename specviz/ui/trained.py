"""The trained methods (Medusa heads, EAGLE): a visitor cannot train one, so the page and the race
offer each only when the loaded pair's target has its file, shipped in assets/drafts/ or trained on
this server (engine/trained/store.py find). Their note on the page says what that file's report says: what it
was trained on and its held-out acceptance, or, with no file, the command that trains one.

Like method_options, importable without gradio."""
from __future__ import annotations

from html import escape

TRAINED_ONLY = ("heads", "eagle", "eagle-tree")

# page method -> the store's kind, and `heads <step>` (eagle-tree grows its tree with eagle's head)
KINDS = {"heads": "medusa", "eagle": "eagle", "eagle-tree": "eagle", "early-exit": "exit"}
# early-exit runs untrained where its target has no trained exit: offered either way, its note says which
PLAIN_TRAIN = "python -m specviz heads train"  # engine/proposers/heads.py train_command, pair args after it


def found(pair) -> frozenset[str]:
    """The trained methods whose file this pair's target has (none without a pair, or where looking
    fails: a target the heads cannot read is offered none)."""
    if pair is None:
        return frozenset()
    from ..engine.trained import store
    out = set()
    for method, kind in KINDS.items():
        try:
            if store.find(pair, kind) is not None:
                out.add(method)
        except Exception:  # noqa: BLE001 - no spec, no dims, an unreadable folder: not offered
            continue
    return frozenset(out)


def train_command(method: str, pair=None) -> str:
    """`python -m specviz heads data && python -m specviz heads eagle` (a pair's own arguments after
    each, as engine/proposers/heads.py train_command names them)."""
    args = ""
    if pair is not None:
        try:
            from ..engine.proposers.heads import train_command as heads_command
            cmd = heads_command(pair)
            args = cmd[len(PLAIN_TRAIN):] if cmd.startswith(PLAIN_TRAIN) else ""
        except Exception:  # noqa: BLE001 - a pair without a spec: the default pair's command
            args = ""
    return f"python -m specviz heads data{args} && python -m specviz heads {KINDS[method]}{args}"


def _tokens(n) -> str:
    n = int(n)
    if n >= 1_000_000:
        return f"{n / 1e6:.3g}M"
    return f"{n / 1e3:.3g}k" if n >= 1000 else str(n)


def _kinds(values) -> dict[str, float]:
    """{"chat": x, "code": y[, "completion": z]} from a dict of numbers or of per-position lists (their
    first entry)."""
    out = {}
    for kind in ("chat", "code", "completion"):
        v = values.get(kind) if isinstance(values, dict) else None
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        if isinstance(v, dict):  # a trained exit's agreement: {"trained": x, "untrained": y}
            v = v.get("trained")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[kind] = float(v)
    return out


KIND_NAMES = {"completion": "code completion"}  # heads accept's kinds as a visitor reads them


def _acceptance(rep: dict) -> str:
    """The measured held-out acceptance of the first draft where the report has it; else the
    teacher-forced agreement the training measured (the head fed the target's true states, not a
    run's acceptance), named as such."""
    for key, name in (("acceptance_by_position", "held-out first-draft acceptance"),
                      ("held_out_first_draft_agreement", "held-out first-draft teacher-forced agreement "
                                                         "with the target's greedy token"),
                      ("held_out_top1_by_head", "held-out teacher-forced agreement of head 1 with the "
                                                "target's greedy token")):
        vals = _kinds(rep.get(key))
        if vals:
            return f"{name}: " + ", ".join(f"{KIND_NAMES.get(k, k)} {v:.2f}" for k, v in vals.items())
    return ""


def _trained_on(rep: dict) -> str:
    said = rep.get("trained_on")
    if isinstance(said, str) and said.strip():
        return said.strip().rstrip(".")
    if isinstance(rep.get("pass_tokens"), (int, float)) and not isinstance(rep.get("pass_tokens"), bool):
        return f"Trained on a set of {_tokens(rep['pass_tokens'])} tokens"
    return ""


def report_text(rep: dict | None) -> str:
    """'Trained on 400k tokens of ShareGPT chat and stdlib code; held-out first-draft acceptance:
    chat 0.62, code 0.71.' ('' for no report or one that says neither)."""
    if not isinstance(rep, dict):
        return ""
    parts = [p for p in (_trained_on(rep), _acceptance(rep)) if p]
    return "; ".join(parts) + "." if parts else ""


def _where(pair, path) -> str:
    from ..engine.trained import store
    try:
        shipped = path.parent == store.shipped_dir(pair)
    except Exception:  # noqa: BLE001
        shipped = False
    return "shipped with the app" if shipped else "trained on this server"


def note_html(method: str | None, pair=None) -> str:
    """What the page adds to a trained method's note (HTML, '' for any other method): its file's
    report, or, where this target has none, the command that trains one."""
    if method not in KINDS or (pair is None and method == "early-exit"):
        return ""  # early exit runs either way: with no pair loaded yet, nothing is known of its exit
    path = rep = None
    if pair is not None:
        from ..engine.trained import store
        try:
            path = store.find(pair, KINDS[method])
            rep = store.report(pair, KINDS[method]) if path is not None else None
        except Exception:  # noqa: BLE001 - as found(): treated as no file
            path = rep = None
    if path is None:
        what = "exit (it drafts untrained)" if method == "early-exit" else "file"
        return (f" No trained {what} for this target yet; train one with "
                f"<code>{escape(train_command(method, pair))}</code>.")
    said = report_text(rep) or "no report next to it."
    what = f"trained exit (layer {rep.get('exit_layer')})" if method == "early-exit" and rep else "file"
    return f" This target's {what} is {_where(pair, path)}: {escape(said)}"


def offered(trained=()) -> tuple[str, ...]:
    """The race's contenders: a trained method (Medusa heads, EAGLE: training a visitor cannot do)
    only when in `trained`, the ones the loaded pair's target has a file for (found)."""
    from ..run.leaderboard import all_keys
    return tuple(k for k in all_keys() if k not in TRAINED_ONLY or k in trained)


def methods_update(trained=()):
    """The race's method list for the loaded pair (its ticks left as the visitor set them)."""
    import gradio as gr

    from ..run.leaderboard import entry
    return gr.CheckboxGroup(choices=[(entry(k).label, k) for k in offered(trained)])
