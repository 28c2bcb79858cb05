"""EAGLE-2's dynamic tree (--method eagle-tree) on tiny random fp32 targets and random heads: greedy
output equals plain decoding (several prompts, depths and budgets, a head with kept tokens), a tree
node's head row equals the chain's row along its path (the tree mask and positions), the head reads
the target's true states of the accepted path after each round, whole sequences follow the target's
law under sampling, an EAGLE-3 head is refused, and the CLI runs the method on a saved tiny pair."""
import json
from types import SimpleNamespace

import pytest
import torch
from helpers import check_stream, chi_square_pvalue, run, sample_sequences
from test_eagle import GREEDY, drafter, one_thread, pair_of, random_head  # noqa: F401 (fixture)
from test_tree import check_tree_round

from specviz.engine.decoding import baseline
from specviz.engine.gamma import TreeWidth
from specviz.engine.proposers import make_proposer, method_spec
from specviz.engine.proposers.eagle_tree import EagleTreeProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained import store
from specviz.engine.trained.eagle_head import pack
from specviz.engine.tree_decoding import tree_speculative
from specviz.errors import RequestError
from specviz.models.tiny import tiny_model

PROMPTS = ["def quicksort(arr): arr arr", "hello hello world", "a b c a b c a"]


def test_registered_as_a_tree_method():
    spec = method_spec("eagle-tree")
    assert spec.kind == "tree" and "EAGLE-2" in spec.note and "CPU" in spec.loses_when
    assert spec.check_options({}) == {"tree_budget": None}
    assert spec.summarize([{"head_ms": 1.0}, {"head_ms": 2.5}]) == {"head_ms": 3.5}


@pytest.mark.parametrize("gamma,budget", [(1, None), (3, 4), (5, None), (5, 16)])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_equals_plain(target, tok, gamma, budget, seed):
    keep = torch.arange(0, target.config.vocab_size, 2) if seed else None  # a restricted head too
    d = drafter(target, seed, keep)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        _, base = run(baseline(target, tok, ids, 30, GREEDY))
        rounds, spec = run(tree_speculative(target, EagleTreeProposer(target, d, budget=budget), tok, ids, 30,
                                            gamma, GREEDY))
        assert spec.token_ids == base.token_ids and spec.text == base.text
        check_stream(rounds, spec)
        assert rounds[0].gamma == 0 and spec.drafted > 0  # round 1 drafts nothing: no states yet
        for r in rounds[1:]:
            check_tree_round(r)
            assert 0 < r.gamma <= (budget or 8) and max(r.tree["depth"]) <= gamma
            assert r.draft_forwards <= gamma  # one head forward a level (the first: the confirmed rows')
        if keep is not None:
            assert all(x % 2 == 0 for r in rounds for x in r.draft_ids)  # q is 0 outside the kept ids


def test_greedy_with_an_auto_width_equals_plain(target, tok):
    """Budget auto: sized each round by measured costs (here made up), the head's c pricing a forward."""
    ids = tok.encode(PROMPTS[0])
    _, base = run(baseline(target, tok, ids, 30, GREEDY))
    width = TreeWidth(0.1, lambda n: 1 + 0.02 * n)
    rounds, spec = run(tree_speculative(target, EagleTreeProposer(target, drafter(target)), tok, ids, 30, 4,
                                        GREEDY, width=width))
    assert spec.token_ids == base.token_ids and spec.drafted > 0
    assert max(r.gamma for r in rounds) > 1  # a flat v: more than the root's first choice


def test_tree_rows_equal_the_chains_rows_along_each_path(target, tok):
    """Each node's predicted state, from one masked head forward per level, equals the state the chain
    reaches feeding the node's path one row at a time over the same confirmed rows."""
    checked = []

    class Spy(EagleTreeProposer):
        def _expand(self, t, nodes, params):
            super()._expand(t, nodes, params)
            self.tree = t

        def propose(self, committed, *a, **kw):
            self.tree = None
            prop = super().propose(committed, *a, **kw)
            t = self.tree
            if t is not None and len(t.slot) > 1 and len(set(t.depth)) > 1:
                for i in t.slot:  # every node with a row of its own
                    path = [*reversed(t.ancestors(i)), i]
                    self.kv.crop(self.true_rows)
                    f = self.feats[-1]
                    for depth, node in enumerate(path):
                        f = self._step([t.tokens[node]], f[None], self.root_at + depth)
                    torch.testing.assert_close(f, self.feats[i], atol=1e-5, rtol=1e-4)
                checked.append(len(t.slot))
            return prop

    for prompt in PROMPTS:
        run(tree_speculative(target, Spy(target, drafter(target, scale=0.5), budget=12), tok, tok.encode(prompt),
                             20, 4, GREEDY))
    assert len(checked) > 2 and max(checked) > 2


@pytest.mark.parametrize("split", [False, True])
def test_head_reads_the_true_states_of_the_accepted_path(target, tok, monkeypatch, split):
    """At each propose the confirmed rows it reads are the target's own post-norm states at their
    positions (the fed rows', then the path's nodes' picked out of the tree's rows), with no gap, from
    position 0: also where the prompt is read in two forwards (split: a row-exact target's
    context_apart)."""
    if split:
        from specviz.engine import forward, tree_forward
        split = []

        def apart(model, cache, ids, keep, **kw):
            if len(ids) > keep:
                forward.forward_logits(model, ids[:-keep], cache, 1, exact=False)
                split.append(len(ids))
            return ids[-keep:]
        monkeypatch.setattr(tree_forward, "context_apart", apart)
    ids = tok.encode(PROMPTS[2])
    seen = []

    class Spy(EagleTreeProposer):
        def propose(self, committed, *a, **kw):
            if self.pend is not None:
                seen.append((self.pend.clone(), self.pend_at))
            return super().propose(committed, *a, **kw)

    d = drafter(target, scale=0.5)
    _, spec = run(tree_speculative(target, Spy(target, d, budget=6), tok, ids, 30, 4, GREEDY))
    out = ids + spec.token_ids
    ref = target.model(input_ids=torch.tensor([out])).last_hidden_state[0]
    assert spec.accepted > 0 and len(seen) > 3 and split in (False, [len(ids)])
    at = 0
    for pend, pend_at in seen:
        assert pend_at == at
        torch.testing.assert_close(pend, ref[pend_at: pend_at + len(pend)], atol=1e-5, rtol=1e-4)
        at = pend_at + len(pend)


def _marginal(law: dict, k: int) -> dict:
    out = {}
    for seq, v in law.items():
        out[seq[:k]] = out.get(seq[:k], 0) + v
    return out


@pytest.mark.parametrize("budget,scale,params", [
    (3, 0.3, SamplingParams(temperature=1.0)),
    (4, 0.1, SamplingParams(temperature=0.8, top_k=3)),
])
def test_sampled_sequences_follow_target(budget, scale, params):
    """Four new tokens, trees of depth up to 3 from the second round on (round 1 drafts nothing): the
    first token's, the first two's and the whole sequences' laws are the warped target's (chi-square
    over 2000 seeded runs that both accepted and rejected drafts)."""
    t = tiny_model(4, seed=10, layers=2, init=0.8)
    d = drafter(t, seed=2, scale=scale)
    n = 2000
    exact, counts, runs = sample_sequences(tree_speculative, t, lambda: EagleTreeProposer(t, d, budget=budget),
                                           3, params, n, length=4)
    acc = sum(s.accepted for _, s in runs) / sum(s.drafted for _, s in runs)
    assert 0.05 < acc < 0.95, "the test needs both accepts and rejections"
    assert any(r.tree and max(r.tree["depth"], default=0) > 1 for rounds, _ in runs for r in rounds)
    for k in (1, 2, 4):
        assert chi_square_pvalue(_marginal(counts, k), _marginal(exact, k), n) > 1e-3, k


def test_an_eagle3_head_is_refused(target, tok, monkeypatch):
    from specviz.engine.proposers import eagle
    d = drafter(target)
    d.taps = (1, 2, 3)
    monkeypatch.setattr(eagle, "load_drafter", lambda pair: d)  # request_drafter's
    with pytest.raises(RequestError, match="EAGLE-3"):
        make_proposer(pair_of(target, tok), "eagle-tree")


def test_saved_head_runs_through_the_registry(target, tok):
    pair = pair_of(target, tok)
    store.save(pair, "eagle", pack(random_head(target), torch.arange(target.config.vocab_size)), {"ok": 1})
    ids = tok.encode(PROMPTS[1])
    _, base = run(baseline(target, tok, ids, 20, GREEDY))
    prop = make_proposer(pair, "eagle-tree", SimpleNamespace(options={"tree_budget": 5}))
    assert prop.budget == 5
    _, spec = run(tree_speculative(target, prop, tok, ids, 20, 3, GREEDY))
    assert spec.token_ids == base.token_ids and spec.drafted > 0


def test_cli_generate_runs_the_method(capsys, pair_dirs, monkeypatch, tmp_path):
    from specviz.cli.main import main
    t = tiny_model(96, 0, layers=3)
    path = tmp_path / "eagle.pt"
    torch.save(pack(random_head(t), torch.arange(96)), path)
    monkeypatch.setattr(store, "find", lambda pair, kind: path if kind == "eagle" else None)
    target_dir, draft_dir = pair_dirs  # a custom pair names both; eagle-tree reads no draft model
    code = main(["generate", "--target", target_dir, "--draft", draft_dir, "--prompt", "def f(x):", "--json", "--max-new-tokens", "12",
                 "--gamma", "3", "--temperature", "0", "--mode", "both", "--method", "eagle-tree",
                 "--tree-budget", "6"])
    assert code == 0
    base, spec = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert base["token_ids"] == spec["token_ids"] and len(spec["token_ids"]) == 12
    assert any(r["tree"] for r in spec["rounds"][1:])
