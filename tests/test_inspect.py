"""The p/q inspector's data: top-k of p, q and the residual per round, in events and traces."""
import pytest
import torch

from specviz.engine.decoding import speculative
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams, residual
from specviz.engine.topk_view import TOP_K, round_dists
from specviz.run.trace import event_from_dict, event_to_dict


def test_round_dists_top_k_and_residual():
    g = torch.Generator().manual_seed(0)
    p = torch.rand(4, 50, generator=g).softmax(-1)
    q = torch.rand(3, 50, generator=g).softmax(-1)
    dists, res = round_dists(p, q, 1, True)
    assert len(dists) == 4 and "q" not in dists[3] and len(dists[3]["ids"]) == TOP_K
    for i, row in enumerate(dists[:3]):
        top_p = set(torch.topk(p[i], TOP_K).indices.tolist())
        top_q = set(torch.topk(q[i], TOP_K).indices.tolist())
        assert set(row["ids"]) == top_p | top_q and len(row["ids"]) <= 2 * TOP_K
        assert row["p"] == pytest.approx(p[i, row["ids"]].tolist(), abs=1e-6)
        assert row["q"] == pytest.approx(q[i, row["ids"]].tolist(), abs=1e-6)
        assert row["t"] == [str(x) for x in row["ids"]]
    r = residual(p[1], q[1])
    assert res["pos"] == 1 and res["ids"] == torch.topk(r, TOP_K).indices.tolist()
    assert res["r"] == pytest.approx(r[res["ids"]].tolist(), abs=1e-6)
    assert round_dists(p, q, 3, False)[1] is None  # all accepted: no residual


def test_events_carry_the_inspector_and_survive_a_trace(target, draft, tok):
    params = SamplingParams(temperature=1.0)
    evs = list(speculative(target, DraftModelProposer(draft), tok, tok.encode("abc"), 24, 3, params, seed=1))
    rounds = evs[:-1]
    assert any(r.residual for r in rounds)
    for r in rounds:
        assert len(r.dists) == r.gamma + 1
        for i, x in enumerate(r.draft_ids):
            row = r.dists[i]
            if x in row["ids"]:  # the drafted token's own p and q, as the accept test saw them
                j = row["ids"].index(x)
                assert row["p"][j] == pytest.approx(r.p[i], abs=1e-5)
                assert row["q"][j] == pytest.approx(r.q[i], abs=1e-5)
        if r.residual:
            assert r.residual["pos"] == r.n_accepted and r.resampled
        back = event_from_dict(event_to_dict(r))
        assert back.dists == r.dists and back.residual == r.residual


def test_old_round_without_inspector_still_loads(target, draft, tok):
    evs = list(speculative(target, DraftModelProposer(draft), tok, tok.encode("abc"), 6, 2, SamplingParams()))
    d = event_to_dict(evs[0])
    d.pop("dists"), d.pop("residual")
    old = event_from_dict(d)
    assert old.dists == [] and old.residual is None and old.draft_ids == evs[0].draft_ids
