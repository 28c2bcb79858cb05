"""Static KV cache: greedy output equals the dynamic cache's, exactly, in fp32
on tiny models, for baseline and speculative (rollback after rejections)."""
import pytest
import torch

from specviz.engine import kvcache
from specviz.engine.decoding import baseline, speculative
from specviz.engine.forward import crop_cache, forward_logits, new_cache, set_cache
from specviz.engine.proposers import AdaptiveDraftProposer, DraftModelProposer, PromptLookupProposer
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def quicksort(arr): arr arr arr"


@pytest.fixture(scope="module")
def models(tok):
    # own instances: set_cache marks the model, the session fixtures stay dynamic
    return tiny_model(len(tok), seed=0, layers=3), tiny_model(len(tok), seed=1, layers=1)


@pytest.fixture
def layout(models, request):
    """Run a test with both models on the given cache layout, then back to dynamic."""
    def use(kind, full=False, compile=False):
        for m in models:
            set_cache(m, kind, compile=compile, masked=full)
    yield use
    for m in models:
        set_cache(m, "dynamic")


def tokens(gen):
    *events, summary = list(gen)
    return summary.token_ids, summary.text, events


def reference(tok, models, n=40):
    set_cache(models[0], "dynamic")
    return tokens(baseline(models[0], tok, tok.encode(PROMPT), n, GREEDY))[:2]


def test_logits_match_and_rollback(models):
    target = models[0]
    ids = list(range(3, 43))
    dyn, stat = new_cache(target), kvcache.StaticKV(8)  # grows past 8 positions
    for cache in (dyn, stat):
        forward_logits(target, ids[:20], cache, 1)
    a, b = forward_logits(target, ids[20:25], dyn, 5), forward_logits(target, ids[20:25], stat, 5)
    torch.testing.assert_close(a, b)
    crop_cache(dyn, 22)
    crop_cache(stat, 22)
    assert stat.get_seq_length() == 22 and stat.capacity >= 25
    a, b = forward_logits(target, ids[22:30], dyn, 8), forward_logits(target, ids[22:30], stat, 8)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("full", [False, True])
def test_masked_full_buffer_layout(models, full):
    target = models[0]
    ids = list(range(3, 33))
    dyn, stat = new_cache(target), kvcache.StaticKV(64, full=full)
    a = forward_logits(target, ids, dyn, 30)
    b = torch.cat([forward_logits(target, ids[i:i + 3], stat, 3) for i in range(0, 30, 3)])
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("full", [False, True])
def test_baseline_static_equals_dynamic(tok, models, layout, full):
    ref = reference(tok, models)
    layout("static", full)
    assert tokens(baseline(models[0], tok, tok.encode(PROMPT), 40, GREEDY))[:2] == ref


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("which", ["different", "lookup", "adaptive"])
@pytest.mark.parametrize("full", [False, True])
def test_speculative_static_equals_dynamic(tok, models, layout, gamma, which, full):
    target, draft = models
    ref = reference(tok, models)
    layout("static", full)
    prop = {"different": lambda: DraftModelProposer(draft),
            "lookup": lambda: PromptLookupProposer(target.config.vocab_size),
            "adaptive": lambda: AdaptiveDraftProposer(draft)}[which]()
    out, text, rounds = tokens(speculative(target, prop, tok, tok.encode(PROMPT), 40, gamma, GREEDY))
    assert (out, text) == ref
    if which != "adaptive":
        assert any(r.n_accepted < r.gamma for r in rounds)  # rollbacks happened


def test_compiled_speculative_equals_dynamic(tok, models, layout):
    target, draft = models
    ref = reference(tok, models, 24)
    layout("static", compile=True)
    assert new_cache(target).compiled is not None
    ids = tok.encode(PROMPT)
    assert tokens(baseline(target, tok, ids, 24, GREEDY))[:2] == ref
    out, text, _ = tokens(speculative(target, DraftModelProposer(draft), tok, ids, 24, 3, GREEDY))
    assert (out, text) == ref


def test_unsupported_model_stays_dynamic(tok):
    m = tiny_model(len(tok), seed=0, layers=1)
    m.config.layer_types = ["sliding_attention"]
    assert set_cache(m, "static") == "dynamic"


def test_eager_attention_float_mask(tok):
    m = tiny_model(len(tok), seed=0, layers=2)
    m.config._attn_implementation = "eager"
    ids = list(range(3, 23))
    a = forward_logits(m, ids, new_cache(m), 20)
    stat = kvcache.StaticKV(32, full=True)
    b = torch.cat([forward_logits(m, ids[i:i + 4], stat, 4) for i in range(0, 20, 4)])
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compile_failure_falls_back_to_eager(tok, models, layout):
    target = models[0]
    ref = reference(tok, models, 12)
    layout("static", compile=True)
    cache = new_cache(target)

    def broken(*args):
        raise RuntimeError("no backend")

    cache.compiled = broken
    forward_logits(target, tok.encode(PROMPT), cache, 1)
    with pytest.warns(UserWarning, match="running eagerly"):
        forward_logits(target, [5], cache, 1)
    assert new_cache(target).compiled is None  # not tried again for this model
    kvcache.runtime(target).compiled = None
    layout("static", full=True)
    assert tokens(baseline(target, tok, tok.encode(PROMPT), 12, GREEDY))[:2] == ref


def test_dynamic_int8_models_are_not_compiled():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8))
    q = torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8)
    q.device = torch.device("cpu")
    assert kvcache.compiled_call(q) is None and kvcache.runtime(q).compiled is False


def test_cache_answers_the_device_transformers_asks():
    """The GPU machines lent to sessions run transformers 5.17: its create_causal_mask asks
    `False in cache.is_sliding` and its index (a bool failed there), and its DynamicLayer.crop
    fails on a layer a layer-skip draft never wrote (engine/layers.drop_last crops around it)."""
    from transformers import DynamicCache

    from specviz.engine.layers import drop_last
    kv = kvcache.StaticKV()
    assert False in kv.is_sliding and kv.is_sliding.index(False) == 0
    cache = DynamicCache()
    k = torch.zeros(1, 1, 5, 4)
    for i in (0, 2):  # layer 1 skipped
        cache.update(k, k, i)
    assert not cache.layers[1].is_initialized
    drop_last(cache, 2)
    assert [layer.keys.shape[2] for layer in cache.layers if layer.is_initialized] == [3, 3]
    drop_last(cache, 0)
    assert cache.get_seq_length() == 3
