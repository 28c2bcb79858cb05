"""The bench, in process, on the tiny random pair (seconds, no real weights)."""
import csv
import json
from xml.etree import ElementTree

import pytest
import torch

import specviz.bench as bench
from specviz.bench import OutputMismatch, Run, check_outputs, first_difference
from specviz.bench import runs as bench_runs

PROMPTS = [
    {"id": "code/a", "task": "code", "text": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"},
    {"id": "code/b", "task": "code", "text": "x = [1, 2, 3]\ny = [1, 2, 3]\nz = ["},
    {"id": "grounded/a", "task": "grounded", "text": "Repeat: the cat sat on the mat. the cat sat"},
]


pytestmark = pytest.mark.usefixtures("one_thread")


def _args(pair_dirs, tmp_path, *extra):
    t, d = pair_dirs
    pj = tmp_path / "prompts.json"
    pj.write_text(json.dumps(PROMPTS))
    return ["--target", t, "--draft", d, "--quick", "--max-new-tokens", "8", "--repeats", "1",
            "--prompts-json", str(pj), "--out", str(tmp_path / "out"), *extra]


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_quick_bench_writes_json_csv_and_plots(pair_dirs, tmp_path, capsys):
    methods = "plain,hf-greedy,hf-assisted,hf-stock,draft,lookup"
    assert bench.main(_args(pair_dirs, tmp_path, "--methods", methods)) == 0
    out = tmp_path / "out"
    data = json.loads((out / "bench.json").read_text())
    summary = _read_csv(out / "summary.csv")
    runs = _read_csv(out / "runs.csv")
    assert list(summary[0]) == bench.SUMMARY_COLUMNS
    assert list(runs[0]) == bench.RUN_COLUMNS
    variants = {r["variant"] for r in runs}
    assert {"plain", "hf-greedy", "hf-assisted:4", "hf-stock:4", "draft:2", "draft:4", "draft:6"} <= variants
    # 3 prompts (code 2 + grounded 1 of the quick preset) × methods × 1 repeat
    assert len(runs) == 3 * len(variants) == len(data["runs"])
    assert {r["prompt_id"] for r in runs} == {"code/a", "code/b", "grounded/a"}
    # SpecViz greedy runs equal the baseline token for token (the bench checked it)
    assert all(r["match"] == "True" for r in runs if r["engine"] == "specviz")
    assert "draft:auto" in variants  # γ auto runs beside the sweep (a tiny pair: its fixed default)
    spec = [r for r in summary
            if r["family"] == "draft" and r["task"] == "code" and r["variant"] != "draft:auto"]
    assert len(spec) == 3 and sum(r["best"] == "True" for r in spec) == 1
    assert all(float(r["alpha"]) >= 0 and float(r["c"]) > 0 and float(r["tokens_per_s"]) > 0 for r in spec)
    plain = next(r for r in summary if r["variant"] == "plain" and r["task"] == "code")
    assert float(plain["speedup"]) == pytest.approx(1.0)
    assert data["meta"]["machine"]["torch"] == torch.__version__
    assert data["meta"]["command"].startswith("python -m specviz bench --target")
    for name in ("speedup_vs_gamma.svg", "alpha_by_task.svg", "plots.html", "table.txt", "per_prompt.csv"):
        assert (out / name).stat().st_size > 0
    for name in ("speedup_vs_gamma.svg", "alpha_by_task.svg"):
        assert ElementTree.parse(out / name).getroot().tag.endswith("svg")  # well-formed
    per_prompt = _read_csv(out / "per_prompt.csv")
    assert {r["prompt_id"] for r in per_prompt} == {"code/a", "code/b", "grounded/a"}
    text = capsys.readouterr().out
    assert "SpecViz draft γ=4" in text and "load average" in text
    assert "command: python -m specviz bench" in text


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], []) is None


def _run(variant, engine, ids, prompt="code/a", repeat=0):
    family = variant.split(":")[0]
    return Run(variant, family, engine, 0, "code", prompt, repeat, 0, token_ids=ids)


def test_checker_raises_on_broken_specviz_output():
    runs = [_run("plain", "specviz", [5, 6, 7, 8]), _run("draft:4", "specviz", [5, 6, 9, 8]),
            _run("plain", "specviz", [1, 2], prompt="code/b"),
            _run("draft:4", "specviz", [1, 2], prompt="code/b")]
    with pytest.raises(OutputMismatch, match=r"draft:4 on code/a .*first differing position 2"):
        check_outputs(runs)
    assert runs[1].match is False and runs[1].first_diff == 2 and runs[3].match is True


def test_checker_only_warns_for_hf():
    runs = [_run("plain", "specviz", [5, 6, 7]), _run("hf-assisted:4", "hf", [5, 6]),
            _run("draft:4", "specviz", [5, 6, 7])]
    warnings = check_outputs(runs)
    assert len(warnings) == 1 and "hf-assisted:4 on code/a" in warnings[0] and "position 2" in warnings[0]
    assert runs[1].match is False and runs[2].match is True


def test_bench_exits_1_on_broken_result(pair_dirs, tmp_path, monkeypatch, capsys):
    real = bench_runs.run_specviz

    def broken(pair, v, req, ids):
        summary, first = real(pair, v, req, ids)
        if v.key == "draft:4":
            ids = summary.token_ids
            summary.token_ids = ids[:3] + [(ids[3] + 1) % 90] + ids[4:]
        return summary, first

    monkeypatch.setattr(bench_runs, "run_specviz", broken)
    rc = bench.main(_args(pair_dirs, tmp_path, "--no-hf", "--gammas", "4", "--methods", "plain,draft",
                          "--no-warmup"))
    assert rc == 1
    err = capsys.readouterr().err
    assert "FAILED" in err and "draft:4 on code/a" in err and "first differing position 3" in err
    assert (tmp_path / "out" / "bench.json").exists()  # results are written before failing


def test_bad_flags_exit_2(pair_dirs, tmp_path, capsys):
    assert bench.main(_args(pair_dirs, tmp_path, "--gammas", "0,2")) == 2
    assert "--gammas" in capsys.readouterr().err
    assert bench.main(_args(pair_dirs, tmp_path, "--methods", "magic")) == 2


BAD_PROMPTS = [  # (file content, what the one line says); issue 41: an object ended in an AttributeError
    ('{"id": "a", "text": "x"}', "must be a JSON list of {id, task, text[, chat_template]} objects, not an object"),
    ("[{\"text\": \"x\"},", "not valid JSON (Expecting value, line 1 column 16)"),
    ('["def f():"]', "item 1 is a string, not an object {id, task, text[, chat_template]}"),
    ('[{"text": "x"}, {"id": "b"}]', "item 2 has no 'text'"),
    ('[{"text": 3}]', "item 1 'text' is a number, not a string"),
    ('[{"text": "  "}]', "item 1 'text' is empty"),
    ('[{"text": "x", "id": 7}]', "item 1 'id' is a number, not a string"),
    ('[{"text": "x", "chat_template": "yes"}]', "item 1 'chat_template' is a string, not true/false"),
    ('[{"text": "x", "task": "poetry"}]', "item 1 'task' is 'poetry': use code, chat, grounded, edit"),
]


@pytest.mark.parametrize("content,why", BAD_PROMPTS)
def test_malformed_prompts_file_is_one_clear_error(tmp_path, content, why):
    from specviz.bench.settings import load_prompts
    from specviz.errors import RequestError
    pj = tmp_path / "prompts.json"
    pj.write_text(content)
    with pytest.raises(RequestError) as info:
        load_prompts(["code", "chat"], None, str(pj))
    assert str(info.value) == f"--prompts-json {pj}: {why}"


def test_missing_prompts_file_is_one_clear_error(tmp_path):
    from specviz.bench.settings import load_prompts
    from specviz.errors import RequestError
    with pytest.raises(RequestError, match=r"^--prompts-json \S+nope.json: cannot read it \(No such file"):
        load_prompts(["code"], None, str(tmp_path / "nope.json"))


@pytest.mark.parametrize("content", [BAD_PROMPTS[0][0], BAD_PROMPTS[3][0], None])
def test_bench_with_a_malformed_prompts_file_exits_2_in_one_line(tmp_path, capsys, content):
    pj = tmp_path / "prompts.json"
    if content is not None:  # None: no such file
        pj.write_text(content)
    out = tmp_path / "out"
    assert bench.main(["--quick", "--prompts-json", str(pj), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --prompts-json {pj}: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()  # checked before anything is written or loaded


def test_prompts_file_with_every_field_loads(tmp_path):
    from specviz.bench.settings import load_prompts
    pj = tmp_path / "prompts.json"
    pj.write_text(json.dumps([*PROMPTS, {"text": "hi", "task": "chat", "chat_template": False}]))
    got = load_prompts(["code", "chat"], None, str(pj))
    assert [p.id for p in got] == ["code/a", "code/b", "chat/3"] and got[2].chat_template is False


def test_unavailable_method_is_skipped_with_a_note(pair_dirs, tmp_path, monkeypatch, capsys):
    from specviz.run import runner
    from specviz.run.request import RequestError
    real = runner.make_proposer

    def no_lookup(pair, method, req=None):
        if method == "lookup":
            raise RequestError("Unknown method 'lookup'.")
        return real(pair, method, req)

    monkeypatch.setattr(runner, "make_proposer", no_lookup)
    rc = bench.main(_args(pair_dirs, tmp_path, "--no-hf", "--gammas", "2", "--methods", "plain,draft,lookup",
                          "--no-warmup"))
    assert rc == 0
    out = capsys.readouterr().out
    assert "method 'lookup' skipped" in out
    runs = _read_csv(tmp_path / "out" / "runs.csv")
    assert {r["variant"] for r in runs} == {"plain", "draft:2"}


def test_ui_bench_compares_streaming_with_headless(pair_dirs, tmp_path, capsys):
    """python -m specviz ui-overhead: the real page over gradio_client vs the bare race."""
    pytest.importorskip("gradio_client")
    from specviz.bench import ui_overhead as bench_ui
    t, d = pair_dirs
    out = tmp_path / "ui.json"
    assert bench_ui.main(["--target", t, "--draft", d, "--repeats", "1", "--max-new-tokens", "8",
                          "--prompt", "abc abc", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {r["how"] for r in data["rows"]} == {"headless", "ui"}
    assert all(r["tokens"] == 8 and r["spec_tok_s"] > 0 for r in data["rows"])
    assert next(r for r in data["rows"] if r["how"] == "ui")["updates"] > 1  # it streamed
    assert data["ui_over_headless"] > 0
    assert "engine speed with the UI streaming / headless" in capsys.readouterr().out


def test_sweep_runs_a_method_per_option_value(pair_dirs, tmp_path):
    args = _args(pair_dirs, tmp_path, "--methods", "plain,tree", "--no-hf", "--gamma-other", "3",
                 "--sweep", "tree.tree_budget=2,6")
    assert bench.main(args) == 0
    runs = _read_csv(tmp_path / "out" / "runs.csv")
    variants = {r["variant"] for r in runs}
    assert {"tree:3", "tree:3[tree_budget=2]", "tree:3[tree_budget=6]"} <= variants
    assert all(r["match"] == "True" for r in runs)
    summary = _read_csv(tmp_path / "out" / "summary.csv")
    assert any(r["label"].endswith("budget=6") for r in summary)


def test_sweep_rejects_bad_values():
    from specviz.bench.settings import parse_sweeps
    from specviz.errors import RequestError
    assert parse_sweeps(["tree.tree_budget=4,8"]) == {"tree": {"tree_budget": ["4", "8"]}}
    for bad in ("nope.x=1", "tree=4", "tree.tree_budget=0"):
        with pytest.raises(RequestError):
            parse_sweeps([bad])


def test_edit_task_runs_its_own_token_count():
    """--max-new-tokens N sets every task but edit, whose answer repeats a whole function (128 unless named)."""
    from specviz.bench.cli import build_parser
    from specviz.bench.settings import parse_tokens, resolve_settings
    from specviz.errors import RequestError
    assert parse_tokens("64", ["code", "edit"]) == (64, {"edit": 128})
    assert parse_tokens("64", ["code"]) == (64, {})
    assert parse_tokens("64,edit=96", ["code", "edit"]) == (64, {"edit": 96})
    assert parse_tokens("code=16", ["code", "chat"]) == (32, {"code": 16})
    assert parse_tokens(32, ["edit"]) == (32, {"edit": 128})
    for bad in ("1", "x", "poetry=5", "edit=0"):
        with pytest.raises(RequestError, match="--max-new-tokens"):
            parse_tokens(bad, ["code"])
    s = resolve_settings(build_parser().parse_args(["--tasks", "code,edit", "--max-new-tokens", "64"]))
    assert (s.tokens_for("code"), s.tokens_for("edit"), s.tokens_line) == (64, 128, "64 new tokens (edit 128)")
    full = resolve_settings(build_parser().parse_args([]))
    assert "edit" in full.tasks and full.tokens_for("edit") == 128


def test_edit_prompts_json_runs_with_the_chat_template(tmp_path):
    from specviz.bench.settings import load_prompts
    pj = tmp_path / "p.json"
    pj.write_text(json.dumps([{"id": "e", "task": "edit", "text": "Rename x to y: def f(x): return x"}]))
    (p,) = load_prompts(["edit"], None, str(pj))
    assert p.task == "edit" and p.chat_template
