"""The second feature pass over the target's own answers (heads/answers.py) on tiny random models: each
window is the prompt through the chat template and the target's own greedy answer, with the same states
as the first pass; it resumes after an interruption; code tasks are a documented function's signature
and docstring from training files only; and EAGLE's trainer reads it beside the first pass, scoring the
answers' rows only and reporting agreement on the target's own text apart."""
import pytest
import torch
from helpers import interrupted_at, run
from test_eagle import GREEDY, _tiny_data, one_thread, pair_of  # noqa: F401 (one_thread: autouse, a cache here)

from specviz.engine.decoding import baseline
from specviz.heads import answers, features
from specviz.run.request import encode_prompt, make_request

ITEMS = [("chat", f"say {i} and then say it again " * 2) if i % 2 == 0 else ("code", f"def f{i}(x):\n    '''Add.'''\n")
         for i in range(8)]


def _pass(pair, out, **kw):
    return answers.run_answers(pair, out, minutes=5, new=12, method="lookup", items=ITEMS, shard_tokens=60,
                               log=lambda s: None, **kw)


def test_windows_are_the_prompt_and_the_targets_own_greedy_answer(target, tok, tmp_path):
    pair = pair_of(target, tok)
    meta = _pass(pair, tmp_path / "a")
    assert meta["next_window"] == len(ITEMS) and len(meta["shards"]) > 1
    data = features.load_shards(tmp_path / "a")
    wins = [(s, e) for s, e in zip(*_bounds(data["seg"]), strict=True)]
    assert len(wins) == len(ITEMS)
    for (s, e), (kind, text) in zip(wins, ITEMS, strict=True):
        req = make_request(text, method="lookup", max_new_tokens=12, chat_template=True)
        ids = encode_prompt(tok, req)
        _, plain = run(baseline(target, tok, ids, 12, GREEDY, eos_ids=pair.eos_ids))
        assert data["ids"][s:e].tolist() == ids + plain.token_ids
        assert int(data["kind"][s]) == int(kind == "code")
        torch.testing.assert_close(data["h"][s:e], features.states(target, data["ids"][s:e].tolist()))


def _bounds(seg):
    from specviz.heads.eagle_train import windows_of
    w = windows_of(seg)
    return [s for s, _ in w], [e for _, e in w]


def test_the_answers_pass_resumes_after_an_interruption(target, tok, tmp_path, monkeypatch):
    pair = pair_of(target, tok)
    whole = _pass(pair, tmp_path / "a")
    restore = interrupted_at(monkeypatch, answers, "states", 5)
    with pytest.raises(KeyboardInterrupt):
        _pass(pair, tmp_path / "b")
    restore()
    again = _pass(pair, tmp_path / "b")
    assert again["tokens"] == whole["tokens"] and again["next_window"] == len(ITEMS)
    a, b = features.load_shards(tmp_path / "a"), features.load_shards(tmp_path / "b")
    assert torch.equal(a["ids"], b["ids"]) and torch.equal(a["seg"], b["seg"])
    # each run is one stretch in meta.json (the card lists them): what the interrupted one wrote, then the rest
    runs = again["stretches"]
    assert len(runs) == 2 and sum(r["tokens"] for r in runs) == whole["tokens"]
    assert sum(r["prompts"] for r in runs) == len(ITEMS) and 0 < runs[0]["prompts"] < len(ITEMS)
    assert all(r["minutes"] >= 0 and r["began_utc"] for r in runs)


def test_code_tasks_are_signatures_and_docstrings_of_training_files():
    doc = ("import os\n\n\ndef walk_all(top):\n    \"\"\"Every file under top, walked in sorted order, "
           "directories first.\"\"\"\n    out = []\n    for r, _, fs in os.walk(top):\n        out += fs\n"
           "    return out\n")
    docs = [(f"stdlib/m{i}.py", doc) for i in range(10)]
    tasks = answers.code_tasks(docs)
    assert len(tasks) == 9  # file 9 is held out (features.held_out)
    assert tasks[0].startswith("import os\n") and tasks[0].rstrip().endswith('directories first."""')
    assert "out = []" not in tasks[0]


def test_eagle_trains_on_both_passes_and_scores_only_the_answers(target, tok, tmp_path):
    from specviz.heads import eagle_train
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 2000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    many = ITEMS * 4
    answers.run_answers(pair, tmp_path / "q", minutes=5, new=12, method="lookup", items=many, shard_tokens=200,
                        log=lambda s: None)
    first = features.load_shards(tmp_path / "p")
    first["score"] = eagle_train.answer_rows(first, tok)
    joined, val, train = eagle_train.join_answers(first, tmp_path / "q")
    n = len(first["ids"])
    assert len(val) + len(train) == len(many) and all(s >= n for s, _ in val + train)
    prompt_len = len(encode_prompt(tok, make_request(ITEMS[1][1], chat_template=True)))
    s, e = next((s, e) for s, e in val + train if int(joined["kind"][s]) == 1)  # a code task: answer rows only
    assert not joined["score"][s: s + prompt_len - 1].any() and joined["score"][s + prompt_len - 1: e - 1].all()
    _, rep = eagle_train.train_eagle(pair, tmp_path / "p", minutes=1, epochs=1, lr=3e-3, intermediate=64,
                                     also=tmp_path / "q", also_times=3)
    assert rep["held_out_first_draft_agreement"]["own_answers"]["rows"] > 0
    assert "own answers" in rep["trained_on"] and rep["pass_tokens"] == n
    assert rep["train_windows"] == len(eagle_train.split(eagle_train.windows_of(first["seg"]))[1]) + 3 * len(train)


def test_medusa_trains_on_both_passes(target, tok, tmp_path):
    from specviz.heads.medusa_train import train_medusa
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 2000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    answers.run_answers(pair, tmp_path / "q", minutes=5, new=12, method="lookup", items=ITEMS * 2,
                        shard_tokens=200, log=lambda s: None)
    _, alone = train_medusa(pair, tmp_path / "p", k=2, minutes=1, epochs=1, lr=1e-2, batch=64)
    _, both = train_medusa(pair, tmp_path / "p", k=2, minutes=1, epochs=1, lr=1e-2, batch=64,
                           also=tmp_path / "q", also_times=2)
    assert both["positions_seen"] > alone["positions_seen"] and "own answers" in both["trained_on"]
    assert both["pass_tokens"] == alone["pass_tokens"]


def test_raw_code_answers_complete_the_code_as_written_and_train_beside_the_others(target, tok, tmp_path):
    """--raw-code: code tasks only, the prompt with no chat template (the bench's code task) and the
    target's own greedy completion; a folder keeps one kind; EAGLE's trainer reads several answers folders."""
    from specviz.heads import eagle_train
    pair = pair_of(target, tok)
    code = [it for it in ITEMS if it[0] == "code"]
    meta = answers.run_answers(pair, tmp_path / "r", minutes=5, new=12, method="lookup", items=code,
                               shard_tokens=60, log=lambda s: None, raw_code=True)
    assert meta["raw_code"] is True and "no chat template" in meta["what"]
    data = features.load_shards(tmp_path / "r")
    s, e = _bounds(data["seg"])[0][0], _bounds(data["seg"])[1][0]
    ids = encode_prompt(tok, make_request(code[0][1], chat_template=False))
    _, plain = run(baseline(target, tok, ids, 12, GREEDY, eos_ids=pair.eos_ids))
    assert data["ids"][s:e].tolist() == ids + plain.token_ids and bool(data["kind"][s:e].all())
    assert not data["ans"][s: s + len(ids) - 1].any() and data["ans"][s + len(ids) - 1: e - 1].all()
    with pytest.raises(RuntimeError, match="without the chat template"):
        _pass(pair, tmp_path / "r")
    _pass(pair, tmp_path / "q")
    first = features.load_shards(tmp_path / "q")  # any pass will do as the first here
    first["score"] = first.pop("ans").bool()
    joined, val, train = eagle_train.join_answers(first, [tmp_path / "q", tmp_path / "r"])
    assert len(val) + len(train) == len(ITEMS) + len(code)
    assert len(joined["ids"]) == 2 * len(first["ids"]) + len(data["ids"])
    segs = [int(joined["seg"][s]) for s, _ in val + train]
    assert len(set(segs)) == len(segs)  # every window its own id, across the folders


def test_held_out_completion_runs_without_the_chat_template(target, tok, monkeypatch):
    """heads accept's third kind, completion: the code prompts completed as written (the bench's code task)."""
    from specviz.heads import acceptance
    asked = []
    real = acceptance.make_request
    monkeypatch.setattr(acceptance, "make_request", lambda *a, **kw: asked.append(kw["chat_template"]) or real(*a, **kw))
    got = acceptance.measure(pair_of(target, tok), "lookup", gamma=2, new=8,
                             prompts={"code": [ITEMS[1][1]], "completion": [ITEMS[1][1]]})
    assert asked == [True, False] and set(got) == {"code", "completion"} and got["completion"]["prompts"] == 1


def test_batched_answers_are_each_prompts_own_greedy_answer(target, tok, tmp_path):
    """answer_batch (left-padded, one generate for several prompts) writes what plain greedy writes for
    each prompt alone, cut after its stop token; a folder started past other prompts starts there."""
    pair = pair_of(target, tok)
    texts = [text for _, text in ITEMS[:4]]
    for (ids, n), text in zip(answers.answer_batch(pair, texts, 12), texts, strict=True):
        req = make_request(text, method="lookup", max_new_tokens=12, chat_template=True)
        prompt = encode_prompt(tok, req)
        _, plain = run(baseline(target, tok, prompt, 12, GREEDY, eos_ids=pair.eos_ids))
        assert n == len(prompt) and ids == prompt + plain.token_ids
    meta = _pass(pair, tmp_path / "b", batch=3, start=2)
    assert meta["next_window"] == len(ITEMS) and meta["method"].startswith("batched")
    assert features.load_shards(tmp_path / "b")["seg"].min() == 2
