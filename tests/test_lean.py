"""Issue 27: the lean Llama-family block (engine/cpu/lean.py) — fused q/k/v and gate/up swapped
into the transformers skeleton. Same logits as the stock model (fp32 and every low-bit
format), greedy speculative identical to plain, and sampling follows the target (χ²)."""
import copy

import pytest
import torch
from helpers import acceptance, assert_follows_target, noisy_copy, run, sample_sequences
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.engine.cpu import lowbit
from specviz.engine.cpu.lean import FusedAttention, FusedMLP, is_lean, make_lean
from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(0.0)


def tiny_llama(vocab=96, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval().requires_grad_(False)


class Tok:
    def decode(self, ids, skip_special_tokens=False):
        return ""


@pytest.mark.parametrize("build", [lambda: tiny_model(96, seed=0, layers=3), tiny_llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("fmt", [None, *lowbit.available()])
def test_same_logits_as_the_stock_model(build, fmt):
    stock = build()
    lean = make_lean(copy.deepcopy(stock))
    assert is_lean(lean) and all(isinstance(layer.self_attn, FusedAttention) and isinstance(layer.mlp, FusedMLP)
                                 for layer in lean.model.layers)
    if fmt:
        stock, lean = lowbit.to_lowbit(stock, fmt), lowbit.to_lowbit(lean, fmt)
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(lean(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(lean.generate(ids, max_new_tokens=8, do_sample=False),
                           stock.generate(ids, max_new_tokens=8, do_sample=False))


def test_other_architectures_are_left_alone():
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2))
    assert make_lean(m) is m and not is_lean(m)


@pytest.mark.parametrize("fmt", [None, "w8a8"])
def test_greedy_speculative_equals_plain(fmt):
    target = make_lean(tiny_model(96, seed=0, layers=3))
    draft = make_lean(noisy_copy(tiny_model(96, seed=0, layers=3), seed=1, scale=0.3))
    if fmt:
        if fmt not in lowbit.available():
            pytest.skip(f"{fmt} does not run on this CPU")
        target, draft = lowbit.to_lowbit(target, fmt), lowbit.to_lowbit(draft, fmt)
    for s in range(3):
        prompt = torch.randint(0, 96, (8,), generator=torch.Generator().manual_seed(s)).tolist()
        _, base = run(baseline(target, Tok(), prompt, 24, GREEDY))
        _, spec = run(speculative(target, DraftModelProposer(draft), Tok(), prompt, 24, 4, GREEDY))
        assert spec.token_ids == base.token_ids


def test_sequences_follow_target_distribution():
    V, N = 4, 1500
    t = make_lean(tiny_model(V, seed=10, layers=2, init=0.8))
    d = make_lean(noisy_copy(tiny_model(V, seed=10, layers=2, init=0.8), 0))
    exact, counts, runs = sample_sequences(speculative, t, lambda: DraftModelProposer(d), 2,
                                           SamplingParams(temperature=1.0), N)
    assert 0.05 < acceptance(runs) < 0.95
    assert_follows_target(counts, exact, N)


def test_step_profile_splits_a_step():
    """bench/step_profile.py on a tiny model: the matmuls are timed inside real steps and the
    bytes read count one row of the input embedding table."""
    from specviz.bench.step_profile import profile_side, report, step_bytes
    from specviz.hosting.bandwidth import weight_bytes
    m = make_lean(tiny_model(500, seed=0, layers=2, hidden=64))
    emb = m.get_input_embeddings().weight
    assert step_bytes(m) == weight_bytes(m) - emb.numel() * 4 + emb.shape[1] * 4
    r = profile_side(m, context=8, steps=6)
    assert r["matmul_calls"] == 2 * 4 + 1  # qkv, o, gate_up, down per layer; the output layer
    assert 0 < r["matmul_ms"] < r["step_ms"] and r["other_ms"] == pytest.approx(r["step_ms"] - r["matmul_ms"])
    lines = report({"target": r}, sum_gbs=10.0)
    assert lines[2].startswith("| target |") and lines[2].endswith("% |")


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_step_profile_sees_inside_kernel_layers():
    """A w4a8 layer runs as two C calls (engine/cpu/kernel_layer.py), past the Linears' hooks: the
    profile times the split on the module path and still counts every matmul."""
    from specviz.bench.step_profile import profile_side
    from specviz.engine.cpu import kernel_layer
    m = lowbit.to_lowbit(make_lean(tiny_model(500, seed=0, layers=2, hidden=64)), "w4a8")
    assert kernel_layer.covers(m)
    r = profile_side(m, context=8, steps=6)
    assert r["matmul_calls"] == 2 * 4 + 1 and r["matmul_ms"] > 0 and kernel_layer.covers(m)


@pytest.mark.parametrize("fmt", [f for f in ("w8a8", "w16") if f in lowbit.available()])
def test_step_bytes_count_prepacked_weights(fmt):
    from specviz.bench.step_profile import step_bytes
    m = tiny_model(500, seed=0, layers=2, hidden=64)
    fp32 = step_bytes(m)
    low = step_bytes(lowbit.to_lowbit(copy.deepcopy(m), fmt))
    assert 0.2 * fp32 < low < 0.6 * fp32  # int8 or fp16 weights, not nothing


def _chain(model, cache, hooked: bool):
    """A prompt, steps and verify-sized forwards through forward_logits; with a forward hook on the
    model (lean_forward steps aside for hooked models) every forward is transformers' own."""
    from specviz.engine.forward import forward_logits
    handle = model.register_forward_hook(lambda *a: None) if hooked else None
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    try:
        out, at = [forward_logits(model, ids[:7], cache, 1)], 7
        for n in (1, 4, 1, 5, 2, 1):
            out.append(forward_logits(model, ids[at:at + n], cache, n))
            at += n
        return out
    finally:
        if handle is not None:
            handle.remove()


@pytest.mark.parametrize("build", [lambda: tiny_model(96, seed=0, layers=3), tiny_llama], ids=["qwen2", "llama"])
@pytest.mark.parametrize("fmt", lowbit.available())
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_lean_forward_is_bit_identical(build, fmt, kind):
    """engine/cpu/lean_forward.py runs the same aten calls as model(...): every logit agrees to the bit,
    through a DynamicCache and an eager StaticKV, so both paths can share a run. w4a8 layers run
    as two C calls each (engine/cpu/kernel_layer.py): the same bits too."""
    from specviz.engine.cpu import kernel_layer, lean_forward
    from specviz.engine.forward import new_cache, set_cache
    model = lowbit.to_lowbit(make_lean(build()), fmt)
    set_cache(model, kind)
    assert lean_forward.eligible(model, 1) and lean_forward.eligible(model, 5)
    assert all(kernel_layer.layer_struct(layer) is not None for layer in model.model.layers) == (fmt == "w4a8")
    assert all(layer.self_attn._rotary in lean_forward._STANDARD for layer in model.model.layers)  # q, k as one
    with torch.no_grad():
        lean, stock = _chain(model, new_cache(model), False), _chain(model, new_cache(model), True)
    assert all(torch.equal(a, b) for a, b in zip(lean, stock, strict=True))


def test_lean_forward_steps_aside():
    """Hooked, unfused, non-row-wise models and long forwards keep transformers' path."""
    from specviz.engine.cpu import lean_forward
    from specviz.engine.cpu.rowwise_attention import ROWWISE_MAX, use_rowwise
    model = make_lean(tiny_model(96, seed=0, layers=2))
    assert not lean_forward.eligible(model, 1)  # sdpa, not row-wise
    use_rowwise(model)
    assert lean_forward.eligible(model, ROWWISE_MAX) and not lean_forward.eligible(model, ROWWISE_MAX + 1)
    handle = model.register_forward_pre_hook(lambda *a: None)
    assert not lean_forward.eligible(model, 1)
    handle.remove()
    stock = tiny_model(96, seed=0, layers=2)
    use_rowwise(stock)
    assert not lean_forward.eligible(stock, 1)


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_kernel_rows_in_low_bit_models_only():
    """A low-bit family model's RMSNorms are one C call each: within float rounding of
    transformers' own, a row's bits the same alone or among others; float models keep theirs."""
    from specviz.engine.cpu.lean import KernelRMSNorm
    model = tiny_model(96, seed=0, layers=2)
    stock = copy.deepcopy(model.model.norm)
    assert not any(isinstance(m, KernelRMSNorm) for m in make_lean(model).modules())
    lowbit.to_lowbit(model, "w8")
    norm = model.model.norm
    assert isinstance(norm, KernelRMSNorm) and torch.equal(norm.weight, stock.weight)
    x = torch.randn(1, 7, stock.weight.shape[0]) * 3
    torch.testing.assert_close(norm(x), stock(x), rtol=1e-6, atol=1e-6)
    assert torch.equal(torch.cat([norm(x[:, i:i + 1]) for i in range(7)], 1), norm(x))
    torch.testing.assert_close(norm(x.transpose(0, 1).contiguous().transpose(0, 1)[:, ::2]), stock(x[:, ::2]))


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_one_call_stack_agrees_through_crops_and_tree_selects(monkeypatch):
    """engine/cpu/kernel_layer.forward_stack (every layer in one C call, the DynamicCache's keys in a
    buffer of its own) against the layer-by-layer path: the same bits after rollbacks (a crop keeps
    the buffer), a tree's index_select and a growth past the buffer's room (both copied back in)."""
    from specviz.engine.cpu import kernel_layer
    from specviz.engine.forward import crop_cache, forward_logits, keep_cache_slots, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=3)), "w4a8")
    ids = torch.randint(0, 96, (400,), generator=torch.Generator().manual_seed(5)).tolist()

    def chain():
        cache, out, at = new_cache(model), [], 0
        for n, back in ((7, 0), (1, 0), (5, 3), (1, 0), (4, 0), (2, 2), (1, 0)) + ((6, 1),) * 50:
            out.append(forward_logits(model, ids[at:at + n], cache, n))
            at += n - back
            crop_cache(cache, at)
            if len(out) == 5:  # a tree's accepted path: positions picked, the rest dropped
                keep_cache_slots(cache, prefix=at - 3, slots=[at - 2, at - 1])
                at -= 1
        return out, cache

    with torch.no_grad():
        stacked, cache = chain()
        assert kernel_layer._BUFFERS.get(cache) is not None and cache.get_seq_length() > kernel_layer.GROW
        monkeypatch.setattr(kernel_layer, "forward_stack", lambda *a, **k: False)
        layered, _ = chain()
    assert all(torch.equal(a, b) for a, b in zip(stacked, layered, strict=True))


@pytest.mark.parametrize("fmt", [None, "bf16", *lowbit.available()])
def test_a_deferred_fusion_gives_the_model_a_fused_load_gives(fmt):
    """Issue 41: a calibration's fp32 model is fused only as it is converted (lean.defer/settle,
    a layer at a time): same modules and the same logits as fusing at load, original left fp32."""
    from specviz.calibration import calibrate as cal
    from specviz.engine.cpu.lean import LATER, defer
    build = lambda: tiny_model(96, seed=0, layers=3)  # noqa: E731
    src = defer(build())
    assert getattr(src, LATER) and not is_lean(src)
    fmt = fmt or "fp32"
    got = cal.convert(src, fmt, reload=build) if fmt in ("fp32", "bf16") else lowbit.lowbit_copy(src, fmt)
    want = make_lean(build())
    want = cal.convert(want, fmt, reload=build) if fmt in ("fp32", "bf16") else lowbit.to_lowbit(want, fmt)
    assert is_lean(got) and not getattr(got, LATER)
    assert [type(m).__name__ for m in got.modules()] == [type(m).__name__ for m in want.modules()]
    ids = torch.tensor([[3, 14, 15, 92, 6]])
    with torch.inference_mode():
        assert torch.equal(got(ids).logits, want(ids).logits)
    if fmt not in ("fp32", "bf16"):  # a twin: the source stays as loaded, fusion still deferred
        assert getattr(src, LATER) and {p.dtype for p in src.parameters()} == {torch.float32}


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_a_tree_forward_on_the_c_stack_is_each_paths_chain(monkeypatch):
    """A token tree's verify as one layers_forward call (lean_forward.forward_masked, each row's
    ancestors read in place) gives every node the bits of a chain forward along its path, and the
    same logits and cache as the module path (model(...) with the 4D mask)."""
    from specviz.engine.cpu import lean_forward
    from specviz.engine.forward import forward_logits, new_cache
    from specviz.engine.tree_forward import tree_forward_logits
    from specviz.engine.tree_sampling import depths_of
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=3)), "w4a8")
    prompt, toks, parents = [3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15, 16], [-1, -1, 0, 0, 2, 1, 4]
    calls = []
    real = lean_forward.forward_masked
    monkeypatch.setattr(lean_forward, "forward_masked", lambda *a: calls.append(1) or real(*a))

    def tree():
        c = new_cache(model)
        forward_logits(model, prompt[:2], c, 1)
        return tree_forward_logits(model, c, fed=prompt[2:], tokens=toks, parents=parents,
                                   depths=depths_of(parents), keep=8), c

    with torch.no_grad():
        fast, cache = tree()
        assert calls
        for i in range(-1, len(toks)):
            path, n = [], i
            while n >= 0:
                path.append(toks[n])
                n = parents[n]
            c = new_cache(model)
            lg = forward_logits(model, prompt, c, 1)
            for t in path[::-1]:
                lg = forward_logits(model, [t], c, 1)
            assert torch.equal(fast[i + 1], lg[-1].float()), i
        monkeypatch.setattr(lean_forward, "forward_masked", lambda *a: None)
        slow, slow_cache = tree()
    assert torch.equal(fast, slow)
    assert all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(cache.layers, slow_cache.layers, strict=True))


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="no C kernels here")
def test_held_layer_structs_follow_a_rehome_and_never_read_freed_memory():
    """kernel_layer holds each layer's C struct until moved(): after tensors are re-homed
    (`t.data = t.data.clone()`, as models/loading.py does) and moved() is said, the structs point at
    the new storage; without moved() the held ones keep the old storage alive, and read it."""
    from specviz.engine.cpu import kernel_layer
    from specviz.engine.forward import forward_logits, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=2)), "w4a8")
    ids = list(range(3, 20))

    def logits():
        with torch.no_grad():
            return forward_logits(model, ids, new_cache(model), 4)

    want, layer = logits(), model.model.layers[0]
    before = kernel_layer.layer_struct(layer)
    for t in (*model.parameters(), *model.buffers()):
        t.data = t.data.clone()
    assert kernel_layer.layer_struct(layer) is before  # not told: the old copy, kept alive
    assert torch.equal(logits(), want)
    kernel_layer.moved()
    after = kernel_layer.layer_struct(layer)
    assert after is not before and after.ln1 == layer.input_layernorm.weight.data_ptr()
    assert torch.equal(logits(), want)


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="needs the C kernel")
def test_a_long_prompt_splits_its_rows_between_threads_with_the_same_bits():
    """A prompt big enough that the stack's norms, rotary, SiLU and residual adds run on both threads
    (qgemm.c's ROWS_PAR: rows x width > 65,536): every row's logits are the bits one thread gives,
    and the last rows' are those of one-token steps."""
    from specviz.engine.forward import crop_cache, forward_logits, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=2, hidden=128)), "w4a8")
    ids = torch.randint(0, 96, (600,), generator=torch.Generator().manual_seed(5)).tolist()
    threads = torch.get_num_threads()
    try:
        with torch.no_grad():
            torch.set_num_threads(2)
            c = new_cache(model)
            two = forward_logits(model, ids, c, len(ids))
            crop_cache(c, len(ids) - 3)
            steps = [forward_logits(model, [t], c, 1) for t in ids[-3:]]
            torch.set_num_threads(1)
            one = forward_logits(model, ids, new_cache(model), len(ids))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(two, one)
    assert all(torch.equal(s[-1], two[-1 - k]) for k, s in zip((2, 1, 0), steps, strict=True))


@pytest.mark.skipif("w4a8" not in lowbit.available(), reason="needs the C kernel")
def test_a_prompt_on_the_c_stack_is_read_whole(monkeypatch):
    """forward.context_apart reads a row-exact target's prompt apart from its last row; on the C
    layer stack, where no row's bits depend on the shape, the prompt is one call, into an empty
    cache too (kernel_layer._open): the same logits and keys as the split read, one whole step and
    an output layer cheaper."""
    from specviz.engine.cpu import kernel_layer, lean_forward
    from specviz.engine.forward import forward_logits, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=2, hidden=64)), "w4a8")
    ids = torch.randint(0, 96, (50,), generator=torch.Generator().manual_seed(6)).tolist()
    rows, stack = [], kernel_layer.forward_stack
    monkeypatch.setattr(kernel_layer, "forward_stack", lambda s, h, *a, **k: rows.append(h.shape[1]) or stack(s, h, *a, **k))
    assert lean_forward.rows_exact(model, len(ids))
    with torch.no_grad():
        whole_cache, split_cache = new_cache(model), new_cache(model)
        whole = forward_logits(model, ids, whole_cache, 1)
        assert rows == [len(ids)] and whole_cache in kernel_layer._BUFFERS  # one stack call wrote it
        forward_logits(model, ids[:-1], split_cache, 1)
        split = forward_logits(model, ids[-1:], split_cache, 1)
    assert torch.equal(whole, split)
    for a, b in zip(whole_cache.layers, split_cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_prompt_read_apart_for_a_masked_forward_reads_no_output_layer():
    """A tree's or lookahead's first verify is a masked forward, so its prompt is still read apart
    from the last row (forward.context_apart); on the C layer stack that read writes the keys alone,
    without the output layer, and leaves the keys a plain prefill of those rows leaves."""
    from specviz.engine.forward import context_apart, forward_logits, new_cache
    model = lowbit.to_lowbit(make_lean(tiny_model(96, seed=0, layers=2, hidden=64)), "w4a8")
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    heads = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: heads.append(i[0].shape[1]))
    with torch.no_grad():
        apart, plain = new_cache(model), new_cache(model)
        assert context_apart(model, apart, ids, 1) == ids[-1:]
        assert heads == []  # no output layer for the keys alone
        hook.remove()
        forward_logits(model, ids[:-1], plain, 1)
    for a, b in zip(apart.layers, plain.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
