"""--engine vllm against a fake vLLM server on 127.0.0.1 (no vLLM, no network):
the same JSON lines as our engine, tokens coloured by engine step, acceptance
from /metrics, and one clear message for each kind of bad input."""
import json
import stat
import sys
from pathlib import Path

import pytest
from fake_vllm import ACCEPTS, TOKENS, Fake, serve

from specviz.cli import main as cli
from specviz.hosting.vllm_stream import parse_metrics

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def servers():
    plain, spec = Fake(0), Fake(3)
    (s1, u1), (s2, u2) = serve(plain), serve(spec)
    yield (plain, u1), (spec, u2)
    s1.shutdown(), s2.shutdown()


def run_cli(capsys, *argv):
    code = cli.main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def pair_args(pair_dirs):
    return ["--target", pair_dirs[0], "--draft", pair_dirs[1]]


def test_parse_metrics():
    text = Fake(3).metrics()
    c = parse_metrics(text)
    assert c.present and c.gamma == 3 and c.drafts == 0
    f = Fake(3)
    f.chunks(20)
    c = parse_metrics(f.metrics())
    assert (c.drafts, c.draft_tokens, c.accepted) == (f.drafts, f.draft_tokens, f.accepted)
    assert [c.per_pos[i] for i in range(3)] == f.per_pos
    assert not parse_metrics(Fake(0).metrics()).present


def test_same_json_lines_as_our_engine(pair_dirs, servers, capsys):
    (plain, u1), (spec, u2) = servers
    common = [*pair_args(pair_dirs), "--prompt", "def f(x):", "--mode", "both", "--gamma", "3",
              "--max-new-tokens", "20", "--json"]
    code, ours, _ = run_cli(capsys, *common)
    assert code == 0
    code, theirs, err = run_cli(capsys, *common, "--engine", "vllm", "--vllm-url", u2, "--vllm-url", u1)
    assert code == 0, err
    ours, theirs = [[json.loads(ln) for ln in out.splitlines()] for out in (ours, theirs)]
    assert [o["side"] for o in theirs] == ["baseline", "speculative"]
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and a["stats"].keys() == b["stats"].keys()
    base, sp = theirs
    assert base["token_ids"] == TOKENS[:20] == sp["token_ids"]
    assert plain.requests[0]["prompt"] == spec.requests[0]["prompt"]  # token ids, sent as such
    st = sp["stats"]
    assert st["engine"] == "vllm" and st["alpha_hat"] is None and st["c"] is None  # not exposed: None, not 0
    assert st["extra"]["acceptance_source"] == "vLLM /metrics counters"
    assert st["drafted"] == spec.draft_tokens and st["accepted"] == spec.accepted
    assert st["alpha"] == pytest.approx(spec.accepted / spec.draft_tokens)
    assert st["extra"]["accepted_per_position"] == [round(v / spec.drafts, 4) for v in spec.per_pos]
    assert "does not expose" in st["extra"]["not_exposed"]
    assert st["speedup"] is not None


def test_tokens_coloured_by_engine_step(pair_dirs, servers, capsys):
    _, (spec, u2) = servers
    code, out, err = run_cli(capsys, *pair_args(pair_dirs), "--prompt", "x", "--gamma", "3",
                             "--max-new-tokens", "30",
                             "--json", "--engine", "vllm", "--vllm-url", u2)
    assert code == 0, err
    rounds = json.loads(out)["rounds"]
    assert "gamma_note" not in json.loads(out)["stats"]["extra"]
    assert rounds[0]["gamma"] == 0 and [t["outcome"] for t in rounds[0]["tokens"]] == ["target"]
    assert rounds[0]["prompt_tokens"] > 0
    for r, acc in zip(rounds[1:-1], ACCEPTS, strict=False):
        outcomes = [t["outcome"] for t in r["tokens"]]
        assert r["n_accepted"] == acc
        assert outcomes == ["accepted"] * acc + ["bonus" if acc == 3 else "resampled"]


def test_human_output_says_what_vllm_does_not_expose(pair_dirs, servers, capsys):
    (_, u1), (_, u2) = servers
    code, out, _ = run_cli(capsys, *pair_args(pair_dirs), "--prompt", "x", "--gamma", "3",
                             "--max-new-tokens", "12",
                           "--mode", "both", "--engine", "vllm", "--vllm-url", u1, "--vllm-url", u2)
    assert code == 0
    assert "does not expose" in out and "per draft position" in out and "n/a" in out


def fake_python(tmp_path, body: str) -> str:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_starts_its_own_servers_from_the_vllm_env(pair_dirs, tmp_path, capsys, monkeypatch):
    # stands in for .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server ...
    monkeypatch.setenv("SPECVIZ_VLLM_PYTHON", fake_python(
        tmp_path, f'shift 2; exec {sys.executable} {ROOT / "tests" / "fake_vllm.py"} "$@"'))
    code, out, err = run_cli(capsys, *pair_args(pair_dirs), "--prompt", "x", "--gamma", "3",
                             "--max-new-tokens", "10",
                             "--mode", "both", "--json", "--engine", "vllm")
    assert code == 0, err
    lines = [json.loads(ln) for ln in out.splitlines()]
    assert [ln["stats"]["method"] for ln in lines] == ["vllm plain", "vllm draft_model"]
    assert lines[1]["stats"]["gamma"] == 3


@pytest.mark.parametrize("case, message", [
    ("not set up", "vLLM is not set up"),
    ("fails to start", "did not start: ValueError: Model architectures ['FooForCausalLM'] are not supported"),
    ("url not answering", "does not answer"),
    ("model it cannot serve", "vLLM refused the request: The model `x` does not exist."),
    ("no plain server", "no plain (no speculative_config) vLLM server"),
    ("engine dies mid-run", "closed the stream before the run finished"),
])
def test_bad_input_one_clear_line(pair_dirs, tmp_path, capsys, monkeypatch, case, message):
    argv = [*pair_args(pair_dirs), "--prompt", "x", "--max-new-tokens", "5", "--mode", "both", "--engine", "vllm"]
    srv = None
    if case == "not set up":
        monkeypatch.delenv("SPECVIZ_VLLM_PYTHON", raising=False)
        monkeypatch.setenv("SPECVIZ_VLLM_VENV", str(tmp_path / "nowhere"))
    elif case == "fails to start":
        monkeypatch.setenv("SPECVIZ_VLLM_PYTHON", fake_python(
            tmp_path, "echo 'INFO starting'; echo \"ValueError: Model architectures ['FooForCausalLM'] are "
                      "not supported for now.\"; exit 1"))
    elif case == "url not answering":
        from specviz.hosting.vllm_server import free_port
        argv += ["--vllm-url", f"http://127.0.0.1:{free_port()}"]
    elif case == "model it cannot serve":
        srv, url = serve(Fake(0, fail_with="The model `x` does not exist."))
        argv += ["--vllm-url", url]
    elif case == "engine dies mid-run":
        (srv, url), (srv2, url2) = serve(Fake(0, die_after=2)), serve(Fake(3))
        argv += ["--vllm-url", url, "--vllm-url", url2]
    else:
        srv, url = serve(Fake(3))
        argv += ["--vllm-url", url]
    code, out, err = run_cli(capsys, *argv)
    for s in (srv, locals().get("srv2")):
        if s:
            s.shutdown()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err


def test_page_loader_failure_keeps_the_app_up(tmp_path, monkeypatch, pair_dirs):
    from specviz.hosting.vllm import vllm_loader
    from specviz.models import resolve_pair
    from specviz.ui.loader import ModelManager
    monkeypatch.setenv("SPECVIZ_VLLM_VENV", str(tmp_path / "nowhere"))
    monkeypatch.delenv("SPECVIZ_VLLM_PYTHON", raising=False)
    m = ModelManager(loader=vllm_loader(()))
    m.start(resolve_pair("custom", *pair_dirs))
    assert not m.wait(30)
    assert "vLLM is not set up" in m.status()["error"]


def test_bench_has_vllm_rows(pair_dirs, servers, tmp_path, capsys):
    from specviz.bench import cli as bench
    (plain, u1), (spec, u2) = servers
    pj = tmp_path / "prompts.json"
    pj.write_text(json.dumps([{"id": "code/a", "task": "code", "text": "def add(a, b):\n"}]))
    code = bench.main(["--target", pair_dirs[0], "--draft", pair_dirs[1], "--quick", "--max-new-tokens", "12",
                       "--repeats", "2", "--prompts-json", str(pj), "--out", str(tmp_path / "out"),
                       "--methods", "plain,draft,vllm,vllm-spec", "--gammas", "3", "--gamma-other", "3",
                       "--no-hf",
                       "--vllm-url", u1, "--vllm-url", u2])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["summary"]
    by = {r["variant"]: r for r in rows if r["task"] == "code"}
    assert by["vllm"]["label"] == "vLLM plain" and by["vllm"]["tokens_per_s"] > 0
    vs = by["vllm-spec:3"]
    assert vs["label"] == "vLLM speculative γ=3" and vs["alpha"] == pytest.approx(
        ACCEPTS_ALPHA(12), abs=1e-9) and vs["alpha_hat"] is None
    assert vs["cpu_speedup"] is None and vs["peak_rss_mb"] is None  # the server's, not ours
    assert "vLLM plain" in out and "vLLM speculative γ=3" in out and "× vLLM plain" in out


def ACCEPTS_ALPHA(n):  # α the fake server's counters give for one n-token request
    f = Fake(3)
    f.chunks(n)
    return f.accepted / f.draft_tokens


def test_page_on_vllm_servers(pair_dirs, servers):
    """The app with --engine vllm: loads through the page's manager, the race
    streams both sides, the numbers vLLM cannot give are n/a, the note says why."""
    import app
    from specviz.run.race import race
    from specviz.run.request import encode_prompt, make_request
    from specviz.ui import render
    from specviz.ui.state import RunView
    (plain, u1), (spec, u2) = servers
    args = app.build_parser().parse_args(["--target", pair_dirs[0], "--draft", pair_dirs[1], "--engine", "vllm",
                                          "--vllm-url", u1, "--vllm-url", u2])
    demo, manager = app.create_app(args)
    assert manager.wait(60), manager.status()
    st = manager.status()
    assert "does not expose" in st["note"] and "γ is fixed by the deployment at 3" in st["note"]
    assert "sv-pair-note" in render.status_html(st)
    req = make_request("def f(x):", method="draft", gamma=3, max_new_tokens=16, temperature=0.0)
    ids = encode_prompt(manager.pair.tokenizer, req)
    for mode in ("fair", "parallel"):
        view = RunView(3, 0.0, mode)
        view.unmeasured = manager.pair.unmeasured
        for side, ev in race(manager.pair, req, ids, mode):
            view.add(side, ev)
            stats = view.stats()
            assert stats.get("alpha_hat") is None and stats.get("predicted") is None
        assert view.finished and view.base.summary.token_ids == TOKENS[:16]
        assert view.stats()["alpha"] == pytest.approx(view.spec.summary.accepted / view.spec.summary.drafted)


def test_tooltip_says_vllm_does_not_expose_p_q():
    from specviz.engine.events import Outcome, TokenEvent
    from specviz.ui.render import tooltip
    text = tooltip(TokenEvent(5, "x", Outcome.ACCEPTED, 0.1, round=2, position=1))
    assert "not exposed" in text and "p/q" not in text
    ours = tooltip(TokenEvent(5, "x", Outcome.ACCEPTED, 0.1, round=2, position=1, p=0.5, q=0.4, u=0.3))
    assert "min(1, p/q)" in ours


def test_a_deployments_gamma_is_its_own(pair_dirs, servers, capsys):
    _, (spec, u2) = servers
    code, out, err = run_cli(capsys, *pair_args(pair_dirs), "--prompt", "x", "--gamma", "5",
                             "--max-new-tokens", "9", "--json", "--engine", "vllm", "--vllm-url", u2)
    assert code == 0, err
    st = json.loads(out)["stats"]
    assert st["gamma"] == 3 and st["extra"]["gamma_note"] == "γ 5 was asked for; the vLLM server drafts 3"


# ------------------------------------------------------------ near-ties from top-2 logprobs (issue 51)

def _both(capsys, pair_dirs, plain_rows, spec_rows):
    """generate --engine vllm --mode both --json against two fakes with these logprob rows."""
    plain, spec = Fake(0, rows=plain_rows), Fake(3, rows=spec_rows)
    (s1, u1), (s2, u2) = serve(plain), serve(spec)
    try:
        code, out, err = run_cli(capsys, *pair_args(pair_dirs), "--prompt", "x", "--gamma", "3",
                                 "--max-new-tokens", "16", "--mode", "both", "--json", "--engine", "vllm",
                                 "--vllm-url", u1, "--vllm-url", u2)
    finally:
        s1.shutdown(), s2.shutdown()
    return code, [json.loads(ln) for ln in out.splitlines()], err, plain, spec


def test_vllm_runs_ask_for_top2_logprobs_and_a_near_tie_is_judged(pair_dirs, capsys):
    """Both sides ask for each token's top 2 (ids, not strings); a flip between two tokens whose
    logprobs are 0.01 apart is called a near-tie, not "no record of which tokens the rows ranked top"."""
    a, b = TOKENS[7], 99
    code, (base, sp), err, plain, spec = _both(capsys, pair_dirs, {7: {a: -0.690, b: -0.700}},
                                                {7: {b: -0.690, a: -0.700}})
    for fake in (plain, spec):
        assert fake.requests[0]["logprobs"] == 2 and fake.requests[0]["return_tokens_as_token_ids"] is True
    assert base["token_ids"][7] == a and sp["token_ids"][7] == b
    eq = sp["greedy_equality"]
    assert code == 0, err
    assert eq["verdict"] == "near-tie" and eq["position"] == 7 and eq["gap_base"] == pytest.approx(0.01)
    assert eq["reason"] == "the top two swapped"


def test_vllm_difference_beyond_rounding_is_a_mismatch(pair_dirs, capsys):
    a, b = TOKENS[7], 99
    code, (_, sp), _, _, _ = _both(capsys, pair_dirs, {7: {a: -0.01, b: -5.0}}, {7: {b: -0.01, a: -5.0}})
    assert code == 1 and sp["greedy_equality"]["verdict"] == "mismatch"
    assert sp["greedy_equality"]["reason"] == "a gap beyond rounding"


def test_the_page_says_differs_at_a_near_tie_for_vllm_rows():
    import torch

    from specviz.engine.events import Outcome, RoundEvent, RunSummary, TokenEvent
    from specviz.hosting.vllm import _gap
    from specviz.ui import render
    from specviz.ui.state import RunView
    view = RunView(gamma=3, temperature=0.0, mode="fair")
    view.dtype = torch.bfloat16  # vLLM's rows: the threshold at magnitude 1, 16 × 2^-7
    base = [TokenEvent(t, "x", Outcome.TARGET, 0.1 * i, gap=_gap({t: -0.69, 99 if t != 99 else 98: -0.7}, t))
            for i, t in enumerate([5, 6, 7])]
    spec_tokens = [TokenEvent(t, "x", Outcome.TARGET, 0.1, gap=_gap(row, t)) for t, row in
                   ((5, {5: -0.69, 99: -0.7}), (6, {6: -0.69, 99: -0.7}), (99, {99: -0.69, 7: -0.7}))]
    for ev in base:
        view.add("baseline", ev)
    view.add("speculative", RoundEvent(0, 0, [], [], [], [], [], 0, 99, False, 0.0, 0.0, 0.3, 0.3, 0,
                                       tokens=spec_tokens, total_tokens=3))
    view.add("baseline", RunSummary("baseline", "vllm plain", [5, 6, 7], "", 3, 0.3, 0.1, 3, "max_new_tokens"))
    view.add("speculative", RunSummary("speculative", "vllm draft_model", [5, 6, 99], "", 3, 0.3, 0.1, 1,
                                       "max_new_tokens", rounds=1))
    badge = view.identical()
    assert badge["verdict"] == "near-tie" and badge["first_diff"] == 2
    assert "differ from token 3 at a numerical near-tie" in render.run_info_html(view.snapshot())
