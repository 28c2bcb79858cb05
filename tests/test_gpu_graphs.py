"""The static-cache greedy loop of engine/gpu/ (graphs off: the same forwards, eager, on a CPU)
against transformers' own DynamicCache path: plain and speculative greedy give plain greedy's tokens."""
import copy

import pytest
import torch
from helpers import counting_capture
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from specviz.engine.cpu.lean import make_lean
from specviz.engine.gpu.graphs import accept, cache_len, plain_greedy, speculative_greedy
from specviz.engine.gpu.static import StaticModel
from specviz.models.tiny import tiny_model

PROMPT = [5, 9, 13, 20, 7, 3, 40, 41]
NEW = 40


@torch.no_grad()
def dynamic_greedy(model, prompt, new):
    """Plain greedy through transformers' forward and DynamicCache (the engine's eager path)."""
    cache = DynamicCache(config=model.config)
    ids, out = torch.tensor([prompt]), []
    for _ in range(new):
        t = int(model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1].argmax())
        out.append(t)
        ids = torch.tensor([[t]])
    return out


@pytest.fixture(scope="module")
def target():
    return tiny_model(96, 0, layers=3)


@pytest.fixture(scope="module")
def reference(target):
    return dynamic_greedy(target, PROMPT, NEW)


def near(model, scale=0.05, seed=3):
    """A draft close to the target: its weights with noise (accepts some drafts, rejects others)."""
    d = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std())
    return d


def static(model, gamma=8, **kw):
    return StaticModel(model, cache_len(len(PROMPT), NEW, gamma), graphs=False, **kw)


def test_plain_over_the_static_cache_is_plain_greedy(target, reference):
    assert plain_greedy(static(target), PROMPT, NEW) == reference


@pytest.mark.parametrize("gamma", [1, 4, 7])
@pytest.mark.parametrize("kind", ["self", "truncated", "near", "other"])
def test_speculative_greedy_is_plain_greedy(target, reference, gamma, kind):
    draft, layers = {"self": (target, None), "truncated": (target, 1), "near": (near(target), None),
                     "other": (tiny_model(96, 1, layers=1), None)}[kind]
    run = speculative_greedy(static(target), static(draft, n_layers=layers), PROMPT, NEW, gamma)
    assert run.tokens == reference
    assert all(0 <= n <= gamma for n in run.accepted)
    if kind == "self":  # α = 1: every draft accepted, γ + 1 tokens a round
        assert run.alpha == 1.0 and run.accepted == [gamma] * len(run.accepted)


def test_a_near_draft_both_accepts_and_rejects(target, reference):
    run = speculative_greedy(static(target), static(near(target)), PROMPT, NEW, 4)
    assert run.tokens == reference
    assert 0 < run.alpha < 1  # the interesting path: partial rounds and the corrections after them


def test_lean_models_run_their_fused_projections(reference):
    lean = make_lean(tiny_model(96, 0, layers=3))
    assert hasattr(lean.model.layers[0].self_attn, "qkv_proj")
    ref = dynamic_greedy(lean, PROMPT, NEW)
    assert plain_greedy(static(lean), PROMPT, NEW) == ref
    assert speculative_greedy(static(lean), static(lean, n_layers=1), PROMPT, NEW, 3).tokens == ref


def test_acceptance_on_the_device():
    vocab = 10
    rows = torch.zeros(4, vocab)
    for i, t in enumerate([2, 5, 7, 9]):  # the target's argmax after each prefix
        rows[i, t] = 1.0
    assert accept(rows, torch.tensor([2, 5, 7])).tolist() == [3, 2, 5, 7, 9]  # all: bonus 9
    assert accept(rows, torch.tensor([2, 4, 7])).tolist() == [1, 2, 5, 7, 9]  # 1, then correction 5
    assert accept(rows, torch.tensor([1, 5, 7])).tolist()[0] == 0  # a later match does not count


def test_static_cache_bounds_and_cpu_graphs(target):
    sm = StaticModel(target, 12)
    assert sm.max_len == 16  # rounded up: the attention kernels' aligned mask rows
    assert not sm.use_graphs  # a CPU never captures
    sm.capture(1)
    assert sm.graphs == {}
    with pytest.raises(ValueError, match="static cache full"):
        sm.run(torch.arange(5), 12)


# ------------------------------------------------- GraphCache: the engine's calls (varying rows, crop)


def cache_decode(target, draft, gammas, graphs, sizes=(1, 5)):
    """Speculative greedy the way the engine drives a cache: forwards of varying length at the next
    positions, rollbacks by crop(); γ changes every round (as auto γ does)."""
    from specviz.engine.gpu.cache import GraphCache
    n_pos = cache_len(len(PROMPT), NEW, max(gammas))
    T = GraphCache(StaticModel(target, n_pos, graphs=graphs), sizes=sizes)
    D = GraphCache(StaticModel(draft, n_pos, graphs=graphs), sizes=(1,))
    seq = list(PROMPT) + [int(T.forward(PROMPT, 1)[-1].argmax())]
    rnd = 0
    while len(seq) - len(PROMPT) < NEW:
        g = gammas[rnd % len(gammas)]
        rnd += 1
        D.crop(min(D.get_seq_length(), len(seq) - 1))
        drafts = [int(D.forward(seq[D.get_seq_length():], 1)[-1].argmax())]
        while len(drafts) < g:
            drafts.append(int(D.forward(drafts[-1:], 1)[-1].argmax()))
        best = T.forward([seq[-1]] + drafts, g + 1).argmax(-1).tolist()
        n = next((i for i in range(g) if best[i] != drafts[i]), g)
        T.crop(len(seq) + n)
        seq += best[:n + 1]
    return seq[len(PROMPT):len(PROMPT) + NEW]


@pytest.mark.parametrize("kind", ["self", "near"])
def test_graph_cache_under_the_engines_calls(target, reference, kind):
    draft = target if kind == "self" else near(target)
    assert cache_decode(target, draft, [4, 1, 3, 2], graphs=False) == reference


def test_graph_cache_pads_verifies_to_the_captured_size(target, reference, monkeypatch):
    """Graphs on (a fake capture on the CPU): verifies of 2-4 rows run in the 5-row graph, padded."""
    from specviz.engine.gpu import static
    sizes_run = []
    monkeypatch.setattr(static, "capture_graph", counting_capture(lambda out: out[0].shape[1], sizes_run))
    assert cache_decode(target, near(target), [4, 1, 3, 2], graphs=True) == reference
    assert set(sizes_run) == {1, 5}  # every verify (2-5 rows) in the one 5-row graph


def test_graph_cache_takes_device_ids_without_a_host_tensor(target, monkeypatch):
    """A token already on the device (the batched plain loop's) goes into the forward as it is: no
    tensor is built on the host for it, and the logits are those of the same token given as an int."""
    from specviz.engine.gpu.cache import GraphCache
    host, dev = (GraphCache(StaticModel(target, 64, graphs=False)) for _ in range(2))
    first = host.forward(PROMPT)
    assert torch.equal(first, dev.forward(PROMPT))
    x = first[-1:].argmax(-1)  # [1], on the "device"
    built, real = [], torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: built.append(a[0]) or real(*a, **k))
    on_dev = dev.forward(x)
    assert built == []
    assert torch.equal(host.forward([int(x)]), on_dev) and built == [[int(x)]]
    assert dev.rows(real([3, 4]), 5).tolist() == [3, 4, 0, 0, 0]  # padded on the device


def test_joined_projections_give_the_same_logits_and_no_second_copy():
    """fuse=True (the default on CUDA): q/k/v and gate/up joined, each Linear a view of the joined
    matrix; the static forward and transformers' own forward give the same logits as before."""
    model = tiny_model(96, 0, layers=3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        plain = StaticModel(model, 32, graphs=False, fuse=False).run(ids, 0).clone()
    params = sum(p.numel() for p in model.parameters())
    sm = StaticModel(model, 32, graphs=False, fuse=True)
    f = sm.fused[0]
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert f is not None and f.gate_up is not None
    assert attn.q_proj.weight.data_ptr() == f.qkv.data_ptr()  # a view, not a copy
    assert mlp.up_proj.weight.data_ptr() == f.gate_up[mlp.gate_proj.out_features:].data_ptr()
    assert sum(p.numel() for p in model.parameters()) == params
    with torch.no_grad():
        torch.testing.assert_close(sm.run(ids, 0), plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=1e-5, atol=1e-5)
    # joined once: a second StaticModel (the verify cache, a truncated draft) reuses it
    assert StaticModel(model, 32, graphs=False, fuse=True, n_layers=2).fused[0] is f
    assert plain_greedy(StaticModel(model, cache_len(len(PROMPT), NEW, 4), graphs=False, fuse=True),
                        PROMPT, NEW) == dynamic_greedy(model, PROMPT, NEW)


@pytest.mark.parametrize("gamma", [1, 4])
def test_attention_over_the_smallest_span_gives_the_same_tokens(target, reference, gamma):
    """Spans (16, 32, then the whole cache): each forward reads the smallest span holding every
    position written so far, crossing two spans within one run, and greedy stays plain greedy."""
    base = static(target, gamma, spans=(16, 32))
    assert base.spans == [16, 32, base.max_len] and base.span_for(17) == 32
    assert plain_greedy(base, PROMPT, NEW) == reference
    d = near(target)
    assert speculative_greedy(static(target, gamma, spans=(16, 32)), static(d, gamma, spans=(16, 32)),
                              PROMPT, NEW, gamma).tokens == reference


class _Calls(torch.overrides.TorchFunctionMode):
    """torch calls made, by name, and beneath them the aten operators run (what a graph replays as
    kernels, uncompiled, is close to those)."""

    def __init__(self):
        super().__init__()
        self.names, self.ops = [], _Ops()

    def __enter__(self):
        self.ops.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.ops.__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
def test_folded_norms_rotary_and_mask_give_the_same_bits_in_fewer_calls(dtype, rows):
    """fold (the default): each RMSNorm as torch's rms_norm (one fused kernel on CUDA; on a CPU the
    same five calls as transformers', so the same bits), q and k rotated as one tensor, and the mask
    in the query's type once a forward (SDPA converted the bool one in every layer): the same logits,
    bit for bit here, and per layer one rotate_half, two negations and one mask conversion fewer."""
    model = tiny_model(96, 0, layers=3).to(dtype)
    ids, pos = torch.arange(3, 3 + rows).view(1, -1), torch.arange(10, 10 + rows)
    got = {}
    for fold in (False, True):
        sm = StaticModel(model, 64, graphs=False, fuse=True, fold=fold)
        with torch.no_grad(), _Calls() as calls:
            got[fold] = (sm.forward(ids, pos).clone(), calls.names, calls.ops.names)
    assert torch.equal(got[True][0], got[False][0])
    (_, unfolded, unfolded_ops), (_, folded, folded_ops) = got[False], got[True]
    layers = len(model.model.layers)
    assert folded.count("rms_norm") == 2 * layers + 1 and unfolded.count("rms_norm") == 0
    # one rotate_half a layer, not two, and its negation in the forward's sin table (one for all)
    assert folded.count("cat") == unfolded.count("cat") - layers + 1
    assert unfolded.count("neg") == 2 * layers and folded.count("neg") == 1
    assert unfolded_ops.count("where") == layers and folded_ops.count("where") == 0
    assert plain_greedy(StaticModel(model, cache_len(len(PROMPT), NEW, 4), graphs=False, fuse=True),
                        PROMPT, NEW) == plain_greedy(
        StaticModel(model, cache_len(len(PROMPT), NEW, 4), graphs=False, fuse=True, fold=False), PROMPT, NEW)
