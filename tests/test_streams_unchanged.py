"""Seeded event streams of every method, replayed against streams recorded from
main on 2026-11-23 at 110fe2f (before the round pipeline of issue 19): token ids, each
token's outcome and display order, per-round drafted/accepted counts, the run's
totals, and the p/q/u, inspector rows, tree records and method info. Times are
left out (they are measured, never equal).

What is machine-independent is compared exactly: token ids, outcomes, round
structure, and the shape of every record (which fields, which token ids, in
which order). The floats are not: fp32 kernels sum in another order on another
CPU class (AVX2 vs AVX-512: the same streams, floats apart by ~1e-7, and a
4-digit rounding of them flipped a digest in 19 of 114 streams). So the floats
are kept as a few weighted sums (FLOAT_SIGNATURE) and compared within FLOAT_TOL:
rounding moves them by ~1e-6, a change of behaviour (another p, q or u anywhere)
by far more. Checked on 2026-11-25 on an Intel Xeon with AVX-512-bf16/AMX and
under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 (tests/test_portable.py
runs this file under the emulated class too).

Re-record (only when a change of behaviour is intended, and say so in the commit):
    SPECVIZ_RECORD_STREAMS=1 python3 -m pytest tests/test_streams_unchanged.py
"""
import hashlib
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import fake_pair

from specviz.engine import datastore
from specviz.engine.costs import CostModel
from specviz.engine.events import RoundEvent, RunSummary, TokenEvent
from specviz.engine.forward import set_cache
from specviz.engine.proposers import heads as store
from specviz.engine.proposers.heads import Heads
from specviz.models.tiny import tiny_model
from specviz.run.request import make_request
from specviz.run.runner import run_events

FIXTURES = Path(__file__).parent / "fixtures" / "streams"
RECORD = os.environ.get("SPECVIZ_RECORD_STREAMS") == "1"
PROMPT = "def f(arr): arr arr = arr"
N = 16  # new tokens per run
FLOAT_SIGNATURE = 6  # weighted sums of the floats, each with its own fixed random weights
FLOAT_TOL = 1e-3  # per sum, scaled by max(1, sum of |x| / 1000)

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = dict(temperature=0.0)
SAMPLED = dict(temperature=1.0, seed=7)
NUCLEUS = dict(temperature=0.8, top_p=0.9, top_k=20, seed=3)


def _cases():
    """(file, name, settings): every method, greedy and sampled, with and without EOS, γ 1/4/8."""
    out = []
    chain = ["draft", "adaptive", "lookup", "staged", "rest", "early-exit", "layer-skip", "heads"]
    for method in chain:
        for gamma in (1, 4, 8):
            out.append((method, f"{method}-g{gamma}-greedy", dict(method=method, gamma=gamma, **GREEDY)))
        out.append((method, f"{method}-g4-sampled", dict(method=method, gamma=4, **SAMPLED)))
        out.append((method, f"{method}-g4-greedy-eos", dict(method=method, gamma=4, eos=True, **GREEDY)))
        out.append((method, f"{method}-g8-sampled-eos", dict(method=method, gamma=8, eos=True, **SAMPLED)))
    for method in ("draft", "adaptive", "staged", "tree"):  # the draft is the target: long accepted runs
        out.append((method, f"{method}-same-g4-greedy", dict(method=method, gamma=4, same=True, **GREEDY)))
        out.append((method, f"{method}-same-g8-sampled-eos",
                    dict(method=method, gamma=8, same=True, eos=True, **SAMPLED)))
    out.append(("draft", "draft-g4-nucleus", dict(method="draft", gamma=4, **NUCLEUS)))
    out.append(("draft", "draft-auto-costs", dict(method="draft", gamma=8, auto=True, costs=True, **SAMPLED)))
    out.append(("draft", "draft-auto-nocosts", dict(method="draft", gamma=8, auto=True, **GREEDY)))
    out.append(("lookup", "lookup-auto-costs", dict(method="lookup", gamma=6, auto=True, costs=True, **GREEDY)))
    for gamma in (1, 4, 8):
        for shape in ("", "3-2-1", "2-2-2-1-1-1-1-1"):
            tag = shape or "dyn"
            out.append(("tree", f"tree-{tag}-g{gamma}-greedy",
                        dict(method="tree", gamma=gamma, options={"tree_shape": shape}, **GREEDY)))
    out.append(("tree", "tree-dyn-b4-g4-greedy", dict(method="tree", gamma=4, options={"tree_budget": 4}, **GREEDY)))
    out.append(("tree", "tree-dyn-g4-sampled", dict(method="tree", gamma=4, options={}, **SAMPLED)))
    out.append(("tree", "tree-3-2-1-g4-sampled-eos",
                dict(method="tree", gamma=4, eos=True, options={"tree_shape": "3-2-1"}, **SAMPLED)))
    out.append(("tree", "tree-dyn-g8-greedy-eos", dict(method="tree", gamma=8, eos=True, options={}, **GREEDY)))
    out.append(("tree", "tree-dyn-auto", dict(method="tree", gamma=8, auto=True, options={}, **GREEDY)))
    for gamma in (1, 4, 8):
        out.append(("lookahead", f"lookahead-g{gamma}-greedy", dict(method="lookahead", gamma=gamma, **GREEDY)))
    out.append(("lookahead", "lookahead-g4-w2-g3-greedy-eos",
                dict(method="lookahead", gamma=4, eos=True, options={"window": 2, "guesses": 3}, **GREEDY)))
    out.append(("lookahead", "lookahead-auto", dict(method="lookahead", gamma=8, auto=True, **GREEDY)))
    for cache in ("static", "static-full"):
        out.append(("static", f"{cache}-plain-greedy", dict(method="draft", side="baseline", cache=cache, **GREEDY)))
        out.append(("static", f"{cache}-plain-sampled", dict(method="draft", side="baseline", cache=cache, **SAMPLED)))
        for method in ("draft", "adaptive", "lookup"):
            out.append(("static", f"{cache}-{method}-g4-greedy", dict(method=method, gamma=4, cache=cache, **GREEDY)))
        out.append(("static", f"{cache}-draft-g8-sampled-eos",
                    dict(method="draft", gamma=8, eos=True, cache=cache, **SAMPLED)))
    out.append(("plain", "plain-greedy", dict(method="draft", side="baseline", **GREEDY)))
    out.append(("plain", "plain-sampled", dict(method="draft", side="baseline", **SAMPLED)))
    out.append(("plain", "plain-greedy-eos", dict(method="draft", side="baseline", eos=True, **GREEDY)))
    out.append(("plain", "plain-nucleus-eos", dict(method="draft", side="baseline", eos=True, **NUCLEUS)))
    return out


CASES = _cases()
OPTIONS = {"early-exit": {"exit_layer": 1}, "layer-skip": {"skip_layers": "1"}}


def _split(x, floats: list):
    """The record with every float taken out (into `floats`, in order) as "f"."""
    if isinstance(x, float):
        floats.append(x)
        return "f"
    if isinstance(x, dict):
        return {k: _split(v, floats) for k, v in x.items() if not k.endswith("_ms")}  # REST lookup times
    if isinstance(x, (list, tuple)):
        return [_split(v, floats) for v in x]
    return x


def _digest(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def signature(floats: list[float]) -> list[float]:
    """[count of non-finite values, then FLOAT_SIGNATURE weighted sums of the finite ones]."""
    x = torch.tensor([f for f in floats if math.isfinite(f)], dtype=torch.float64)
    w = torch.rand(FLOAT_SIGNATURE, len(x), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return [float(len(floats) - len(x))] + (w + 0.5).matmul(x).tolist()


def _floats_match(got: list[float], want: list[float]) -> bool:
    if len(got) != len(want) or got[0] != want[0]:
        return False
    scale = max(1.0, max(abs(v) for v in want) / 1000)
    return all(abs(a - b) <= FLOAT_TOL * scale for a, b in zip(got[1:], want[1:], strict=True))


def _token(t: TokenEvent) -> list:
    return [t.token_id, t.outcome.value, t.round, t.position]


def stream(events) -> dict:
    """What a run's events say, times left out."""
    tokens, rounds, floats = [], [], []
    for ev in events:
        if isinstance(ev, TokenEvent):
            tokens.append(_token(ev))
            floats.append([ev.p, ev.q, ev.u, ev.gap])
        elif isinstance(ev, RoundEvent):
            rounds.append([ev.index, ev.gamma, ev.draft_ids, ev.n_accepted, ev.appended_id, ev.resampled,
                           ev.draft_forwards, ev.prompt_tokens, [_token(t) for t in ev.tokens],
                           [ev.total_tokens, ev.total_drafted, ev.total_accepted, ev.target_forwards]])
            floats.append([ev.q, ev.p, ev.u, ev.overlap, [[t.p, t.q, t.u, t.gap] for t in ev.tokens],
                           ev.info, ev.dists, ev.residual, ev.tree])
        else:
            assert isinstance(ev, RunSummary)
            s = ev
    summary = dict(side=s.side, method=s.method, token_ids=s.token_ids, text=s.text, n_tokens=s.n_tokens,
                   stop_reason=s.stop_reason, rounds=s.rounds, drafted=s.drafted, accepted=s.accepted,
                   target_forwards=s.target_forwards, draft_forwards=s.draft_forwards,
                   prompt_rounds=s.prompt_rounds, gamma=s.gamma, gamma_policy=s.gamma_policy,
                   unmeasured=list(s.unmeasured))
    floats.append(s.overlap_sum)
    values: list[float] = []
    shape = _split(floats, values)
    out = {"summary": summary, "rounds": rounds, "shape": _digest(shape), "floats": signature(values)}
    if tokens:
        out["tokens"] = tokens
    return out


@pytest.fixture(scope="module")
def world(tok, tmp_path_factory, monkeypatch_module):
    """Models, a datastore, random heads: everything the runs need, built once."""
    target = tiny_model(len(tok), seed=0, layers=3)
    draft = tiny_model(len(tok), seed=1, layers=1)
    ids = tok.encode(PROMPT)
    ds = datastore.from_tokens(ids * 3 + [datastore.SEP] + tok.encode("arr = f(arr) arr arr"))
    path = datastore.save(ds, tmp_path_factory.mktemp("streams") / "ds.npz")
    torch.manual_seed(0)
    heads = Heads(target.config.hidden_size, 3)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.5)
    heads = heads.eval().requires_grad_(False)
    monkeypatch_module.setattr(store, "load", lambda pair: heads)
    return SimpleNamespace(tok=tok, target=target, draft=draft, ids=ids, datastore=str(path), static={})


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


COSTS = CostModel(plain_step_s=0.01, verify_s=tuple(0.01 * (1 + 0.15 * n) for n in range(17)), draft_step_s=0.002)


def _pair(w, cfg):
    target, draft = w.target, w.draft
    cache = cfg.get("cache")
    if cache:
        if cache not in w.static:
            t = tiny_model(len(w.tok), seed=0, layers=3)
            d = tiny_model(len(w.tok), seed=1, layers=1)
            for m in (t, d):
                set_cache(m, "static", masked=cache == "static-full")
            w.static[cache] = (t, d)
        target, draft = w.static[cache]
    if cfg.get("same"):
        draft = target
    return fake_pair(target=target, draft=draft, tokenizer=w.tok, eos_ids=[], device=target.device,
                           precision_label="float32", costs=COSTS if cfg.get("costs") else None,
                           spec=SimpleNamespace(name="tiny-test", target="tiny", draft="tiny-draft"))


def run_case(w, cfg) -> dict:
    """One seeded run. With eos: the same run's 6th token is made EOS, so EOS lands inside a round."""
    cfg = dict(cfg)
    pair = _pair(w, cfg)
    if cfg.pop("eos", False):
        pair.eos_ids = [run_case(w, cfg)["summary"]["token_ids"][5]]
    options = dict(cfg.pop("options", OPTIONS.get(cfg["method"], {})))
    if cfg["method"] == "rest":
        options["datastore"] = w.datastore
    req = make_request(PROMPT, method=cfg["method"], gamma="auto" if cfg.get("auto") else cfg.get("gamma", 4),
                       max_new_tokens=N, temperature=cfg.get("temperature", 0.0), top_p=cfg.get("top_p", 1.0),
                       top_k=cfg.get("top_k", 0), seed=cfg.get("seed", 0), options=options)
    if cfg.get("auto") and cfg.get("gamma"):  # auto with a cap other than the page's 16
        req = replace(req, gamma=cfg["gamma"])
    out = stream(run_events(pair, req, cfg.get("side", "speculative"), w.ids))
    out["eos_ids"] = pair.eos_ids
    return out


def _load(file: str) -> dict:
    path = FIXTURES / f"{file}.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("file,name,cfg", CASES, ids=[c[1] for c in CASES])
def test_stream_unchanged(world, file, name, cfg):
    got = json.loads(json.dumps(run_case(world, cfg)))
    if RECORD:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        data = _load(file)
        data[name] = got
        (FIXTURES / f"{file}.json").write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
        return
    want = _load(file).get(name)
    assert want is not None, f"no recorded stream for {name}: record it (see the module doc)"
    assert got["summary"] == want["summary"]
    assert got.get("tokens") == want.get("tokens")
    for i, (a, b) in enumerate(zip(got["rounds"], want["rounds"], strict=True)):
        assert a == b, f"round {i}"
    assert got["shape"] == want["shape"], "the records' fields or token ids changed"
    assert _floats_match(got["floats"], want["floats"]), (got["floats"], want["floats"])
    assert got["eos_ids"] == want["eos_ids"]
    assert set(got) == set(want)
