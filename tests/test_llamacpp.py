"""The bench's llama.cpp rows against a fake llama-server (tests/fake_llama_server.py,
no build), and the parsing of what the real one printed (tests/data/llamacpp/)."""
import json
from pathlib import Path

import pytest
from fake_llama_server import TOKENS, Fake

import specviz.bench as bench
from specviz.bench import llamacpp_rows
from specviz.hosting import llamacpp as lc
from specviz.models.registry import PAIRS

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "llamacpp"
FAKE = HERE / "fake_llama_server.py"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def fake_server(monkeypatch):
    monkeypatch.setenv("SPECVIZ_LLAMACPP_SERVER", str(FAKE))
    return FAKE


def _bench(pair_dirs, tmp_path, *extra):
    t, d = pair_dirs
    pj = tmp_path / "prompts.json"
    pj.write_text(json.dumps([{"id": "code/a", "task": "code", "text": "def add(a, b):\n"}]))
    gg = [tmp_path / "t.gguf", tmp_path / "d.gguf"]
    for g in gg:
        g.write_bytes(b"GGUF fake")
    return ["--target", t, "--draft", d, "--quick", "--max-new-tokens", "12", "--repeats", "2",
            "--prompts-json", str(pj), "--out", str(tmp_path / "out"), "--no-hf", "--gammas", "3",
            "--llamacpp-gguf", f"{gg[0]},{gg[1]}", *extra]


def _alpha(n_max: int, n: int) -> float:
    f = Fake(n_max)
    f.completion({"n_predict": n, "prompt": [1, 2]})
    return f.accepted / f.drafted


def test_bench_has_llamacpp_rows_interleaved(pair_dirs, tmp_path, capsys, fake_server):
    argv = _bench(pair_dirs, tmp_path, "--methods", "plain,draft,llamacpp,llamacpp-spec",
                  "--llamacpp-gammas", "2,4", "--llamacpp-threads", "2")
    assert bench.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    by = {r["variant"]: r for r in data["summary"] if r["task"] == "code"}
    assert by["llamacpp"]["label"] == "llama.cpp plain"
    assert by["llamacpp-spec:4"]["label"] == "llama.cpp speculative γ=4"
    # llama.cpp's own timings: 12 tokens in 20 ms prefill + 11 × 5 ms
    assert by["llamacpp"]["tokens_per_s"] == pytest.approx(12 / 0.075)
    assert by["llamacpp"]["decode_tokens_per_s"] == pytest.approx(200.0)
    for g in (2, 4):
        row = by[f"llamacpp-spec:{g}"]
        assert row["alpha"] == pytest.approx(_alpha(g, 12)) and row["alpha_hat"] is None and row["c"] is None
        assert row["tau"] is not None  # rounds from the server's /metrics counters
    runs = [r for r in data["runs"] if r["prompt_id"] == "code/a"]
    assert all(r["token_ids"] == TOKENS[:12] for r in runs if r["engine"] == "llamacpp")
    # interleaved: every block holds ours and llama.cpp's, in rotated order
    for rep in (0, 1):
        block = sorted((r for r in runs if r["repeat"] == rep), key=lambda r: r["order"])
        assert {r["variant"] for r in block} == {"plain", "draft:3", "llamacpp", "llamacpp-spec:2",
                                                 "llamacpp-spec:4"}
    assert [r["variant"] for r in runs if r["repeat"] == 0 and r["order"] == 0] != \
           [r["variant"] for r in runs if r["repeat"] == 1 and r["order"] == 0]
    notes = data["meta"]["notes"]
    assert any("llama.cpp output differs from plain" in n and "llamacpp on code/a" in n and
               "first differing position 0" in n for n in notes)  # the fake's tokens are not the tiny model's
    assert any("AVX2" in n and "2 threads" in n for n in notes)
    assert any("outside their own requests" in n for n in notes)
    assert "llama.cpp plain" in out and "× llama.cpp plain" in out and "SpecViz plain" in out
    cmds = data["meta"]["llamacpp_commands"]
    assert cmds["llamacpp-spec:4"][cmds["llamacpp-spec:4"].index("--spec-draft-n-max") + 1] == "4"
    assert "-md" not in cmds["llamacpp"]


def test_rows_skipped_in_one_line_without_the_binary(pair_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECVIZ_LLAMACPP_SERVER", str(tmp_path / "nowhere" / "llama-server"))
    assert bench.main(_bench(pair_dirs, tmp_path, "--methods", "plain,llamacpp,llamacpp-spec")) == 0
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "llama.cpp rows skipped" in ln)
    assert "setup.sh llamacpp" in line
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert {r["variant"] for r in data["runs"]} == {"plain"}


def test_a_server_that_fails_to_start_says_why(pair_dirs, tmp_path, capsys, fake_server):
    argv = _bench(pair_dirs, tmp_path, "--methods", "plain,llamacpp")
    argv[argv.index("--llamacpp-gguf") + 1] = str(tmp_path / "broken.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"x")
    assert bench.main(argv) == 0
    err = capsys.readouterr().err
    assert "llama.cpp rows skipped: llama-server (llamacpp) exited with code 1: llama_model_load: error" in err


def test_other_pairs_need_gguf_files():
    with pytest.raises(lc.LlamaCppError, match="--llamacpp-gguf"):
        llamacpp_rows.gguf_files(PAIRS["smollm2"], None)
    with pytest.raises(lc.LlamaCppError, match="no such file"):
        llamacpp_rows.gguf_files(PAIRS["default"], "/nonexistent.gguf")


def test_server_command_pins_threads_and_gamma():
    plain = lc.server_command("llama-server", "t.gguf", 8080, 2)
    spec = lc.server_command("llama-server", "t.gguf", 8080, 2, "d.gguf", 8)
    for flag, value in (("-t", "2"), ("-tb", "2"), ("-np", "1"), ("--cache-ram", "0")):
        assert plain[plain.index(flag) + 1] == value
    assert "-md" not in plain
    for flag, value in (("-md", "d.gguf"), ("--spec-draft-n-max", "8"), ("--spec-draft-p-min", "0"),
                        ("-td", "2"), ("--spec-type", "draft-simple")):
        assert spec[spec.index(flag) + 1] == value


# ---------------------------------------------------------- real captured output


def _captured(name):
    path = DATA / name
    if not path.is_file():
        pytest.skip(f"no captured output {path.name}")
    return path


def test_parse_a_real_plain_completion():
    raw = json.loads(_captured("completion_plain.json").read_text())
    c = lc.parse_completion(raw)
    t = raw["timings"]
    assert c.token_ids == raw["tokens"] and len(c.token_ids) == t["predicted_n"]
    assert c.n_prompt == t["prompt_n"] and c.drafted == 0
    assert c.elapsed == pytest.approx((t["prompt_ms"] + t["predicted_ms"]) / 1e3)
    assert c.decode_tps == pytest.approx((c.n_predicted - 1) / (c.predicted_ms / 1e3), rel=1e-3)
    assert c.stop_reason in ("max_new_tokens", "eos")


def test_parse_a_real_speculative_completion_and_metrics():
    raw = json.loads(_captured("completion_spec.json").read_text())
    c = lc.parse_completion(raw)
    assert 0 < c.accepted <= c.drafted and c.drafted == raw["timings"]["draft_n"]
    metrics = _captured("metrics_spec.txt").read_text()
    steps = lc.parse_counter(metrics, "spec_decode_num_drafts_total")
    assert steps and lc.parse_counter(metrics, "spec_decode_num_draft_tokens_total") >= c.drafted
    assert lc.parse_counter(metrics, "no_such_counter") is None


def test_system_info_from_a_real_log():
    info = lc.system_info(_captured("server_log.txt").read_text())
    assert "AVX2" in info.split() and "AVX512" not in info.split()


def test_a_bad_answer_is_one_clear_error():
    with pytest.raises(lc.LlamaCppError, match="return_tokens"):
        lc.parse_completion({"content": "hi", "timings": {}})


def test_speculative_compared_with_llamacpp_plain():
    from specviz.bench.runs import Run
    runs = [Run("llamacpp", "llamacpp", "llamacpp", 0, "code", "p", 0, 0, token_ids=[1, 2, 3]),
            Run("llamacpp-spec:4", "llamacpp-spec", "llamacpp", 4, "code", "p", 0, 1, token_ids=[1, 2, 9]),
            Run("llamacpp-spec:8", "llamacpp-spec", "llamacpp", 8, "code", "p", 0, 2, token_ids=[1, 2, 3])]
    assert llamacpp_rows.output_lines(runs) == [
        "llamacpp-spec:4 on p (repeat 1) differs from llama.cpp plain at position 2 (lengths 3 vs 3)"]
