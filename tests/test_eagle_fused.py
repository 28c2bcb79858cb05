"""Our EAGLE head with fused taps (engine/trained/eagle_head.FusedTaps): the inputs of a low and a middle
layer of the target added to f_t, read on the lean forward (cpu/lean_forward.tapping) and on the module
path (the layers' pre-hooks) alike; greedy stays plain's."""
import copy

import pytest
import torch
from helpers import run

from specviz.engine.cpu import lowbit
from specviz.engine.cpu.lean import make_lean
from specviz.engine.cpu.rowwise_attention import use_rowwise
from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers.eagle import Drafter, EagleProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.trained.eagle_head import EagleHead, KeptHead, config_of, head_weight, pack, unpack
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr"
TAPS = [1, 2]


def fused_head(target, seed=0, scale=0.3):
    torch.manual_seed(seed)
    head = EagleHead({**config_of(target, intermediate=48), "taps": TAPS})
    for p in head.parameters():
        torch.nn.init.normal_(p, std=scale)
    return head.eval().requires_grad_(False)


def test_a_zero_fuse_is_the_head_it_started_from(target):
    """FusedTaps starts at 0: a head given taps starts as the EAGLE-1 head whose weights it took, whatever
    the taps; a row's taps of zeros (training's dropped rows) are a row with none."""
    torch.manual_seed(0)
    plain = EagleHead(config_of(target, intermediate=48))
    fused = EagleHead({**plain.cfg, "taps": TAPS})
    missing = fused.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing and all(k.startswith("fuse.") for k in missing)
    e, f, t = torch.randn(1, 5, 32), torch.randn(1, 5, 32), torch.randn(1, 5, 64)
    pos = torch.arange(5)
    assert torch.equal(fused(e, torch.cat([f, t], -1), pos), plain(e, f, pos))
    head = fused_head(target)
    assert not torch.equal(head(e, torch.cat([f, t], -1), pos), head(e, f, pos))
    assert torch.equal(head(e, torch.cat([f, 0 * t], -1), pos), head(e, f, pos))
    back, _ = unpack(pack(head, torch.arange(4)))
    assert back.cfg["taps"] == TAPS and hasattr(back, "fuse")


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_the_tapped_stack_keeps_its_bits_and_taps_the_layers_inputs():
    """forward_stack split at the taps runs the same C code in the same order: the same logits; and each
    tap is the input its layer reads on the module path."""
    from specviz.engine.cpu import lean_forward
    from specviz.engine.forward import forward_logits, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=3)), "w4a8")
    ids = torch.randint(0, 96, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        whole = forward_logits(model, ids, new_cache(model), 9)
        with lean_forward.tapping(model, TAPS) as boxes:
            tapped = forward_logits(model, ids, new_cache(model), 9)
        hooked = [[] for _ in TAPS]
        hs = [model.model.layers[i].register_forward_pre_hook(
            lambda m, a, kw, b=b: b.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
            for i, b in zip(TAPS, hooked, strict=True)]
        hs.append(model.register_forward_pre_hook(lambda *a: None))  # the module path
        try:
            forward_logits(model, ids, new_cache(model), 9)
        finally:
            for h in hs:
                h.remove()
    assert torch.equal(whole, tapped)
    assert all(len(b) == 1 and b[0].shape == (1, 9, 32) for b in boxes)
    for got, want in zip(boxes, hooked, strict=True):
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)


def _models(target):
    lean = make_lean(copy.deepcopy(target))
    use_rowwise(lean)
    out = [("module", target), ("lean", lean)]
    if "w4a8" in lowbit.available():
        out.append(("w4a8", lowbit.to_lowbit(make_lean(copy.deepcopy(target)), "w4a8")))
    return out


@pytest.mark.parametrize("gamma,shape", [(1, "chain"), (3, "chain"), (3, "tree")])
def test_fused_drafts_read_the_taps_and_equal_plain(target, tok, gamma, shape, monkeypatch):
    """On every path a verify can take (a chain's, a tree's masked one), the head's first draft of a round
    reads f_t and both taps ((1 + 2)·H wide rows), later drafts f̂ alone; greedy is plain's."""
    from specviz.engine.proposers.eagle_tree import EagleTreeProposer
    from specviz.engine.tree_decoding import tree_speculative
    ids = tok.encode(PROMPT)
    for name, model in _models(target):
        head = fused_head(model)
        widths = []

        def seen(e, f, *a, real=head.forward, widths=widths, **k):
            widths.append(f.shape[-1])
            return real(e, f, *a, **k)
        monkeypatch.setattr(head, "forward", seen)
        v = model.config.vocab_size
        d = Drafter(head, KeptHead(head_weight(model.lm_head), torch.arange(v), v, None),
                    model.get_input_embeddings(), fused=tuple(TAPS))
        _, base = run(baseline(model, tok, ids, 30, GREEDY))
        if shape == "tree":
            rounds, spec = run(tree_speculative(model, EagleTreeProposer(model, d, budget=6), tok, ids, 30,
                                                gamma, GREEDY))
        else:
            rounds, spec = run(speculative(model, EagleProposer(model, d), tok, ids, 30, gamma, GREEDY))
        assert spec.token_ids == base.token_ids, name
        assert spec.drafted > 0
        assert 96 in widths, name  # the round's first rows: f_t and the two taps
        assert (32 in widths) == (gamma > 1), name  # later drafts: the predicted state alone


def test_taps_pass_then_a_fused_head_trained_from_a_plain_one_runs(target, tok, tmp_path, monkeypatch):
    """heads taps writes a sidecar beside each shard (resuming at the first without one); --taps turns a
    plain head into a fused one (FusedTaps at 0) and trains it; the file drafts as plain greedy."""
    from test_eagle import _tiny_data, pair_of

    from specviz.engine.decoding import speculative
    from specviz.engine.proposers import make_proposer
    from specviz.engine.trained import store
    from specviz.heads import eagle_train, features, taps
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "SHIPPED", tmp_path / "shipped")
    monkeypatch.setattr(features, "SHARD", 700)
    convs, docs = _tiny_data()
    features.run_pass(target, tok, tmp_path / "p", 2000, seq=64, convs=convs, docs=docs, log=None)
    pair = pair_of(target, tok)
    blob, _ = eagle_train.train_eagle(pair, tmp_path / "p", minutes=1, epochs=1, lr=3e-3, intermediate=64)
    torch.save(blob, tmp_path / "plain.pt")
    with pytest.raises(RuntimeError, match="heads taps"):
        eagle_train.train_eagle(pair, tmp_path / "p", minutes=1, init=tmp_path / "plain.pt", taps=True)
    shards = features.load_shards(tmp_path / "p")
    meta = taps.run_taps(target, tmp_path / "p", log=lambda s: None)
    assert meta["taps"]["layers"] == [1, 2] and len(meta["shards"]) > 1
    first = taps.sidecar(tmp_path / "p" / meta["shards"][0]["file"])
    kept = torch.load(first, weights_only=True)
    first.unlink()
    taps.run_taps(target, tmp_path / "p", log=lambda s: None)  # resumes: only the missing sidecar
    assert torch.equal(torch.load(first, weights_only=True), kept)
    rows, x = taps.load_taps(tmp_path / "p")
    assert len(rows) == len(shards["ids"]) == len(x) and x.shape[1] == 64
    blob, rep = eagle_train.train_eagle(pair, tmp_path / "p", minutes=1, epochs=2, lr=3e-3,
                                        init=tmp_path / "plain.pt", taps=True)
    assert blob["config"]["taps"] == [1, 2] and "fuse.proj.weight" in blob["int8"]
    assert "(FusedTaps)" in rep["design"] and rep["steps"] > 0
    store.save(pair, "eagle", blob, rep)
    ids = tok.encode(PROMPT)
    _, base = run(baseline(target, tok, ids, 24, GREEDY))
    _, spec = run(speculative(target, make_proposer(pair, "eagle"), tok, ids, 24, 3, GREEDY))
    assert spec.token_ids == base.token_ids and spec.drafted > 0


@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0), 2),
                                          (SamplingParams(temperature=0.8, top_k=3), 3)])
def test_fused_sequences_follow_target_distribution(params, gamma):
    """Under sampling a fused head's chain keeps the target's law (chi-square over whole sequences)."""
    from helpers import follows_target
    V, L, N = 4, 4, 1200
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    torch.manual_seed(2)
    head = EagleHead({**config_of(t, intermediate=48), "taps": [1]})
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.5)
    d = Drafter(head.eval().requires_grad_(False), KeptHead(t.lm_head.weight, torch.arange(V), V, None),
                t.get_input_embeddings(), fused=(1,))
    assert follows_target(t, lambda: EagleProposer(t, d, stop_below=0.0), [1, 2, 3, 1, 2], L, gamma, params,
                          N) > 1e-3
