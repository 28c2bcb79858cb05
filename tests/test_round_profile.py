"""bench.round_profile on the tiny pair: forward time is counted after round 1 only."""
import torch

from specviz.bench.round_profile import ForwardTimer, profile


def test_profile_splits_forwards_from_the_rest(tiny_pair):
    r = profile(tiny_pair, method="draft", gamma=3, max_new_tokens=12)
    assert r["tokens"] == 12 and r["forward_calls"] > 0
    assert 0 < r["forward_s"] < r["decode_s"] and 0 <= r["outside_share"] < 1
    assert "function calls" in r["profile_top"]


def test_timer_counts_only_top_level_calls_when_active():
    m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    timer = ForwardTimer(m, m[0])  # a nested module's call is inside the outer one
    m(torch.zeros(1, 2))
    assert timer.calls == 0  # not active yet (round 1)
    timer.active = True
    m(torch.zeros(1, 2))
    assert timer.calls == 1 and timer.total > 0
    timer.remove()
