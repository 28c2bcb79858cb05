"""Issue 22, item 3: extreme input gives a run or one clear error, never a traceback.

Every method × {greedy, sampled} × {dynamic, static cache} × settings at the edges
(γ 1 and 16, one new token, exit layer 1 and the last, every layer skipped, trees of
one node and of the most, the smallest and largest lookahead), on a tiny pair."""
import pytest
import torch

from specviz.engine import datastore as store
from specviz.engine.events import RunSummary
from specviz.engine.forward import set_cache
from specviz.errors import ModelError, RequestError
from specviz.models import load_pair, resolve_pair
from specviz.models.tiny import save_tiny_pair
from specviz.run.request import METHODS, encode_prompt, make_request
from specviz.run.runner import run_events

LAYERS = 3  # save_tiny_pair's target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("extremes")
    t, d = save_tiny_pair(root)
    p = load_pair(resolve_pair(target=t, draft=d), device="cpu")
    ids = p.tokenizer.encode("def add(a, b):\n    return a + b\n" * 3)
    p.datastore_path = str(store.save(store.from_tokens(ids), root / "tiny.rest"))
    yield p
    for m in (p.target, p.draft):
        set_cache(m, "dynamic")


def extremes(method: str, pair) -> list[dict]:
    from specviz.engine.proposers.lookahead import MAX_GUESSES, MAX_WINDOW
    return {
        "tree": [{"tree_shape": "1"}, {"tree_shape": "16-16-16"}, {"tree_budget": 1}, {"tree_budget": 10_000}],
        "lookahead": [{"window": 1, "guesses": 1}, {"window": MAX_WINDOW, "guesses": MAX_GUESSES}],
        "early-exit": [{"exit_layer": 1}, {"exit_layer": LAYERS}, {"exit_layer": 1, "kv_reuse": False},
                       {"exit_layer": LAYERS + 1}],
        "layer-skip": [{"skip_layers": "0"}, {"skip_layers": f"0-{LAYERS - 1}"}, {"skip_layers": "2"}],
        "rest": [{"datastore": pair.datastore_path}],
    }.get(method, [{}])


SETTINGS = [dict(gamma=1, max_new_tokens=1), dict(gamma=16, max_new_tokens=3),
            dict(gamma="auto", max_new_tokens=2)]
SAMPLING = {"greedy": dict(temperature=0.0),
            "sampled": dict(temperature=2.0, top_k=1, top_p=0.01, seed=2**63 - 1)}


def outcome(pair, method, options, settings, sampling) -> str:
    """'run', or 'error: ...' for one clear error; anything else raises (the test fails)."""
    try:
        req = make_request("def f(x):", method=method, options=options, **settings, **sampling)
        events = list(run_events(pair, req, "speculative", encode_prompt(pair.tokenizer, req)))
    except (RequestError, ModelError) as e:
        assert "\n" not in str(e).strip() and str(e).strip(), repr(e)
        return f"error: {e}"
    assert isinstance(events[-1], RunSummary) and events[-1].n_tokens <= settings["max_new_tokens"]
    return "run"


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_or_says_why(pair, method, cache):
    torch.set_num_threads(1)
    for m in (pair.target, pair.draft):
        set_cache(m, cache)
    got = {}
    for options in extremes(method, pair):
        for settings in SETTINGS:
            for mode, sampling in SAMPLING.items():
                got[str(options), str(settings), mode] = outcome(pair, method, options, settings, sampling)
    assert got  # every combination ended in a run or one clear error (an exception fails above)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_static_cache_early_exit_at_layer_one_is_lossless(pair, cache):
    for m in (pair.target, pair.draft):
        set_cache(m, cache)
    req = make_request("def f(x):", method="early-exit", options={"exit_layer": 1}, max_new_tokens=12)
    ids = encode_prompt(pair.tokenizer, req)
    plain = list(run_events(pair, req, "baseline", ids))[-1].token_ids
    assert list(run_events(pair, req, "speculative", ids))[-1].token_ids == plain


@pytest.mark.parametrize("t", [1e-45, 1e-30, 1e-5])
def test_tiny_temperature_is_refused_with_the_floor(t):
    with pytest.raises(RequestError, match="at least 0.01"):
        make_request("x", temperature=t)
    assert make_request("x", temperature=0.01).temperature == 0.01


def test_seed_range_and_precision():
    assert make_request("x", seed=2**63 - 1).seed == 2**63 - 1
    assert make_request("x", seed=str(2**60 + 1)).seed == 2**60 + 1  # not rounded through a float
    for bad in (2**63, 10**30):
        with pytest.raises(RequestError, match="between 0 and 2\\^63 - 1"):
            make_request("x", seed=bad)
    with pytest.raises(RequestError, match="between 0 and"):
        make_request("x", seed=-1)


@pytest.mark.parametrize("shape", ["4--2", "-4-2", "4-2-", "4,,2"])
def test_tree_shape_with_an_empty_depth_is_refused(shape):
    with pytest.raises(RequestError, match="Tree shape"):
        make_request("x", method="tree", options={"tree_shape": shape})


@pytest.mark.parametrize("skip", ["3-1", "5-2"])
def test_backwards_skip_range_is_refused(skip):
    with pytest.raises(RequestError, match="backwards"):
        make_request("x", method="layer-skip", options={"skip_layers": skip})


def test_cli_extremes_are_one_error_line(tmp_path, capsys):
    from specviz.cli.main import main
    t, d = save_tiny_pair(tmp_path)
    base = ["generate", "--target", t, "--draft", d, "--prompt", "def f(x):", "--max-new-tokens", "3"]
    assert main(base + ["--cache", "static", "--method", "early-exit", "--exit-layer", "1"]) == 0
    for extra in (["--temperature", "1e-45"], ["--seed", str(2**63)], ["--method", "tree", "--tree-shape", "4--2"],
                  ["--method", "layer-skip", "--skip-layers", "3-1"]):
        capsys.readouterr()
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, (extra, err)
