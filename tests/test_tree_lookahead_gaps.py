"""Tree and lookahead token events carry the target's top-2 logit gap at the row that chose each
token, as chain speculation does: the bench tells a bf16 near-tie from a bug with them."""
import pytest
import torch

from specviz.engine.events import RoundEvent, RunSummary
from specviz.run.request import encode_prompt, make_request
from specviz.run.runner import run_events


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair  # loaded once per session (conftest.py)


def _gaps(pair, req, mode):
    out = []
    for ev in run_events(pair, req, mode, encode_prompt(pair.tokenizer, req)):
        if isinstance(ev, RoundEvent):
            out += [t.gap for t in ev.tokens if t.in_output]
        elif not isinstance(ev, RunSummary):
            out.append(ev.gap)
    return out


@pytest.mark.parametrize("method", ["tree", "lookahead"])
def test_gaps_match_plain_decoding(pair, method):
    torch.set_num_threads(1)
    req = make_request("def add(a, b):\n    return a + b\n", method=method, gamma=3, max_new_tokens=20,
                       temperature=0.0)
    spec, plain = _gaps(pair, req, "speculative"), _gaps(pair, req, "baseline")
    assert len(spec) == len(plain) == 20 and None not in spec
    assert spec == pytest.approx(plain, abs=1e-4)


def test_tree_runs_show_no_chain_prediction(pair):
    from specviz.engine.metrics import run_stats
    req = make_request("def add(a, b):\n", method="tree", gamma=3, max_new_tokens=12, temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)
    summary = [ev for ev in run_events(pair, req, "speculative", ids) if isinstance(ev, RunSummary)][0]
    st = run_stats(summary)
    assert st.predicted is None and st.predicted_v is None and st.best_gamma is None
    assert st.tau is not None and st.alpha_hat is not None
