"""Record & replay: a trace round-trips to the identical event stream."""
import threading

import pytest

from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import RoundEvent, RunSummary
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams
from specviz.run.trace import event_time, load_trace, new_trace, replay


@pytest.fixture(scope="module")
def trace(tok, target, draft):
    ids = tok.encode("print('<b>&amp;</b>')")
    tr = new_trace({"gamma": 3}, "tiny-t", "tiny-d", "cpu", "float32", label="test")
    params = SamplingParams(temperature=0.9, top_k=20)
    for ev in baseline(target, tok, ids, 15, params, seed=1):
        tr.add("baseline", ev)
    for ev in speculative(target, DraftModelProposer(draft), tok, ids, 15, 3, params, seed=1):
        tr.add("speculative", ev)
    return tr


def test_roundtrip_is_identical(trace, tmp_path):
    path = trace.save(tmp_path / "t.json")
    back = load_trace(path)
    assert back.meta == trace.meta and back.meta["hardware"]
    assert back.events == trace.events  # dataclass equality, outcomes included
    assert isinstance(back.summaries()["speculative"], RunSummary)
    assert any(isinstance(e, RoundEvent) for _, e in back.events)


def test_replay_keeps_order_and_timing(trace):
    slept = []
    out = list(replay(trace.events, speed=1e9, sleep=slept.append))
    assert sorted(map(id, (e for _, e in out))) == sorted(map(id, (e for _, e in trace.events)))
    times = [event_time(e) for _, e in out]
    assert times == sorted(times)


def test_replay_stops(trace):
    stop = threading.Event()
    gen = replay(trace.events, speed=1.0, stop=stop)
    next(gen)
    stop.set()
    assert list(gen) == []


def test_bad_trace_is_a_clear_error(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a SpecViz trace"):
        load_trace(tmp_path / "x.json")
