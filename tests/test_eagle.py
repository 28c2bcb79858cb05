"""EAGLE (--method eagle) on tiny random fp32 models: the head's file round-trips (int8 rows), greedy
output equals plain decoding at every γ, whole sequences follow the target under sampling, the head
reads the states the verify confirmed, a missing head is one message with the training commands,
the feature pass keeps ShareGPT's complete records only, and a short training run lowers the loss."""
import json
from types import SimpleNamespace

import pytest
import torch
from helpers import check_stream, fake_pair, follows_target, interrupted_at, run

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import make_proposer, method_names
from specviz.engine.proposers.eagle import Drafter, EagleProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained import store
from specviz.engine.trained.eagle_head import EagleHead, KeptHead, config_of, pack, unpack
from specviz.errors import RequestError
from specviz.heads import features
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"


@pytest.fixture(autouse=True)
def one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "SHIPPED", tmp_path / "shipped")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def random_head(target, seed=0, scale=0.3, inter=48):
    torch.manual_seed(seed)
    head = EagleHead(config_of(target, intermediate=inter))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=scale)
    return head.eval().requires_grad_(False)


def drafter(target, seed=0, keep=None, scale=0.3):
    v = target.config.vocab_size
    keep = torch.arange(v) if keep is None else keep
    return Drafter(random_head(target, seed, scale), KeptHead(target.lm_head.weight, keep, v, None),
                   target.get_input_embeddings())


def pair_of(model, tok):
    return fake_pair(target=model, draft=None, tokenizer=tok, eos_ids=[0], device=model.device,
                     spec=SimpleNamespace(name="tiny-test", target="tiny", draft="tiny-draft"))


def test_method_registered():
    assert "eagle" in method_names()


def test_file_round_trip_keeps_rows_within_int8(target):
    head = random_head(target)
    keep = torch.tensor([0, 3, 5])
    back, k = unpack(pack(head, keep))
    assert torch.equal(k, keep)
    for (n, a), b in zip(head.state_dict().items(), back.state_dict().values(), strict=True):
        tol = a.abs().amax(-1, keepdim=True) / 127 * 0.65 if a.dim() == 2 else 0
        assert ((a - b).abs() <= tol + 1e-7).all(), n


def test_cache_rows_equal_a_whole_forward(target):
    """Rows read in parts through the head's cache give the rows of one causal forward."""
    head = random_head(target)
    e, f = torch.randn(1, 7, 32), torch.randn(1, 7, 32)
    whole = head(e, f, torch.arange(7))
    from specviz.engine.trained.eagle_head import KV
    kv = KV()
    a = head(e[:, :4], f[:, :4], torch.arange(4), kv)
    b = head(e[:, 4:], f[:, 4:], torch.arange(4, 7), kv)
    torch.testing.assert_close(torch.cat([a, b], 1), whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_plain(target, tok, gamma, seed):
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    keep = torch.arange(0, target.config.vocab_size, 2) if seed else None  # a restricted head too
    rounds, spec = run(speculative(target, EagleProposer(target, drafter(target, seed, keep)), tok, ids, 40,
                                   gamma, GREEDY))
    assert spec.token_ids == base.token_ids and spec.text == base.text
    check_stream(rounds, spec)
    assert rounds[0].gamma == 0 and spec.drafted > 0
    assert all(r.gamma <= gamma for r in rounds)
    if keep is not None:
        assert all(d % 2 == 0 for r in rounds for d in r.draft_ids)  # q is 0 outside the kept ids


@pytest.mark.parametrize("stop,expect", [(0.0, "gamma"), (1.0, "one")])
def test_the_chain_stops_below_its_confidence_and_stays_lossless(target, tok, stop, expect):
    """EAGLE-2's confidence in a chain: the product of the drafts' probabilities under the head. At 0
    the chain always drafts γ (until the budget or an end token), at 100 % it stops after one draft;
    greedy output is plain's either way."""
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    prop = EagleProposer(target, drafter(target), stop_below=stop)
    rounds, spec = run(speculative(target, prop, tok, ids, 40, 4, GREEDY))
    assert spec.token_ids == base.token_ids
    full = rounds[1:-1]  # round 1 drafts nothing; the last may be cut by the budget
    lengths = [len(r.draft_ids) for r in full]
    if expect == "gamma":  # γ every round but where the budget's end or an end token cuts it
        assert len(lengths) > 3 and max(lengths) == 4 and lengths.count(4) >= len(lengths) - 3
    else:
        assert lengths and set(lengths) == {1}


def test_the_confidence_option_is_checked():
    from specviz.engine.proposers import method_spec
    from specviz.engine.proposers.eagle import STOP_PCT
    spec = method_spec("eagle")
    assert spec.check_options({}) == {"confidence": STOP_PCT}
    with pytest.raises(RequestError):
        spec.check_options({"confidence": 101})


def test_head_reads_the_confirmed_states(target, tok):
    """After a round, the states the head reads next are the target's own at the committed positions."""
    from transformers import DynamicCache
    ids = tok.encode(PROMPT)
    prop = EagleProposer(target, drafter(target))
    prop.attach_target_cache(DynamicCache())
    prop.verify_logits(ids, [], 1)
    prop.rollback(ids + [5], 0, 0)
    ref = target.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    torch.testing.assert_close(prop.pend, ref)
    assert prop.pend_at == 0


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 2),
                                          (SamplingParams(temperature=0.8, top_k=3), 3)])
def test_sequences_follow_target_distribution(params, gamma):
    V, L, N = 4, 4, 1200
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = drafter(t, seed=2, scale=0.5)
    prompt = [1, 2, 3, 1, 2]
    assert follows_target(t, lambda: EagleProposer(t, d), prompt, L, gamma, params, N) > 1e-3
    # the chain never stopped short: every draft position tested against the target's law
    assert follows_target(t, lambda: EagleProposer(t, d, stop_below=0.0), prompt, L, gamma, params, N) > 1e-3


def test_missing_head_names_the_training_commands(target, tok):
    with pytest.raises(RequestError, match="heads data.*heads eagle"):
        make_proposer(pair_of(target, tok), "eagle")


def test_saved_head_is_found_and_runs(target, tok):
    pair = pair_of(target, tok)
    keep = torch.arange(target.config.vocab_size)
    path = store.save(pair, "eagle", pack(random_head(target), keep), {"ok": 1})
    assert store.find(pair, "eagle") == path and store.report(pair, "eagle")["ok"] == 1
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 24, GREEDY))
    _, spec = run(speculative(target, make_proposer(pair, "eagle"), tok, ids, 24, 3, GREEDY))
    assert spec.token_ids == base.token_ids
    shipped = store.save(pair, "eagle", pack(random_head(target), keep), {"ok": 2}, ship=True)
    assert store.find(pair, "eagle") == shipped  # a shipped head comes first


def test_a_shipped_head_keeps_the_history_of_the_heads_it_replaces(target, tok):
    """Shipping a new head sums the one it replaces up in the new report's history (the card's table of
    stretches): its sha256, minutes and held-out position 1; shipping the same file again adds nothing."""
    pair = pair_of(target, tok)
    keep = torch.arange(target.config.vocab_size)
    first = {"stretch_s": 60.0, "lr": 1e-3, "note": "first", "findings": ["measured"],
             "held_out_runs": {"chat": {"acceptance": [0.3], "tau": 1.3}}}
    path = store.save(pair, "eagle", pack(random_head(target), keep), first, ship=True)
    digest = store.sha256_of(path)
    assert "history" not in store.report(pair, "eagle")
    blob = pack(random_head(target, seed=1), keep)
    store.save(pair, "eagle", blob, {"stretch_s": 30.0, "note": "second"}, ship=True)
    hist = store.report(pair, "eagle")["history"]
    assert [h["sha256"] for h in hist] == [digest] and hist[0]["note"] == "first"
    assert hist[0]["position_1"] == {"chat": 0.3} and hist[0]["tau"] == {"chat": 1.3}
    assert store.report(pair, "eagle")["findings"] == ["measured"]
    again = store.save(pair, "eagle", blob, store.report(pair, "eagle"), ship=True)
    assert [h["sha256"] for h in store.report(pair, "eagle")["history"]] == [digest] and again == path
    third = store.save(pair, "eagle", pack(random_head(target, seed=2), keep), {"note": "third"}, ship=True)
    assert [h["note"] for h in store.report(pair, "eagle")["history"]] == ["first", "second"] and third == path


def test_a_damaged_shipped_head_is_one_line_and_a_good_one_loads(target, tok):
    """Shipped files are checked against their folder's SHA256SUMS at load: a changed byte, or a file
    the sums do not list, is one RequestError line; the file as shipped loads."""
    from specviz.engine.proposers import eagle
    pair = pair_of(target, tok)
    keep = torch.arange(target.config.vocab_size)
    path = store.save(pair, "eagle", pack(random_head(target), keep), {"ok": 1}, ship=True)
    assert (path.parent / store.SUMS).read_text().endswith("  eagle.pt\n")
    assert isinstance(eagle.load_drafter(pair), Drafter)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(RequestError, match="damaged.*git checkout") as err:
        eagle.load_drafter(pair)
    assert "\n" not in str(err.value)
    (path.parent / store.SUMS).write_text("")
    with pytest.raises(RequestError, match="no sha256"):
        eagle.load_drafter(pair)


def test_cut_json_keeps_complete_records():
    recs = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i}"},
                                             {"from": "gpt", "value": f"a{i}"}]} for i in range(3)]
    text = json.dumps(recs, indent=1)
    cut = text[: text.index('"a2"') + 2]
    got, tail = features.complete_records(cut)
    assert [r["id"] for r in got] == ["0", "1"] and tail > 0
    assert features.complete_records(text) == (recs, 0)


def test_medusa_heads_with_kept_tokens_equal_plain(target, tok):
    """Heads trained on the pass carry their kept ids: they draft only those, and greedy stays plain's."""
    from specviz.engine.proposers import heads as medusa
    pair = pair_of(target, tok)
    torch.manual_seed(0)
    h = medusa.Heads(32, 3)
    for p in h.parameters():
        torch.nn.init.normal_(p, std=0.05)
    keep = torch.arange(0, target.config.vocab_size, 2)
    blob = {"k": 3, "hidden": 32, "version": medusa.VERSION, "keep": keep.to(torch.int32),
            "state": {n: t.to(torch.bfloat16) for n, t in h.state_dict().items()}}
    store.save(pair, "medusa", blob, {"ok": 1})
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 30, GREEDY))
    rounds, spec = run(speculative(target, make_proposer(pair, "heads"), tok, ids, 30, 3, GREEDY))
    assert spec.token_ids == base.token_ids and spec.drafted > 0
    assert all(d % 2 == 0 for r in rounds for d in r.draft_ids)


def _tiny_data():
    convs = [[{"role": "user", "content": f"say {i} " * 12}, {"role": "assistant", "content": f"ok {i} " * 20}]
             for i in range(20)]
    docs = [(f"stdlib/m{i}.py", f"def f{i}(x):\n    return x + {i}\n\n" * 30) for i in range(20)]
    return convs, docs


def test_pass_resumes_after_an_interruption(target, tok, tmp_path, monkeypatch):
    convs, docs = _tiny_data()
    monkeypatch.setattr(features, "SHARD", 150)
    whole = features.run_pass(target, tok, tmp_path / "a", 900, seq=64, convs=convs, docs=docs, log=None)
    restore = interrupted_at(monkeypatch, features, "states", 6)
    with pytest.raises(KeyboardInterrupt):
        features.run_pass(target, tok, tmp_path / "b", 900, seq=64, convs=convs, docs=docs, log=None)
    restore()
    again = features.run_pass(target, tok, tmp_path / "b", 900, seq=64, convs=convs, docs=docs, log=None)
    assert again["tokens"] == whole["tokens"] >= 800 and len(again["shards"]) == len(whole["shards"]) > 2
    a, b = features.load_shards(tmp_path / "a"), features.load_shards(tmp_path / "b")
    assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["h"], b["h"])
    ref = target.model(input_ids=a["ids"][None, :64].long()).last_hidden_state[0]
    torch.testing.assert_close(a["h"][:64].float(), ref, atol=2e-2, rtol=2e-2)  # bf16 states


def test_training_lowers_the_loss_and_the_file_runs(target, tok, tmp_path):
    from specviz.heads.eagle_train import train_eagle
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 3000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    blob, rep = train_eagle(pair, tmp_path / "p", minutes=2, epochs=4, lr=3e-3, intermediate=64)
    assert rep["loss_last"][1] < rep["loss_first"][1] and rep["stopped_by"] == "epochs"
    assert "tokens read through" in rep["trained_on"] and rep["held_out_first_draft_agreement"]["rows"] > 0
    store.save(pair, "eagle", blob, rep)
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 24, GREEDY))
    _, spec = run(speculative(target, make_proposer(pair, "eagle"), tok, ids, 24, 3, GREEDY))
    assert spec.token_ids == base.token_ids


def test_training_resumes_from_its_checkpoint_and_starts_from_a_file(target, tok, tmp_path):
    from specviz.engine.trained.eagle_head import pack
    from specviz.heads import eagle_train
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 2000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    blob, rep = eagle_train.train_eagle(pair, tmp_path / "p", minutes=2, epochs=1, lr=3e-3, intermediate=64)
    ck = torch.load(tmp_path / "p" / eagle_train.CKPT, weights_only=False)
    assert ck["step"] == rep["steps"] > 0 and rep["started_from"] == "scratch"
    _, again = eagle_train.train_eagle(pair, tmp_path / "p", minutes=2, epochs=1, lr=3e-3, intermediate=64,
                                       resume=True)
    assert again["started_from"] == "checkpoint" and again["steps"] == 2 * rep["steps"]
    torch.save(blob, tmp_path / "eagle.pt")  # a trained file: its weights, dequantised, go on learning
    model, got = eagle_train.start_from(tmp_path / "eagle.pt")
    assert got["from_file"] == str(tmp_path / "eagle.pt") and all(p.requires_grad for p in model.parameters())
    assert torch.equal(got["keep"], blob["keep"].long()) and got["trained_before"] == rep["trained_on"]
    assert torch.equal(pack(model, blob["keep"])["int8"]["fc.weight"], blob["int8"]["fc.weight"])
    # trained on from the file over another pass: the file's kept vocabulary, and what it read before
    features.run_pass(target, tok, tmp_path / "q", 600, seq=64, convs=convs[::-1], docs=docs, log=None)
    more, rep2 = eagle_train.train_eagle(pair, tmp_path / "q", minutes=1, epochs=1, lr=3e-3,
                                         init=tmp_path / "eagle.pt")
    assert torch.equal(more["keep"], blob["keep"]) and rep2["trained_on"].startswith(rep["trained_on"] + "; then ")
    resumed, rep3 = eagle_train.train_eagle(pair, tmp_path / "q", minutes=1, epochs=1, lr=3e-3, resume=True)
    assert rep3["started_from"] == "checkpoint" and torch.equal(resumed["keep"], blob["keep"])
    assert rep3["trained_on"] == rep2["trained_on"]


def test_medusa_training_on_the_pass(target, tok, tmp_path):
    from specviz.heads.medusa_train import train_medusa
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 3000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    blob, rep = train_medusa(pair, tmp_path / "p", k=2, minutes=2, epochs=3, lr=1e-2, batch=64)
    assert rep["loss_last"] < rep["loss_first"] and len(rep["held_out_top1_by_head"]["code"]) == 2
    store.save(pair, "medusa", blob, rep)
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 24, GREEDY))
    _, spec = run(speculative(target, make_proposer(pair, "heads"), tok, ids, 24, 2, GREEDY))
    assert spec.token_ids == base.token_ids


def test_the_hub_default_finds_the_embedded_targets_shipped_head(target, tok):
    """A Space without the embedded packages loads the same default target from the Hub: it is offered
    the head shipped for the embedded one."""
    from specviz.hosting.spaces import HUB_TARGET
    from specviz.models.embedded import DEFAULT_TARGET

    def pair(t):
        return fake_pair(target=target, draft=None, tokenizer=tok, eos_ids=[0], device=target.device,
                         spec=SimpleNamespace(name="default", target=t, draft="d"))
    path = store.save(pair(DEFAULT_TARGET), "eagle", pack(random_head(target), torch.arange(4)), {}, ship=True)
    assert store.find(pair(HUB_TARGET), "eagle") == path
    assert store.find(pair_of(target, tok), "eagle") is None


def test_training_scores_the_answers_rows_and_code_not_the_prompt():
    """answer_rows: chat rows are scored only where the next token is the assistant's (after the
    template's assistant header, until the next header), code rows always; a window starts anew."""
    from specviz.heads.eagle_train import answer_rows
    S, A, U = 1, 2, 3  # <|im_start|>, "assistant", "user"
    tok = SimpleNamespace(unk_token_id=None,
                          convert_tokens_to_ids=lambda t: {"<|im_start|>": S, "assistant": A}.get(t))
    ids = [S, U, 9, 9, S, A, 7, 7, 7, 9, 9, 9, 9]
    seg = [0] * 9 + [1] * 4
    kind = [0] * 9 + [1] * 4
    data = {"ids": torch.tensor(ids), "seg": torch.tensor(seg), "kind": torch.tensor(kind)}
    got = answer_rows(data, tok).tolist()
    # row i is scored when token i+1 is the assistant's: the role token onwards (rows 4..7), not row 8
    # (its next token opens the code window), every code row
    assert got == [False, False, False, False, True, True, True, True, False, True, True, True, True]
    plain = SimpleNamespace(unk_token_id=0, convert_tokens_to_ids=lambda t: 0)
    assert answer_rows(data, plain).all()


def test_training_and_its_report_read_only_the_scored_rows(target, tok, tmp_path, monkeypatch):
    """Rows answer_rows leaves out (a chat's prompt) are neither trained on nor counted in the report's
    held-out agreement."""
    from specviz.heads import eagle_train
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 3000, seq=64, convs=convs, docs=docs, log=None)
    monkeypatch.setattr(eagle_train, "answer_rows", lambda data, tok: torch.arange(len(data["ids"])) % 3 != 0)
    _, rep = eagle_train.train_eagle(pair_of(target, tok), tmp_path / "p", minutes=1, epochs=1, lr=3e-3,
                                     intermediate=64)
    data = features.load_shards(tmp_path / "p")
    wins = eagle_train.windows_of(data["seg"])
    val = wins[eagle_train.VAL_EVERY - 1:: eagle_train.VAL_EVERY][:200]
    scored = sum(int((torch.arange(s + 1, e) % 3 != 0).sum()) for s, e in val)
    assert rep["held_out_first_draft_agreement"]["rows"] == scored > 0
