"""The CLI on a tiny pair: output formats and one-line errors with exit 2."""
import json

import pytest

from specviz.cli.main import main


def cli(capsys, *args):
    code = main(["generate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_samples_are_reproducible(capsys, pair_dirs):
    t, d = pair_dirs
    args = ["--target", t, "--draft", d, "--prompt", "def f(x):", "--json", "--num-samples", "3",
            "--temperature", "1", "--max-new-tokens", "12", "--seed", "5", "--gamma", "3"]
    code, out, _ = cli(capsys, *args)
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == 3
    for obj in lines:
        assert {"token_ids", "text", "rounds", "stats"} <= obj.keys()
        assert len(obj["token_ids"]) == 12
        outs = [t["token_id"] for r in obj["rounds"] for t in r["tokens"] if t["outcome"] != "rejected"]
        assert outs == obj["token_ids"]
    assert len({tuple(o["token_ids"]) for o in lines}) > 1  # different samples
    code, out2, _ = cli(capsys, *args)
    assert [json.loads(x)["token_ids"] for x in out2.splitlines()] == [o["token_ids"] for o in lines]


def test_greedy_modes_agree(capsys, pair_dirs):
    t, d = pair_dirs
    code, out, _ = cli(capsys, "--target", t, "--draft", d, "--prompt", "hello", "--json",
                       "--mode", "both", "--max-new-tokens", "20")
    base, spec = [json.loads(x) for x in out.splitlines()]
    assert (base["side"], spec["side"]) == ("baseline", "speculative")
    assert base["token_ids"] == spec["token_ids"]
    assert spec["stats"]["speedup"] > 0


def test_human_output_has_colours_and_stats(capsys, pair_dirs):
    t, d = pair_dirs
    code, out, _ = cli(capsys, "--target", t, "--draft", d, "--prompt", "hello", "--max-new-tokens", "10")
    assert code == 0 and "\x1b[" in out and "α" in out and "tokens/s" in out


@pytest.mark.parametrize("extra,needle", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "x", "--gamma", "0"], "between 1 and 16"),
    (["--prompt", "x", "--gamma", "17"], "between 1 and 16"),
    (["--prompt", "x", "--gamma", "two"], "must be a whole number"),
    (["--prompt", "x", "--temperature", "-1"], "Temperature"),
    (["--prompt", "x", "--top-p", "0"], "Top-p"),
    (["--prompt", "x", "--max-new-tokens", "100000"], "Max new tokens"),
])
def test_bad_settings(capsys, pair_dirs, extra, needle):
    t, d = pair_dirs
    code, out, err = cli(capsys, "--target", t, "--draft", d, *extra)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_unknown_path(capsys, pair_dirs, tmp_path):
    code, _, err = cli(capsys, "--target", str(tmp_path / "nope"), "--draft", pair_dirs[1], "--prompt", "x")
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1


def test_different_vocabularies(capsys, pair_dirs, other_vocab_dir):
    code, _, err = cli(capsys, "--target", pair_dirs[0], "--draft", other_vocab_dir, "--prompt", "x")
    assert code == 2 and "different vocabularies" in err.splitlines()[-1]


def test_static_cache_flag_gives_the_same_output(capsys, pair_dirs):
    t, d = pair_dirs
    args = ["--target", t, "--draft", d, "--prompt", "def f(x):", "--json", "--mode", "both",
            "--max-new-tokens", "16", "--gamma", "3"]
    _, out, _ = cli(capsys, *args)
    _, out2, _ = cli(capsys, *args, "--cache", "static")
    ids = [json.loads(x)["token_ids"] for x in out.splitlines()]
    assert [json.loads(x)["token_ids"] for x in out2.splitlines()] == ids
    assert ids[0] == ids[1]
