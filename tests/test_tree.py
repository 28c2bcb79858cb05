"""Tree speculation on tiny fp32 models: greedy == plain greedy for static and
dynamic trees, EOS and max-new-tokens inside a path, whole sequences follow
the target under sampling (and a broken acceptance is caught), the caches hold
exactly the committed tokens, the tree record survives a trace round trip."""
import pytest
import torch
from helpers import check_stream, chi_square_pvalue, noisy_copy, run, sample_sequences
from test_decoding import GREEDY, PROMPT
from transformers import DynamicCache

from specviz.engine import tree_decoding
from specviz.engine.decoding import baseline
from specviz.engine.proposers.tree import TreeDraftProposer, check_tree_options
from specviz.engine.sampling import SamplingParams, sample
from specviz.engine.tree_decoding import tree_speculative
from specviz.engine.tree_forward import tree_bias
from specviz.engine.tree_sampling import TreeVerdict, children_of, draw_children
from specviz.errors import RequestError
from specviz.models.tiny import tiny_model
from specviz.run.trace import event_from_dict, event_to_dict

SHAPES = [(None, 3), (None, 8), (None, 16), ((4, 2, 2, 1, 1), 64), ((2, 2), 64), ((3, 1), 5)]


def check_tree_round(r):
    tr = r.tree
    kids = children_of(tr["parents"])
    node = -1
    for i in tr["path"]:
        assert tr["parents"][i] == node
        node = i
    assert [r.draft_ids[i] for i in tr["path"]] == [t.token_id for t in r.tokens[: r.n_accepted]]
    assert len(tr["tokens"]) == r.gamma and all(p < i for i, p in enumerate(tr["parents"]))
    assert max(tr["depth"], default=0) <= 16 and set(kids) >= {-1}


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("shape,budget", SHAPES)
def test_greedy_tree_equals_baseline(tok, target, draft, peaked, shape, budget, gamma):
    for t, d in ((target, draft), (target, target), peaked):
        ids = tok.encode(PROMPT + " arr arr arr")
        _, base = run(baseline(t, tok, ids, 40, GREEDY))
        prop = TreeDraftProposer(d, shape=shape, budget=budget)
        rounds, spec = run(tree_speculative(t, prop, tok, ids, 40, gamma, GREEDY))
        assert spec.token_ids == base.token_ids
        check_stream(rounds, spec)
        for r in rounds:
            check_tree_round(r)
            assert r.gamma <= budget and max(r.tree["depth"]) <= gamma
    assert gamma == 1 or spec.accepted > spec.rounds  # the peaked pair accepts more than one node per round


def test_dynamic_tree_goes_deep_on_a_confident_draft(tok, peaked):
    t, d = peaked
    ids = tok.encode(PROMPT)
    rounds, spec = run(tree_speculative(t, TreeDraftProposer(d, budget=8), tok, ids, 40, 5, GREEDY))
    assert max(max(r.tree["depth"]) for r in rounds) >= 4
    assert max(r.n_accepted for r in rounds) >= 3
    assert all(r.draft_forwards <= 5 for r in rounds)  # ≤ depth forwards, like a chain of γ


@pytest.mark.parametrize("shape,budget", [(None, 8), ((3, 2, 1), 64)])
@pytest.mark.parametrize("at", [2, 7, 12])
def test_eos_inside_a_branch(tok, peaked, shape, budget, at):
    t, d = peaked
    ids = tok.encode(PROMPT)
    _, full = run(baseline(t, tok, ids, 40, GREEDY))
    eos = full.token_ids[at]
    _, base = run(baseline(t, tok, ids, 40, GREEDY, eos_ids=[eos]))
    for dm in (t, d):
        rounds, spec = run(tree_speculative(t, TreeDraftProposer(dm, shape=shape, budget=budget), tok, ids,
                                            40, 4, GREEDY, eos_ids=[eos]))
        assert spec.token_ids == base.token_ids and spec.stop_reason == "eos"
        check_stream(rounds, spec)


@pytest.mark.parametrize("max_new", [1, 2, 5, 13])
@pytest.mark.parametrize("shape,budget", [(None, 8), ((2, 2, 2), 64)])
def test_max_new_tokens_is_exact(tok, peaked, max_new, shape, budget):
    t, d = peaked
    ids = tok.encode(PROMPT)
    _, base = run(baseline(t, tok, ids, max_new, GREEDY))
    for dm in (t, d):
        rounds, spec = run(tree_speculative(t, TreeDraftProposer(dm, shape=shape, budget=budget), tok, ids,
                                            max_new, 6, GREEDY))
        assert spec.token_ids == base.token_ids and len(spec.token_ids) == max_new
        check_stream(rounds, spec)


class Recorder(DynamicCache):
    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        Recorder.made.append(self)


def plain_cache(model, ids):
    c = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), past_key_values=c, use_cache=True)
    return c


def same_cache(a, b):
    # batching changes float rounding (~1e-5 here); a stale node would differ by O(1)
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers, strict=True):
        torch.testing.assert_close(la.keys, lb.keys, atol=2e-4, rtol=1e-3)
        torch.testing.assert_close(la.values, lb.values, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0)])
@pytest.mark.parametrize("shape,budget", [(None, 10), ((3, 2, 2), 64)])
def test_caches_hold_exactly_the_committed_tokens(tok, peaked, monkeypatch, params, shape, budget):
    t, d = peaked
    monkeypatch.setattr(tree_decoding, "DynamicCache", Recorder)
    Recorder.made = []
    ids = tok.encode(PROMPT)
    prop = TreeDraftProposer(d, shape=shape, budget=budget)
    rounds, spec = run(tree_speculative(t, prop, tok, ids, 60, 4, params, seed=5))
    assert len(rounds) >= 10
    committed = ids + spec.token_ids
    same_cache(Recorder.made[0], plain_cache(t, committed[:-1]))
    same_cache(prop.cache, plain_cache(d, committed[: prop.cache.get_seq_length()]))
    assert prop.cache.get_seq_length() >= len(committed) - 2


def test_tree_bias_and_children():
    bias = tree_bias([-1, -1, 0], n_past=2, n_fed=2)
    ok = (bias[0, 0] == 0).int().tolist()
    assert ok == [[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0],
                  [1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 0, 1]]
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    assert draw_children(q, 3, greedy=True) == [0, 1, 2]
    kids = draw_children(q, 9, torch.Generator().manual_seed(0))
    assert sorted(kids) == [0, 1, 2]  # distinct, only where q > 0


def test_tree_options():
    assert check_tree_options({}) == {"tree_shape": None, "tree_budget": None}
    assert check_tree_options({"tree_shape": "4-2-2-1-1"})["tree_shape"] == [4, 2, 2, 1, 1]
    assert check_tree_options({"tree_budget": "12"})["tree_budget"] == 12
    for bad in ({"tree_shape": "4-x"}, {"tree_shape": "0-2"}, {"tree_budget": 0}, {"tree_budget": "a"},
                {"tree_budget": 1000}):
        with pytest.raises(RequestError):
            check_tree_options(bad)


def test_tree_record_survives_a_trace_round_trip(tok, peaked):
    t, d = peaked
    rounds, _ = run(tree_speculative(t, TreeDraftProposer(d, budget=6), tok, tok.encode(PROMPT), 12, 3,
                                     SamplingParams(temperature=1.0), seed=1))
    for r in rounds:
        back = event_from_dict(event_to_dict(r))
        assert back.tree == r.tree and back == r
    old = event_to_dict(rounds[0])
    del old["tree"]  # a trace recorded before trees existed
    assert event_from_dict(old).tree is None


# --- the sequence-level distribution test ------------------------------------

def broken_accept(tokens, parents, p, q, generator=None):
    """Deliberately wrong: at each node test only the child with the highest q
    (min(1, p/q)) and, after a rejection, draw from p instead of the corrected
    residual norm(max(0, p - q)): the output drifts towards the draft."""
    kids = children_of(parents)
    path, node, tested = [], -1, []
    while True:
        p_u, q_u = p[node + 1], q[node + 1]
        if not kids[node]:
            return TreeVerdict(path, int(sample(p_u, generator)), False, tested, [])
        c = max(kids[node], key=lambda k: float(q_u[tokens[k]]))
        tested.append(c)
        if float(torch.rand(1, generator=generator)) * q_u[tokens[c]] >= p_u[tokens[c]]:
            return TreeVerdict(path, int(sample(p_u, generator)), True, tested, [])
        path.append(c)
        node = c


def sequence_pvalue(shape, budget, params, gamma, n=1000):
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)
    exact, counts, _ = sample_sequences(tree_speculative, t, lambda: TreeDraftProposer(d, shape=shape, budget=budget),
                                        gamma, params, n)
    return chi_square_pvalue(counts, exact, n)


@pytest.mark.parametrize("shape,budget,params,gamma", [
    ((3, 1), 64, SamplingParams(temperature=1.0), 2),
    (None, 5, SamplingParams(temperature=1.0), 2),
    (None, 4, SamplingParams(temperature=0.8, top_k=3), 2),
])
def test_sampled_tree_sequences_follow_target(shape, budget, params, gamma):
    assert sequence_pvalue(shape, budget, params, gamma) > 1e-3


def test_the_chi_square_test_catches_a_broken_acceptance(monkeypatch):
    monkeypatch.setattr(tree_decoding, "accept_sampled", broken_accept)
    assert sequence_pvalue((3, 1), 64, SamplingParams(temperature=1.0), 2, n=1500) < 1e-3


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_tree_forward_equals_one_forward_per_path(impl):
    """A custom 4D mask + position ids through a DynamicCache (transformers
    passes 4D masks through unchanged) gives each node its path's logits."""
    from specviz.engine.forward import keep_cache_slots
    from specviz.engine.tree_forward import tree_forward_logits
    from specviz.engine.tree_sampling import depths_of
    m = tiny_model(50, seed=0, layers=3)
    m.config._attn_implementation = impl
    prompt, toks, parents = [3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 2, 1]
    c = plain_cache(m, prompt[:2])
    with torch.no_grad():
        lg = tree_forward_logits(m, c, fed=prompt[2:], tokens=toks, parents=parents,
                                 depths=depths_of(parents), keep=7)
        for i in range(-1, 6):
            path, n = [], i
            while n >= 0:
                path.append(toks[n])
                n = parents[n]
            ref = m(input_ids=torch.tensor([prompt + path[::-1]])).logits[0, -1]
            torch.testing.assert_close(lg[i + 1], ref, atol=1e-4, rtol=1e-4)
    keep_cache_slots(c, prefix=5, slots=[5, 7, 9])  # the path 10 -> 12 -> 14
    same_cache(c, plain_cache(m, prompt + [10, 12, 14]))


def test_tree_view_draws_every_round_from_replayed_events(tok, peaked):
    from specviz.ui.tree_view import latest_tree_figure, rounds_figure
    t, d = peaked
    rounds, _ = run(tree_speculative(t, TreeDraftProposer(d, budget=6), tok, tok.encode(PROMPT), 20, 3,
                                     SamplingParams(temperature=1.0), seed=2))
    back = [event_from_dict(event_to_dict(r)) for r in rounds]  # as a trace replays them
    fig = rounds_figure(back)
    steps = fig.layout.sliders[0].steps
    assert len(steps) == len(rounds) and steps[-1].label == str(rounds[-1].index + 1)
    shown = [tr for tr in fig.data if tr.visible]
    nodes = next(tr for tr in shown if tr.mode == "markers+text" and len(tr.x) == rounds[-1].gamma)
    assert len(nodes.hovertext) == rounds[-1].gamma and "q = " in nodes.hovertext[0]
    assert sum(tr.marker.symbol == "star" for tr in shown) == (rounds[-1].appended_id >= 0)

    class View:  # a chain run: no tree, an explanatory empty figure
        method, spec = "draft", type("S", (), {"rounds": []})()
    assert not latest_tree_figure(View()).data


def test_a_tree_runs_charts_draw_no_legend_entry_without_a_line(tok, peaked):
    """A token tree has no chain prediction and no per-position tests: the charts left their
    legend entries ("Leviathan prediction", "accepted ÷ tested") with nothing drawn."""
    from specviz.ui.charts import position_chart, speedup_chart
    from specviz.ui.state import RunView
    t, d = peaked
    ids = tok.encode(PROMPT)
    view = RunView(gamma=3, temperature=0.0, mode="fair")
    view.method = "tree"
    for ev in run(baseline(t, tok, ids, 12, SamplingParams()))[0]:
        view.add("baseline", ev)
    for ev in run(tree_speculative(t, TreeDraftProposer(d, budget=6), tok, ids, 12, 3, SamplingParams()))[0]:
        view.add("speculative", ev)
    names = [tr.name for tr in speedup_chart(view).data + position_chart(view).data]
    assert "measured" in names and "accepted ÷ drafted" in names
    assert not any(n.startswith("Leviathan") or n == "accepted ÷ tested" for n in names)
