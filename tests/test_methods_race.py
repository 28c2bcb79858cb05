"""The three no-chain-change methods (lookahead, REST, staged) through the race
(fair and parallel) and a trace file, as the page and `specviz.run.trace` use them."""

import pytest
import torch
from helpers import fake_pair

from specviz.engine import datastore as store
from specviz.engine.events import RoundEvent, RunSummary
from specviz.run.race import race
from specviz.run.request import make_request
from specviz.run.trace import load_trace, new_trace, record, replay


@pytest.fixture
def pair(tok, target, draft, monkeypatch):
    # a small stand-in for the default datastore (the real one is built from the stdlib)
    ds = store.from_tokens(tok.encode("x = [1, 2, 3]\ny = [1, 2, 3]\n"))
    monkeypatch.setattr(store, "for_tokenizer", lambda tokenizer, path=None: ds)
    return fake_pair(target=target, draft=draft, tokenizer=tok, eos_ids=[], device=torch.device("cpu"))


@pytest.mark.parametrize("method,opts", [("lookahead", {"window": 3, "guesses": 2}), ("rest", {}),
                                         ("staged", {})])
@pytest.mark.parametrize("mode", ["fair", "parallel"])
def test_race_and_trace_roundtrip(pair, tok, tmp_path, method, opts, mode):
    req = make_request("x = [1, 2, 3]\ny = [", method=method, gamma=3, max_new_tokens=16, options=opts)
    ids = tok.encode(req.prompt)
    tr = new_trace({"method": method, "options": req.options}, "t", "d", "cpu", mode=mode)
    events = list(record(race(pair, req, ids, mode=mode), tr))
    ends = {s: e for s, e in events if isinstance(e, RunSummary)}
    assert ends["baseline"].token_ids == ends["speculative"].token_ids
    rounds = [e for s, e in events if isinstance(e, RoundEvent)]
    assert rounds and all(r.info for r in rounds)
    back = load_trace(tr.save(tmp_path / "t.json"))
    replayed = list(replay(back.events, speed=1e6))
    got = [e for _, e in replayed if isinstance(e, RoundEvent)]
    assert [r.info for r in got] == [r.info for r in sorted(rounds, key=lambda r: r.t_end)]
