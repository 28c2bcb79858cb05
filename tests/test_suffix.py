"""Suffix decoding and the hybrid: the suffix tree's counts and sources, greedy output
identical to plain, the target's law under sampling (chi-square), the memory's bounds,
and no visitor ever drafting from another visitor's output."""
import time
from types import SimpleNamespace

import pytest
from helpers import assert_follows_target, check_stream, fake_pair, noisy_copy, run, sample_sequences

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import make_proposer
from specviz.engine.proposers.draft import DraftModelProposer
from specviz.engine.proposers.hybrid import EVIDENCE, HybridProposer
from specviz.engine.proposers.suffix import SuffixProposer, best_length
from specviz.engine.sampling import SamplingParams
from specviz.engine.suffix_tree import PRESETS, Memory, SuffixTree
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)


def v_cost(k):
    return 1.0 + 0.2 * k


# ------------------------------------------------------------------ the tree
def test_tree_counts_and_most_frequent_continuation():
    t = SuffixTree(depth=8)
    t.add(0, [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2])
    tails = t.tails(0)
    assert len(tails) == 8 and tails[0].count == 4  # "2" occurs four times
    d = t.speculate(t.match([1, 2]), 4)
    assert d.tokens[0] == 3  # after "1 2": 3 twice, 4 once
    assert d.match_len >= 2 and 0 < d.probs[0] <= 1


def test_tree_draft_source_is_where_the_path_last_occurred():
    t = SuffixTree()
    seq = [5, 6, 7, 8, 9, 0, 5, 6]
    t.add(0, seq)
    d = t.speculate(t.tails(0), 3)
    assert d.tokens == [7, 8] and d.match_len == 2  # ⌊1.0 × 2⌋ tokens for a 2-token match
    assert seq[d.start:d.end] == d.tokens and d.doc == 0


def test_remove_restores_the_tree():
    t = SuffixTree(depth=6)
    t.add(1, [1, 2, 3, 4])
    before = t.nodes
    t.add(2, [2, 3, 9, 9, 1])
    t.remove(2)
    assert t.nodes == before and t.root.kids[2].count == 1 and 9 not in t.root.kids


def test_best_length_pays_for_rows():
    assert best_length([0.0, 0.0], v_cost) == (0, 1.0)  # nothing expected: a plain step
    k, rate = best_length([0.95, 1.9, 2.8], v_cost)
    assert k == 3 and rate == pytest.approx(3.8 / 1.6)


# ------------------------------------------------------------------ lossless
def _suffix(vocab, **kw):
    return SuffixProposer(vocab, **kw)


def _hybrid(draft, vocab, c=0.3, lazy=True, **kw):
    return HybridProposer(SuffixProposer(vocab, verify_cost=v_cost, **kw), DraftModelProposer(draft), c=c,
                          lazy=lazy)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("which", ["suffix", "suffix_priced", "hybrid"])
def test_greedy_equals_plain(tok, target, draft, gamma, which):
    ids = tok.encode("def quicksort(arr): arr arr arr return arr arr")
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    V = target.config.vocab_size
    prop = {"suffix": lambda: _suffix(V, tokenizer=tok), "suffix_priced": lambda: _suffix(V, verify_cost=v_cost),
            "hybrid": lambda: _hybrid(draft, V, tokenizer=tok)}[which]()
    rounds, spec = run(speculative(target, prop, tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    check_stream(rounds, spec)
    assert all(r.info["drafter"] in ("suffix", "model", "none") for r in rounds)


def test_sources_point_at_the_copied_tokens(tok, target):
    ids = tok.encode("abc abc abc abc abc abc")
    prop = _suffix(target.config.vocab_size, tokenizer=tok)
    rounds, s = run(speculative(target, prop, tok, ids, 30, 4, GREEDY))
    seq = ids + s.token_ids
    shown = [r for r in rounds if r.info["source"]]
    assert shown
    for r in shown:
        src = r.info["source"]
        assert src["where"] in ("prompt", "output") and src["end"] - src["start"] == r.gamma
        assert seq[src["start"]:src["end"]] == r.draft_ids
        assert (src["start"] < len(ids)) == (src["where"] == "prompt")


@pytest.mark.parametrize("which", ["suffix_memory", "hybrid"])
def test_sequences_follow_target_distribution(which):
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)
    mem = Memory()  # shared by every run: what it proposes depends on earlier runs' outputs
    new = {"suffix_memory": lambda: _suffix(V, verify_cost=v_cost, memory=mem, scope="a", write_scope="a"),
           # the draft model reads the prompt at reset, so model rounds come in these 3-token runs
           "hybrid": lambda: _hybrid(d, V, c=0.25, lazy=False)}[which]
    exact, counts, runs = sample_sequences(speculative, t, new, 3, SamplingParams(temperature=1.0), N)
    drafters = {r.info["drafter"] for rounds, _ in runs for r in rounds}
    assert "suffix" in drafters and (which != "hybrid" or "model" in drafters)
    assert_follows_target(counts, exact, N)


# ------------------------------------------------------------------ memory and privacy
def _gen(target, tok, prop, text, n=24):
    return run(speculative(target, prop, tok, tok.encode(text), n, 6, GREEDY))


def test_a_visitor_never_drafts_from_another_visitors_output(tok, target):
    mem, V = Memory(), target.config.vocab_size
    text = "zq xv zq xv"
    _, first = _gen(target, tok, _suffix(V, memory=mem, scope="alice", write_scope="alice"), text)
    assert mem.tree("alice") is not None and mem.tree("alice").nodes > 0
    bob, _ = _gen(target, tok, _suffix(V, memory=mem, scope="bob", write_scope="bob"), text)
    alice, _ = _gen(target, tok, _suffix(V, memory=mem, scope="alice", write_scope="alice"), text)
    assert not any(r.info["source"] and r.info["source"]["where"] == "memory" for r in bob)
    assert any(r.info["source"] and r.info["source"]["where"] == "memory" for r in alice)


def _from_memory(rounds):
    return [r.info["source"] for r in rounds if r.info["source"] and r.info["source"]["where"] == "memory"]


def test_preset_outputs_are_shared_only_when_the_visitor_shares_memory(tok, target):
    """Issue 71: a new session's first suffix run of a preset copied 78 of 96 tokens from runs other
    sessions had made of it. A preset's output goes to the visitor's scope and PRESETS; another visitor
    reads PRESETS only with share memory on; its own later runs read it from their own scope."""
    mem, V = Memory(), target.config.vocab_size
    text = "qq rr qq rr"
    _gen(target, tok, _suffix(V, memory=mem, scope="alice", write_scope="alice", shared_scope=PRESETS), text)
    assert mem.tree(PRESETS).nodes > 0 and mem.tree("alice").nodes > 0
    bob, _ = _gen(target, tok, _suffix(V, memory=mem, scope="bob", write_scope="bob", shared_scope=PRESETS),
                  text)
    assert not _from_memory(bob)  # bob's first run: nothing of alice's, though the preset memory has it
    carol, _ = _gen(target, tok, _suffix(V, memory=mem, scope="carol", write_scope="carol", read_shared=True),
                    text)
    srcs = _from_memory(carol)
    assert srcs and all("preset" in s["label"] and "shared" in s["label"] for s in srcs)
    alice, _ = _gen(target, tok, _suffix(V, memory=mem, scope="alice", write_scope="alice"), text)
    assert _from_memory(alice) and all(s["label"] == "your earlier run" for s in _from_memory(alice))


def test_a_new_sessions_first_preset_run_copies_nothing(tiny_pair, monkeypatch):
    """Through the builder, as the page builds it: a preset's prompt, another session's run before."""
    from specviz.engine.proposers import suffix as suffix_mod
    from specviz.prompts import load_presets
    mem, preset = Memory(), load_presets()[0]["prompt"]
    monkeypatch.setattr(suffix_mod, "MEMORY", mem)
    t, tk, text = tiny_pair.target, tiny_pair.tokenizer, "zq xv zq xv"

    def build(scope, share=False, method="suffix"):
        p = make_proposer(tiny_pair, method, SimpleNamespace(scope=scope, prompt=preset, options={},
                                                             fresh_memory=False, share_memory=share))
        (p.suffix if method == "hybrid" else p).verify_cost = None  # propose whole chains: no pricing
        return p
    first = build("old")
    assert (first.write_scope, first.shared_scope, first.readable()) == ("old", PRESETS, ("old",))
    _gen(t, tk, first, text)
    assert mem.tree(PRESETS).nodes > 0
    new, _ = _gen(t, tk, build("new"), text)
    assert not _from_memory(new)  # the preset memory holds the text, unread
    shared = build("new2", share=True)
    assert shared.readable() == ("new2", PRESETS)
    assert _from_memory(_gen(t, tk, shared, text)[0])
    assert build("new3", share=True, method="hybrid").suffix.read_shared is True


def test_memory_is_bounded():
    mem = Memory(max_bytes=3_000_000, max_docs=3)
    for i in range(6):  # 300 new tokens, 24 deep: ~7,000 nodes, ~1.3 MB each
        doc = mem.new_doc("s", "run", time.monotonic())
        mem.extend("s", doc, list(range(i * 1000, i * 1000 + 300)), time.monotonic())
        assert mem.nbytes() <= 3_000_000
    assert 1 <= len(mem.order) <= 3
    mem.new_doc("t", "run", time.monotonic() + 10_000)  # "s" idle for longer than an hour
    assert mem.tree("s") is None


def test_builders_read_scope_and_costs(tiny_pair):
    req = SimpleNamespace(scope="sess", prompt="not a preset", options={})
    s = make_proposer(tiny_pair, "suffix", req)
    assert s.scope == "sess" and s.write_scope == "sess" and s.memory is not None
    assert s.shared_scope is None and not s.read_shared and s.readable() == ("sess",)  # not a preset, not shared
    s = make_proposer(tiny_pair, "suffix", SimpleNamespace(scope=None, prompt="x", options={}))
    assert s.memory is None  # no session: this run's own text only
    pair = fake_pair(target=tiny_pair.target, draft=tiny_pair.draft, tokenizer=tiny_pair.tokenizer)
    h = make_proposer(pair, "hybrid", None)
    assert isinstance(h, HybridProposer) and h.c is None


def test_byte_estimate_covers_what_python_allocates():
    import random
    import tracemalloc
    rng = random.Random(0)
    tracemalloc.start()
    try:
        t = SuffixTree()
        t.add(0, [rng.randrange(300) for _ in range(1500)])
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert used <= t.nbytes() <= 1.3 * used


# ------------------------------------------------------------------ tree mode
def test_tree_draft_is_best_first_and_a_tree():
    t = SuffixTree(depth=10)
    t.add(0, [7, 1, 2, 3, 4, 8, 1, 2, 3, 5, 6, 1, 2, 3, 4, 0, 1, 2])  # only "1 2" matches
    d = t.speculate_tree(t.tails(0), budget=8, max_depth=6)
    assert d.tokens[0] == 3 and all(p < i for i, p in enumerate(d.parents))
    assert d.probs == sorted(d.probs, reverse=True)
    kids = [d.tokens[i] for i, p in enumerate(d.parents) if p == 0]
    assert kids[:2] == [4, 5]  # both continuations after "1 2 3", the more frequent first


def _hybrid_tree(draft, vocab, c=0.3, **kw):
    from specviz.engine.proposers.hybrid import HybridTreeProposer
    from specviz.engine.proposers.suffix import SuffixTreeProposer
    return HybridTreeProposer(SuffixTreeProposer(vocab, verify_cost=v_cost, **kw), DraftModelProposer(draft),
                              c=c, lazy=False)  # the draft reads the prompt at reset: model rounds in short runs


@pytest.mark.parametrize("gamma", [2, 5])
@pytest.mark.parametrize("which", ["suffix-tree", "hybrid-tree"])
def test_tree_mode_greedy_equals_plain(tok, target, draft, gamma, which):
    from specviz.engine.proposers.suffix import SuffixTreeProposer
    from specviz.engine.tree_decoding import tree_speculative
    ids = tok.encode("def quicksort(arr): arr arr arr return arr arr")
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    V = target.config.vocab_size
    prop = (SuffixTreeProposer(V, verify_cost=v_cost, tokenizer=tok) if which == "suffix-tree" else
            _hybrid_tree(draft, V, c=0.1, tokenizer=tok))
    rounds, spec = run(tree_speculative(target, prop, tok, ids, 40, gamma, GREEDY))
    assert spec.token_ids == base.token_ids
    check_stream(rounds, spec)
    assert any(r.info.get("drafter") == "suffix" for r in rounds)
    if which == "hybrid-tree":
        assert any(r.info.get("drafter") == "model" for r in rounds)


@pytest.mark.parametrize("which", ["suffix-tree", "hybrid-tree"])
def test_tree_mode_follows_target_distribution(which):
    from specviz.engine.proposers.suffix import SuffixTreeProposer
    from specviz.engine.tree_decoding import tree_speculative
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)
    prompt = [1, 2, 3, 1, 2, 0, 1, 2]  # after "1 2": 3 and 0, siblings in the tree
    new = (lambda: SuffixTreeProposer(V)) if which == "suffix-tree" else (lambda: _hybrid_tree(d, V, c=0.25))
    exact, counts, runs = sample_sequences(tree_speculative, t, new, 3, SamplingParams(temperature=1.0), N,
                                           prompt=prompt)
    drafters = {r.info["drafter"] for rounds, _ in runs for r in rounds}
    assert "suffix" in drafters and (which == "suffix-tree" or "model" in drafters)
    siblings = any(len([p for p in r.tree["parents"] if p == -1]) > 1 for rounds, _ in runs for r in rounds)
    assert siblings or which == "hybrid-tree"  # its rounds of copied trees are priced against the model's
    assert_follows_target(counts, exact, N)


def test_theory_tab_does_not_place_free_drafts_on_the_chain_formula():
    from specviz.ui import theory
    for method in ("suffix", "hybrid", "suffix-tree"):
        m = theory.Measured(alpha_hat=0.97, c=0.0, gamma=16, speedup=2.4, predicted=None, tau=5.3, method=method)
        assert "drafted from text" in theory.measured_html(m)
        fig, _ = theory.figures(0.8, 4, 0.3, m)
        assert not any((t.name or "").startswith(("measured", "theory at")) for t in fig.data)


def test_speedup_box_says_why_a_free_draft_run_has_no_prediction():
    from specviz.ui.speedup_box import _speedup_text
    snap = {"stats": {"rounds": 5, "speedup": 2.1, "predicted": 0.13, "alpha_hat": 0.97}, "finished": True,
            "method": "hybrid"}
    value, line = _speedup_text(snap)
    assert value == 2.1 and line.startswith("no prediction") and "0.13" not in line


# ------------------------------------------------------------------ the hybrid's priced chain
def test_chain_length_drafts_on_through_sure_tokens_and_stops_at_an_unsure_one():
    from specviz.engine.gamma import ChainLength, monotone
    v = monotone(lambda g: 1.0 + 0.1 * g)
    sure = ChainLength(0.25, v)
    sure.start()
    n = 1
    while sure.more(0.999, 16):
        n += 1
    assert n > 6  # a fixed γ of 4-6 would stop short of a sure run
    unsure = ChainLength(0.25, v)
    unsure.start()
    assert not unsure.more(0.2, 16)  # an unsure first token: the next would likely be wasted
    before = sure.rate(0.999)
    sure.observe(0)  # the first draft refused: its bucket's rate falls
    assert sure.rate(0.999) < before and sure.confs == []


def test_hybrid_model_rounds_vary_their_length_by_confidence(tok, target, draft):
    ids = tok.encode("def quicksort(arr): arr arr arr return arr arr")
    prop = _hybrid(draft, target.config.vocab_size, c=0.05, lazy=False)  # model rounds from round 1
    rounds, _ = run(speculative(target, prop, tok, ids, 40, 16, GREEDY))
    lengths = {r.gamma for r in rounds if r.info["drafter"] == "model"}
    assert len(lengths) > 1 and max(lengths) < 16


# ------------------------------------------------------------------ the hybrid's lazy draft
def test_the_lazy_draft_reads_the_prompt_only_when_a_model_round_pays(tok, target, draft):
    """The draft model skips the prompt at reset; round 1 never reads it; a later model round reads
    all it skipped in one forward (info draft_read), and greedy output is plain's either way."""
    ids = tok.encode("def quicksort(arr): if len(arr) <= 1: return arr; pivot = arr[0]; left = []")
    _, base = run(baseline(target, tok, ids, 40, GREEDY))
    V = target.config.vocab_size
    for lazy in (True, False):
        # a cheap draft (c 0.05): its chain outprices a plain step even with its read of the prompt
        rounds, spec = run(speculative(target, _hybrid(draft, V, c=0.05, tokenizer=tok, lazy=lazy), tok, ids,
                                       40, 4, GREEDY))
        assert spec.token_ids == base.token_ids
        check_stream(rounds, spec)
        first_model = next(i for i, r in enumerate(rounds) if r.info["drafter"] == "model")
        if lazy:
            assert first_model >= EVIDENCE and all(r.info["drafter"] != "model" for r in rounds[:EVIDENCE])
            assert rounds[first_model].info["draft_read"] >= len(ids) - 1
        else:
            assert first_model == 0 and "draft_read" not in rounds[0].info


def test_a_lagging_draft_waits_while_copied_text_serves():
    """The read is spread over the model rounds it would serve: the share of rounds so far whose
    model chain outpriced the suffix draft, times the rest of the run; rarely wanted, it waits."""
    h = _hybrid(None, 10, c=0.3)
    h.policy, h.remaining, h._lag = object(), 100, 300
    tokens, cost = 3.0, 2.0  # the chain's expected tokens and cost: 1.5 tokens a step
    h._rounds, h._wanted = EVIDENCE, EVIDENCE
    assert not h.catch_up_pays(tokens, cost, 1.0)  # the first rounds never read
    h._rounds, h._wanted = 10, 10  # the model outpriced copied text in every round so far
    assert h.catch_up_pays(tokens, cost, 1.0)
    h._rounds, h._wanted = 10, 1  # copied text served 9 rounds in 10
    assert not h.catch_up_pays(tokens, cost, 1.0)
    assert h.read_cost(5) == pytest.approx(0.3 * v_cost(4))
    assert h.read_cost(300) > h.read_cost(17) > h.read_cost(5)


def test_the_round_note_says_when_the_draft_reads_or_waits():
    from specviz.engine.proposers.suffix import round_note
    assert "read the 230 tokens it had skipped" in round_note({"drafter": "model", "draft_read": 230})
    waits = round_note({"drafter": "none", "match_len": 0, "lookup_ms": 0.1, "draft_waits": 231})
    assert waits.startswith("suffix: no draft") and "waits" in waits and "231 tokens" in waits
