"""What a bench run measures: presets, the resolved settings and the prompts."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..prompts import TASKS
from ..run.request import METHODS, RequestError
from .hf import HF_FAMILIES

QUICK = dict(tasks="code,grounded", n_prompts="code=2,grounded=1", max_new_tokens=32,
             gammas="2,4,6,auto", repeats=3, hf_gammas="4",
             methods="plain,hf-assisted,hf-stock," + ",".join(METHODS))
FULL = dict(tasks="code,chat,grounded,edit", n_prompts="1", max_new_tokens=32,
            gammas="1,2,3,4,5,6,7,8,auto", repeats=3, hf_gammas="4",
            methods="plain,hf-greedy,hf-assisted,hf-heuristic,hf-stock," + ",".join(METHODS))
# new tokens of a task unless --max-new-tokens names it: an edit's answer is the whole function again
TASK_TOKENS = {"edit": 128}

VLLM_FAMILIES = ("vllm", "vllm-spec")  # bench/vllm_rows.py
LLAMACPP_FAMILIES = ("llamacpp", "llamacpp-spec")  # bench/llamacpp_rows.py
FAMILIES = ("plain",) + HF_FAMILIES + tuple(METHODS) + VLLM_FAMILIES + LLAMACPP_FAMILIES
CHAT_TASKS = ("chat", "grounded", "edit")  # user messages: wrapped in the chat template
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Settings:
    tasks: list[str]
    counts: dict[str, int]  # prompts per task
    families: list[str]  # "plain", HF families and SpecViz methods to run
    repeats: int
    max_new_tokens: int  # every task's but those in task_tokens
    gammas: list[int]  # γ sweep of the draft-model method
    hf_gammas: list[int]  # constant γ of HF assisted generation
    gamma_other: int  # γ of the other SpecViz methods
    gamma_auto: bool = False  # also run the draft-model method with γ auto ("auto" in --gammas)
    sweeps: dict = field(default_factory=dict)  # {method: {option: [values]}} from --sweep
    llamacpp_gammas: list = field(default_factory=list)  # draft n_max of the llama.cpp speculative rows
    task_tokens: dict = field(default_factory=dict)  # {task: new tokens} where it is not max_new_tokens

    def tokens_for(self, task: str) -> int:
        """New tokens of one run of a prompt of `task`."""
        return self.task_tokens.get(task, self.max_new_tokens)

    @property
    def tokens_line(self) -> str:
        """'32 new tokens' or '32 new tokens (edit 128)', for the report and the log."""
        extra = ", ".join(f"{t} {self.task_tokens[t]}" for t in self.tasks if t in self.task_tokens)
        return f"{self.max_new_tokens} new tokens" + (f" ({extra})" if extra else "")


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    task: str
    text: str
    chat_template: bool
    source: str = ""


def parse_counts(value: str, tasks: list[str]) -> dict[str, int]:
    """'3' -> 3 per task; 'code=2,grounded=1' -> per task (unlisted tasks: 0)."""
    value = str(value).strip()
    try:
        if "=" not in value:
            n = int(value)
            if n < 1:
                raise ValueError
            return {t: n for t in tasks}
        out = {t: 0 for t in tasks}
        for part in value.split(","):
            task, count = part.split("=")
            out[task.strip()] = int(count)
        return out
    except ValueError:
        raise RequestError(f"--n-prompts must be a positive number or task=n,...; got {value!r}") from None


def parse_tokens(value, tasks: list[str]) -> tuple[int, dict[str, int]]:
    """'64' -> (64, {edit: 128}); '64,edit=96' or 'code=16,...' -> per task named, the
    bare number (or 32) for the rest: (default, {task: tokens} of the listed tasks that differ)."""
    default, named = None, {}
    for part in (x.strip() for x in str(value).split(",") if x.strip()):
        task, eq, count = part.rpartition("=")
        try:
            n = int(count)
        except ValueError:
            n = 0
        if n < 2 or (eq and task.strip() not in TASKS):
            raise RequestError(f"--max-new-tokens must be N (at least 2) or task=N,... with a task from "
                               f"{', '.join(TASKS)}; got {value!r}")
        if eq:
            named[task.strip()] = n
        else:
            default = n
    default = 32 if default is None else default
    per = {**{t: n for t, n in TASK_TOKENS.items() if t not in named}, **named}
    return default, {t: n for t, n in per.items() if t in tasks and n != default}


def _gammas(value: str) -> tuple[list[int], bool]:
    """'2,4,auto' -> ([2, 4], True): numbers to sweep, and whether γ auto runs too."""
    parts = [x.strip() for x in str(value).split(",") if x.strip()]
    auto = "auto" in parts
    rest = ",".join(x for x in parts if x != "auto")
    return (_ints(rest, "--gammas") if rest or not auto else []), auto


def _ints(value: str, name: str) -> list[int]:
    try:
        xs = [int(x) for x in str(value).split(",") if x.strip()]
    except ValueError:
        raise RequestError(f"{name} must be a comma list of whole numbers, got {value!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise RequestError(f"{name} must list numbers >= 1, got {value!r}")
    return xs


def _families(value: str, no_hf: bool) -> list[str]:
    families = [m.strip() for m in value.split(",") if m.strip()]
    bad = [m for m in families if m not in FAMILIES]
    if bad:
        raise RequestError(f"--methods: unknown {bad}: choose from {', '.join(FAMILIES)}")
    if no_hf:
        families = [m for m in families if m not in HF_FAMILIES]
    if "plain" not in families:
        families.insert(0, "plain")
    return families


def parse_sweeps(items: list[str] | None) -> dict:
    """--sweep METHOD.OPTION=V1,V2 (repeatable) -> {method: {option: [V1, V2]}}, each value
    checked by the method's own check_options (the message a visitor would see)."""
    from ..engine.proposers import REGISTRY
    out: dict = {}
    for item in items or []:
        head, _, values = item.partition("=")
        method, _, name = head.partition(".")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if method not in REGISTRY or not name or not vals:
            raise RequestError(f"--sweep {item!r}: use METHOD.OPTION=V1,V2 with a method from "
                               f"{', '.join(REGISTRY)}, e.g. tree.tree_budget=4,8,16")
        for v in vals:
            REGISTRY[method].check_options({name: v})
        out.setdefault(method, {})[name] = vals
    return out


def resolve_settings(args) -> Settings:
    """Command-line flags over the preset (--quick or the full run), validated."""
    preset = QUICK if args.quick else FULL

    def get(key):
        value = getattr(args, key)
        return preset[key] if value is None else value

    tasks = [t.strip() for t in get("tasks").split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise RequestError(f"--tasks: unknown task(s) {bad}: use {', '.join(TASKS)}")
    repeats = get("repeats")
    if repeats < 1:
        raise RequestError("--repeats must be at least 1")
    max_new_tokens, task_tokens = parse_tokens(get("max_new_tokens"), tasks)
    # explicit --tasks with the quick preset's per-task counts: default to 1 for a listed task
    counts = parse_counts(get("n_prompts"), tasks)
    if args.tasks and args.n_prompts is None:
        counts = {t: counts.get(t) or 1 for t in tasks}
    gammas, gamma_auto = _gammas(get("gammas"))
    return Settings(tasks=tasks, counts=counts, families=_families(get("methods"), args.no_hf),
                    repeats=repeats, max_new_tokens=max_new_tokens,
                    gammas=gammas, hf_gammas=_ints(get("hf_gammas"), "--hf-gammas"),
                    gamma_other=args.gamma_other, gamma_auto=gamma_auto,
                    sweeps=parse_sweeps(getattr(args, "sweep", None)),
                    llamacpp_gammas=_ints(getattr(args, "llamacpp_gammas", None) or str(args.gamma_other),
                                          "--llamacpp-gammas"),
                    task_tokens=task_tokens)


PROMPT_ITEM = "{id, task, text[, chat_template]}"


def _kind(x) -> str:
    """A JSON value's kind, in the words of a message."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}
    return kinds.get(type(x), "a number")


def _item_problem(item) -> str:
    """What is wrong with one prompt of a --prompts-json file ('' when nothing)."""
    if not isinstance(item, dict):
        return f"is {_kind(item)}, not an object {PROMPT_ITEM}"
    if "text" not in item:
        return "has no 'text'"
    expect = {"text": str, "task": str, "id": str, "chat_template": bool}
    for key, typ in expect.items():
        if key in item and not isinstance(item[key], typ):
            return f"'{key}' is {_kind(item[key])}, not {_kind(typ())}"
    if not item["text"].strip():
        return "'text' is empty"
    if item.get("task", "code") not in TASKS:
        return f"'task' is {item['task']!r}: use {', '.join(TASKS)}"
    return ""


def read_prompts_file(path: str) -> list[dict]:
    """A --prompts-json file's items, checked: RequestError naming the file and what is wrong
    (a JSON object instead of a list ended in an AttributeError traceback, issue 41)."""
    where = f"--prompts-json {path}"
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise RequestError(f"{where}: cannot read it ({e.strerror or type(e).__name__})") from None
    except UnicodeDecodeError:
        raise RequestError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise RequestError(f"{where}: not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from None
    if not isinstance(items, list):
        raise RequestError(f"{where}: must be a JSON list of {PROMPT_ITEM} objects, not {_kind(items)}")
    for i, item in enumerate(items, 1):
        problem = _item_problem(item)
        if problem:
            raise RequestError(f"{where}: item {i} {problem}")
    return items


def load_prompts(tasks: list[str], counts: dict[str, int] | None,
                 prompts_json: str | None) -> list[BenchPrompt]:
    """The packaged prompt sets, or a JSON list of {id, task, text[, chat_template]}
    (counts None: every prompt of the file)."""
    if prompts_json:
        items = read_prompts_file(prompts_json)
        out = []
        for i, item in enumerate(items):
            task = item.get("task", "code")
            if task not in tasks:
                continue
            out.append(BenchPrompt(item.get("id", f"{task}/{i}"), task, item["text"],
                                   bool(item.get("chat_template", task in CHAT_TASKS)), prompts_json))
        by_task = {t: [p for p in out if p.task == t][: (counts or {}).get(t, 0) or None] for t in tasks}
        return [p for t in tasks for p in by_task[t]]
    from ..prompts import prompt_set
    out = []
    for task in tasks:
        if counts.get(task, 0) <= 0:
            continue
        for p in prompt_set(task, counts[task]):
            out.append(BenchPrompt(p.id, p.task, p.text, p.task in CHAT_TASKS, p.source))
    return out
