"""REST retrieval drafts: the suffix array, lookups, datastore files (good,
missing, corrupt), greedy equality and the target's law under sampling."""

import numpy as np
import pytest
from helpers import acceptance, assert_follows_target, check_stream, fake_pair, run, sample_sequences

from specviz.engine import datastore as store
from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers.rest import RestProposer
from specviz.engine.sampling import SamplingParams
from specviz.errors import RequestError
from specviz.models.tiny import tiny_model
from specviz.run.request import make_request
from specviz.run.runner import run_events

GREEDY = SamplingParams(temperature=0)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("seed,vocab", [(0, 3), (1, 50)])
def test_suffix_array_is_sorted(seed, vocab):
    toks = np.random.default_rng(seed).integers(0, vocab, 3000).astype(np.int32)
    toks[::97] = store.SEP
    ds = store.from_tokens(toks)
    keys = [toks[s: s + store.DEPTH].tolist() for s in ds.sa]
    assert keys == sorted(keys) and sorted(ds.sa.tolist()) == list(range(len(toks)))


def test_longest_match_and_most_frequent_continuation():
    ds = store.from_tokens([5, 1, 2, 3, 4, 9, -1, 1, 2, 3, 4, 8, -1, 7, 2, 3, 4, 9, -1, 1, 2, 3])
    n, lo, hi = store.match(ds, [6, 1, 2, 3])
    assert (n, hi - lo) == (3, 3)  # "1 2 3" three times; "6 1 2 3" never
    chain, support = store.continuation(ds, n, lo, hi, 4)
    assert chain == [4, 8] and support == [2, 1]  # 8 and 9 tie: the smaller id; a document end stops it
    assert store.match(ds, [2, 3], max_len=16, min_len=2)[0] == 2
    assert store.match(ds, [6, 6, 6])[0] == 0


def test_build_save_load_roundtrip(tok, tmp_path):
    docs = [("a", "def f(x):\n    return x + 1\n"), ("b", "def g(x):\n    return x + 2\n")]
    ds = store.build(tok, docs, progress=False)
    assert ds.size == sum(len(t) for _, t in docs) + 2  # char tokenizer + one SEP per document
    assert ds.meta["documents"] == 2 and ds.meta["build_s"] >= 0
    path = store.save(ds, tmp_path / "ds.npz")
    back = store.load(path)
    assert np.array_equal(back.tokens, ds.tokens) and np.array_equal(back.sa, ds.sa)
    assert back.meta["tokenizer"] == store.tokenizer_key(tok)
    n, lo, hi = store.match(back, tok.encode("    return x "))
    assert n >= 8 and store.continuation(back, n, lo, hi, 2)[0] == tok.encode("+ ")


def test_default_corpus_build_is_cached(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(store, "DEFAULT_CHARS", 20_000)
    monkeypatch.setattr(store, "_LOADED", {})
    ds = store.for_tokenizer(tok)
    assert 20_000 <= ds.size < 200_000 and store.default_path(tok).is_file()
    assert store.for_tokenizer(tok) is ds
    store.default_path(tok).write_bytes(b"garbage")  # a broken cache is rebuilt, not reported
    monkeypatch.setattr(store, "_LOADED", {})
    assert store.for_tokenizer(tok).size == ds.size


def test_bad_datastore_files_give_one_message(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    mismatched = tmp_path / "mismatch.npz"
    np.savez(mismatched, tokens=np.arange(5, dtype=np.int32), sa=np.arange(4, dtype=np.int32),
             meta=np.array("{}"))
    for path, needle in [(tmp_path / "missing.npz", "does not exist"), (bad, "cannot be read"),
                         (mismatched, "corrupt"), (tmp_path, "does not exist")]:
        with pytest.raises(RequestError, match=needle):
            make_request("hi", method="rest", options={"datastore": str(path)})
    with pytest.raises(RequestError, match="file path"):
        make_request("hi", method="rest", options={"datastore": 3})


def test_datastore_of_another_tokenizer_is_refused(tok, target, tmp_path):
    ds = store.from_tokens([1, 2, 3])
    ds.meta["tokenizer"] = "someoneelse"
    path = store.save(ds, tmp_path / "other.npz")
    req = make_request("ab", method="rest", options={"datastore": str(path)})
    pair = fake_pair(target=target, draft=None, tokenizer=tok, eos_ids=[])
    with pytest.raises(RequestError, match="another tokenizer"):
        run_events(pair, req, "speculative", [1, 2])


def _store_from(tok, target, prompt):
    """A datastore holding what the target writes: retrieval then finds real continuations."""
    _, full = run(baseline(target, tok, tok.encode(prompt), 60, GREEDY))
    return store.from_tokens(full.token_ids + [store.SEP] + tok.encode("abc abc abc"))


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_greedy_rest_equals_baseline(tok, target, gamma):
    ds = _store_from(tok, target, "x = 1")
    ids = tok.encode("def quicksort(arr): arr arr arr")
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    rounds, spec = run(speculative(target, RestProposer(ds, target.config.vocab_size), tok, ids, 40,
                                   gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    check_stream(rounds, spec)
    assert all("lookup_ms" in r.info and "match_len" in r.info for r in rounds)


def test_eos_inside_a_retrieved_draft(tok, target):
    ids = tok.encode("def quicksort(arr):")
    _, full = run(baseline(target, tok, ids, 40, GREEDY))
    ds = store.from_tokens(ids + full.token_ids)  # a perfect datastore: every draft is accepted
    eos = full.token_ids[9]
    _, base = run(baseline(target, tok, ids, 40, GREEDY, eos_ids=[eos]))
    for gamma in (3, 6):
        rounds, spec = run(speculative(target, RestProposer(ds, target.config.vocab_size), tok, ids, 40,
                                       gamma, GREEDY, eos_ids=[eos]))
        assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
        assert spec.accepted > 0
        check_stream(rounds, spec)


def test_rest_sequences_follow_target_distribution():
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    ds = store.from_tokens(np.random.default_rng(0).integers(0, V, 400).tolist())
    exact, counts, runs = sample_sequences(speculative, t, lambda: RestProposer(ds, V), 2,
                                           SamplingParams(temperature=1.0), N)
    assert 0.05 < acceptance(runs) < 0.95
    assert_follows_target(counts, exact, N)


def test_datastore_command_builds_and_describes(tmp_path, capsys):
    import json

    from specviz.models.tiny import save_tiny_pair
    target_dir, _ = save_tiny_pair(tmp_path / "pair")
    out = tmp_path / "ds.npz"
    assert store.main(["build", "--tokenizer", target_dir, "--out", str(out), "--max-chars", "5000"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["tokens"] > 1000 and out.is_file() and built["build_s"] < 60
    assert store.main(["info", "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == built["tokens"]
    assert store.main(["info", "--out", str(tmp_path / "nope.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_bad_datastore_is_one_line(tmp_path, capsys, pair_dirs):
    from specviz.cli.main import main
    t, d = pair_dirs
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"\x00" * 100)
    for path, needle in [(bad, "cannot be read"), (tmp_path / "none.npz", "does not exist")]:
        code = main(["generate", "--target", t, "--draft", d, "--method", "rest", "--datastore", str(path),
                     "--prompt", "hi", "--max-new-tokens", "3"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("error: REST datastore") and needle in err
        assert len(err.splitlines()) == 1
