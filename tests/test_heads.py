"""Medusa heads (--method heads) on tiny random fp32 models: training lowers the
loss and caches heads + states, greedy output equals plain decoding, whole
sequences follow the target under sampling, missing or corrupt heads are one
message with the train command."""
from types import SimpleNamespace

import pytest
import torch
from helpers import check_stream, fake_pair, follows_target, run

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import heads as store
from specviz.engine.proposers import make_proposer, method_names
from specviz.engine.proposers.heads import Heads, HeadsProposer, head_logits
from specviz.engine.sampling import SamplingParams
from specviz.errors import RequestError
from specviz.heads import data
from specviz.heads.train import train
from specviz.models.tiny import tiny_model
from specviz.run.request import METHODS, make_request

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"
DOCS = [(f"d{i}", f"def f{i}(x):\n    return x + {i}\n\nclass A{i}:\n    pass\n" * 3) for i in range(12)]


@pytest.fixture(autouse=True)
def one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pair_of(model, tok, name="tiny-test"):
    return fake_pair(target=model, draft=None, tokenizer=tok, eos_ids=[0], device=model.device,
                           spec=SimpleNamespace(name=name, target="tiny", draft="tiny-draft"))


def random_heads(hidden, k, seed=0, scale=0.5):
    torch.manual_seed(seed)
    heads = Heads(hidden, k)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=scale)
    return heads.eval().requires_grad_(False)


def test_method_registered():
    assert "heads" in method_names() and "heads" in METHODS


def test_fresh_heads_equal_the_base_head(target):
    h = torch.randn(5, target.config.hidden_size)
    logits = head_logits(Heads(h.shape[1], 3), target.lm_head, h)
    assert logits.shape == (3, 5, target.config.vocab_size)
    torch.testing.assert_close(logits[2], target.lm_head(h))


def test_training_lowers_the_loss_and_caches(target, tok, monkeypatch):
    pair = pair_of(target, tok)
    heads, rep = train(pair, k=2, n_tokens=800, epochs=4, minutes=2, lr=3e-2, batch=16, seq=64, docs=DOCS)
    assert rep["loss_last"] < rep["loss_first"] and rep["stopped_by"] == "epochs"
    held = rep["held_out"]
    assert all(a < b for a, b in zip(held["ce"], rep["held_out_ce_untrained"], strict=True))
    assert len(held["top1"]) == 2 and held["positions"] > 0
    path = store.save(pair, heads, rep)
    assert path.parent == store.heads_dir(pair) and store.report(pair)["k"] == 2
    back = store.load(pair)
    for a, b in zip(heads.state_dict().values(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # the target's states are cached: a second run does not read the corpus again
    monkeypatch.setattr(data, "target_states", lambda *a, **k: pytest.fail("states recomputed"))
    _, rep2 = train(pair, k=2, n_tokens=800, epochs=1, minutes=0, seq=64, docs=DOCS)
    assert rep2["steps"] == 0 and rep2["stopped_by"] == "minutes"


def test_mse_loss_trains_too(target, tok):
    _, rep = train(pair_of(target, tok), k=2, n_tokens=400, epochs=3, minutes=2, lr=3e-2, batch=16,
                   seq=64, docs=DOCS, loss="mse")
    assert rep["loss_last"] < rep["loss_first"]


def test_verify_state_is_the_training_state(target, tok):
    """The hook's post-norm row is what data.py trains on: last_hidden_state."""
    from transformers import DynamicCache
    ids = tok.encode(PROMPT)
    prop = HeadsProposer(target, random_heads(32, 2), target.config.vocab_size)
    prop.attach_target_cache(DynamicCache())
    prop.verify_logits(ids, [], 1)
    prop.rollback(ids + [5], 0, 0)
    ref = target.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    torch.testing.assert_close(prop.h, ref)


@pytest.mark.parametrize("gamma", [1, 2, 3, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_plain(target, tok, gamma, seed):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    prop = HeadsProposer(target, random_heads(32, 3, seed, scale=0.05), target.config.vocab_size)
    rounds, spec = run(speculative(target, prop, tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids and spec.text == base.text
    check_stream(rounds, spec)
    assert rounds[0].gamma == 0 and all(r.gamma == min(gamma, 3) for r in rounds[1:-1])
    assert spec.drafted > 0


def test_eos_inside_a_draft(target, tok):
    ids = tok.encode(PROMPT)
    _, full = run(baseline(target, tok, ids, 40, GREEDY))
    prop = HeadsProposer(target, Heads(32, 3), target.config.vocab_size)  # fresh: repeats the next token
    for eos in (full.token_ids[7], full.token_ids[12]):
        _, base = run(baseline(target, tok, ids, 40, GREEDY, eos_ids=[eos]))
        rounds, spec = run(speculative(target, prop, tok, ids, 40, 3, GREEDY, eos_ids=[eos]))
        assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
        check_stream(rounds, spec)
    prop.h = torch.randn(32)
    assert len(prop.propose(ids, 3, GREEDY, None, frozenset(range(200))).tokens) == 1


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 2),
                                          (SamplingParams(temperature=0.8, top_k=3), 3)])
def test_sequences_follow_target_distribution(params, gamma):
    V, L, N = 4, 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    heads = random_heads(32, 3, seed=2, scale=0.3)
    prompt = [1, 2, 3, 1, 2]
    assert follows_target(t, lambda: HeadsProposer(t, heads, V), prompt, L, gamma, params, N) > 1e-3


def test_missing_or_corrupt_heads_name_the_train_command(target, tok):
    req = make_request(PROMPT, method="heads")
    pair = pair_of(target, tok, name="default")
    with pytest.raises(RequestError, match=r"No trained .* python -m specviz heads data && python -m specviz heads medusa$"):
        make_proposer(pair, "heads", req)
    store.heads_dir(pair).mkdir(parents=True)
    (store.heads_dir(pair) / "heads.pt").write_bytes(b"garbage")
    with pytest.raises(RequestError, match="cannot be read.*python -m specviz heads medusa"):
        make_proposer(pair, "heads", req)
    store.save(pair, Heads(16, 2), {})  # another hidden size
    with pytest.raises(RequestError, match="does not fit"):
        make_proposer(pair, "heads", req)
    custom = pair_of(target, tok, name="custom")
    assert store.train_command(custom) == "python -m specviz heads train --target tiny --draft tiny-draft"
    store.save(custom, Heads(32, 2), {})
    assert isinstance(make_proposer(custom, "heads", req), HeadsProposer)


def test_cli_trains_a_tiny_target_then_generates(tmp_path, capsys):
    import json

    from specviz.cli.main import main as cli_main
    from specviz.heads.cli import main
    from specviz.models.tiny import save_tiny_pair
    t, d = save_tiny_pair(tmp_path / "m")
    pair_args = ["--target", t, "--draft", d]
    gen = ["generate", *pair_args, "--prompt", "def f(x):", "--json", "--mode", "both", "--max-new-tokens",
           "16", "--gamma", "3", "--method", "heads"]
    assert cli_main(gen) == 2  # nothing trained yet: one line naming the command
    assert f"python -m specviz heads medusa --target {t} --draft {d}" in capsys.readouterr().err
    argv = [*pair_args, "--tokens", "300", "--heads", "2", "--minutes", "1"]
    assert main(["train", *argv]) == 0
    assert "held-out top-1 agreement" in capsys.readouterr().err
    assert main(["info", *argv]) == 0
    assert '"k": 2' in capsys.readouterr().out
    for extra in ([], ["--cache", "static"]):
        assert cli_main(gen + extra) == 0
        base, spec = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert base["token_ids"] == spec["token_ids"] and spec["stats"]["rounds"] > 1


@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_race_without_heads_is_one_message(target, tok, mode):
    from specviz.run.race import race
    req = make_request(PROMPT, method="heads", max_new_tokens=8)
    with pytest.raises(RequestError, match="python -m specviz heads medusa"):
        list(race(pair_of(target, tok, name="default"), req, tok.encode(PROMPT), mode))


@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_race_and_trace_roundtrip(target, tok, tmp_path, mode):
    from specviz.engine.events import RoundEvent, RunSummary
    from specviz.run.race import race
    from specviz.run.trace import load_trace, new_trace, record, replay
    pair = pair_of(target, tok, name="default")
    store.save(pair, random_heads(32, 3, scale=0.05), {})
    req = make_request(PROMPT, method="heads", gamma=3, max_new_tokens=16)
    tr = new_trace({"method": "heads", "options": req.options}, "t", "d", "cpu", mode=mode)
    events = list(record(race(pair, req, tok.encode(PROMPT), mode=mode), tr))
    ends = {s: e for s, e in events if isinstance(e, RunSummary)}
    assert ends["baseline"].token_ids == ends["speculative"].token_ids
    rounds = [e for s, e in events if isinstance(e, RoundEvent)]
    assert rounds and all(r.info["heads"] == 3 for r in rounds)
    back = load_trace(tr.save(tmp_path / "t.json"))
    got = [e for _, e in replay(back.events, speed=1e6) if isinstance(e, RoundEvent)]
    assert [r.info for r in got] == [r.info for r in sorted(rounds, key=lambda r: r.t_end)]


def test_default_corpus_leaves_out_the_bench_prompts():
    docs = data.default_docs()
    assert docs and all(name.startswith("stdlib/") for name, _ in docs)
    assert [n for n, _ in docs[:50]] != sorted(n for n, _ in docs[:50])  # shuffled: many packages


def test_windows_take_a_few_per_file(tok):
    wins = data.windows(tok, 1000, seq=64, docs=DOCS, per_doc=2)
    assert sum(map(len, wins)) == 1000 and max(map(len, wins)) == 64
    assert len(wins) >= 1000 // 64 and wins[0] == tok.encode(DOCS[0][1])[:64]
