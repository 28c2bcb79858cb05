"""Lookahead decoding on tiny fp32 models: the 4D mask, cache gathering,
greedy output identical to plain decoding, and refusing sampling."""

import pytest
import torch
from helpers import check_stream, fake_pair, run
from transformers import DynamicCache

from specviz.engine.decoding import baseline
from specviz.engine.events import Outcome
from specviz.engine.forward import bias_of, keep_cache_slots, masked_forward
from specviz.engine.proposers.lookahead import Layout, LookaheadProposer, build_mask, lookahead, positions
from specviz.engine.sampling import SamplingParams
from specviz.errors import RequestError
from specviz.run.request import make_request
from specviz.run.runner import run_events

GREEDY = SamplingParams(temperature=0)
PROMPTS = ["def quicksort(arr): arr arr arr", "x = [1, 2, 3]\ny = [1, 2, 3]\nz = ["]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_mask_shapes_the_branches():
    lay = Layout(fed=2, levels=2, window=3, guesses=[[7, 8], [9, 5]])
    m = build_mask(lay)
    assert m.shape == (12, 12)
    assert m[:2, :2].tolist() == [[True, False], [True, True]]
    assert m[2:, :2].all()  # everything sees the fed tokens
    # level 1, column 2 sees level 0 columns 0..2 and itself
    row = m[lay.la(1, 2), 2:8].tolist()
    assert row == [True, True, True, False, False, True]
    # guesses see only themselves (causally), never the window or each other
    g1 = lay.guess(1, 0)
    assert m[g1 + 1, 2:].tolist() == [False] * 8 + [True, True]
    assert positions(lay, 10) == [9, 10, 11, 12, 13, 12, 13, 14, 11, 12, 11, 12]


def test_masked_forward_matches_plain_forward(target):
    ids = torch.randint(0, target.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(0))
    full = target(ids).logits[0]
    cache = DynamicCache()
    target(ids[:, :6], past_key_values=cache, use_cache=True)
    # two independent branches continuing the same prefix
    a, b = ids[0, 6:10].tolist(), ids[0, 6:9].tolist()
    allowed = torch.zeros(7, 7, dtype=torch.bool)
    allowed[:4, :4] = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    allowed[4:, 4:] = torch.tril(torch.ones(3, 3, dtype=torch.bool))
    logits = masked_forward(target, cache, ids=a + b, positions=list(range(6, 10)) + list(range(6, 9)),
                            bias=bias_of(allowed, 6), keep=7)
    torch.testing.assert_close(logits[:4], full[6:10], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[4:], full[6:9], rtol=1e-5, atol=1e-5)
    # keep branch b only: the cache equals a plain one of prefix + b
    keep_cache_slots(cache, prefix=6, slots=[10, 11, 12])
    plain = DynamicCache()
    target(ids[:, :9], past_key_values=plain, use_cache=True)
    for la, lb in zip(cache.layers, plain.layers, strict=True):
        torch.testing.assert_close(la.keys, lb.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(la.values, lb.values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ngram,window,guesses", [(2, 1, 1), (3, 4, 2), (4, 6, 5), (5, 4, 2), (6, 2, 3)])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_lookahead_equals_baseline(tok, target, ngram, window, guesses, prompt):
    ids = tok.encode(prompt)
    _, base = run(baseline(target, tok, ids, 50, GREEDY))
    prop = LookaheadProposer(ngram=ngram, window=window, max_guesses=guesses)
    rounds, spec = run(lookahead(target, prop, tok, ids, 50, GREEDY))
    assert spec.token_ids == base.token_ids and spec.text == base.text
    check_stream(rounds, spec)
    assert spec.target_forwards == spec.rounds < 50
    for r in rounds:
        assert r.info["input_tokens"] >= 1 and r.info["window"] == window
        if r.info["won"] >= 0:  # the winning n-gram is the round's draft
            assert r.draft_ids == r.info["guesses"][r.info["won"]] and r.n_accepted > 0


def test_lookahead_accepts_guesses(tok, target):
    ids = tok.encode(PROMPTS[0])
    rounds, spec = run(lookahead(target, LookaheadProposer(ngram=4, window=6, max_guesses=5), tok, ids,
                                 60, GREEDY))
    assert spec.accepted > 5 and spec.rounds < 45  # the tiny model loops: n-grams pay
    assert any(r.info["won"] >= 0 for r in rounds)


@pytest.mark.parametrize("ngram,window", [(3, 3), (5, 5)])
def test_eos_and_budget_inside_a_guess(tok, target, ngram, window):
    ids = tok.encode(PROMPTS[0])
    _, full = run(baseline(target, tok, ids, 60, GREEDY))
    rounds, spec = run(lookahead(target, LookaheadProposer(ngram=ngram, window=window, max_guesses=4),
                                 tok, ids, 60, GREEDY))
    # an end inside an accepted guess: pick a token that the run accepted mid-guess
    inside = [(r, t) for r in rounds for t in r.tokens if t.outcome is Outcome.ACCEPTED]
    assert inside, "needs accepted guess tokens"
    pos = full.token_ids.index(inside[len(inside) // 2][1].token_id)
    eos = full.token_ids[pos]
    _, base = run(baseline(target, tok, ids, 60, GREEDY, eos_ids=[eos]))
    prop = LookaheadProposer(ngram=ngram, window=window, max_guesses=4)
    rounds, spec = run(lookahead(target, prop, tok, ids, 60, GREEDY, eos_ids=[eos]))
    assert spec.token_ids == base.token_ids and spec.stop_reason == base.stop_reason == "eos"
    check_stream(rounds, spec)
    for max_new in range(1, 30, 3):
        _, base = run(baseline(target, tok, ids, max_new, GREEDY))
        prop = LookaheadProposer(ngram=ngram, window=window, max_guesses=4)
        rounds, spec = run(lookahead(target, prop, tok, ids, max_new, GREEDY))
        assert spec.token_ids == base.token_ids and len(spec.token_ids) == max_new
        check_stream(rounds, spec)


def test_sampling_is_refused(tok, target):
    with pytest.raises(RequestError, match="greedy only"):
        make_request("hi", method="lookahead", temperature=0.7)
    with pytest.raises(RequestError, match="greedy only"):
        list(lookahead(target, LookaheadProposer(), tok, tok.encode("ab"), 5, SamplingParams(1.0)))


@pytest.mark.parametrize("opts", [{"window": 0}, {"window": "x"}, {"guesses": 99}, {"guesses": 1.5}])
def test_bad_options(opts):
    with pytest.raises(RequestError, match="Lookahead"):
        make_request("hi", method="lookahead", options=opts)


def test_runner_dispatches_and_draft_is_ignored(tok, target, draft):
    pair = fake_pair(target=target, draft=None, tokenizer=tok, eos_ids=[])
    req = make_request(PROMPTS[1], method="lookahead", gamma=3, max_new_tokens=20,
                       options={"window": 3, "guesses": 2})
    ids = tok.encode(req.prompt)
    _, spec = run(run_events(pair, req, "speculative", ids))
    _, base = run(run_events(pair, req, "baseline", ids))
    assert spec.method == "lookahead" and spec.token_ids == base.token_ids and spec.gamma == 3
    pair.draft = draft  # a draft model present changes nothing
    _, again = run(run_events(pair, req, "speculative", ids))
    assert again.token_ids == spec.token_ids


def test_winning_ngram_reaches_trace_page_and_cli_summary(tok, target):
    import json

    from specviz.engine.proposer import summarize
    from specviz.run.trace import event_from_dict, event_to_dict
    from specviz.ui.render import round_html
    ids = tok.encode(PROMPTS[0])
    rounds, _ = run(lookahead(target, LookaheadProposer(ngram=4, window=6, max_guesses=5), tok, ids, 60,
                              GREEDY))
    won = next(r for r in rounds if r.info["won"] >= 0)
    back = event_from_dict(json.loads(json.dumps(event_to_dict(won))))
    assert back.info == won.info and back.draft_ids == won.draft_ids
    assert f"n-gram guess {won.info['won'] + 1} of" in round_html(back, "lookahead")
    s = summarize(rounds, "lookahead")
    assert s["ngram_rounds_won"] == sum(1 for r in rounds if r.info["won"] >= 0) > 0


def test_cli_lookahead_flags_and_refusals(capsys, pair_dirs):
    import json

    from specviz.cli.main import main
    t, d = pair_dirs
    base = ["generate", "--target", t, "--draft", d, "--method", "lookahead",
            "--prompt", "x = [1, 2, 3]\ny = ["]
    assert main(base + ["--temperature", "1"]) == 2
    assert "greedy only" in capsys.readouterr().err
    assert main(base + ["--window", "0"]) == 2
    assert "window" in capsys.readouterr().err
    assert main(base + ["--window", "3", "--guesses", "2", "--gamma", "3", "--json", "--mode", "both",
                        "--max-new-tokens", "12"]) == 0
    b, s = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert b["token_ids"] == s["token_ids"] and s["stats"]["method_info"]["input_tokens_per_forward"] > 1
    assert all(r["info"]["window"] == 3 for r in s["rounds"])


def test_auto_gamma_falls_back_to_five_grams(target):
    from specviz.engine.proposers import make_proposer
    pair = fake_pair(target=target, draft=None)
    prop = make_proposer(pair, "lookahead", make_request("hi", method="lookahead", gamma="auto"))
    assert prop.ngram == 5
    prop = make_proposer(pair, "lookahead", make_request("hi", method="lookahead", gamma=2))
    assert prop.ngram == 3
