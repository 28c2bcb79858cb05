"""engine/backends/: the forward backend is chosen once per model and cache kind (set_cache) and
held in the model's Runtime; every kind gives the engine's decoding the same tokens as the dynamic
path. The graph cache (graphs.py: a GPU's CUDA graphs over engine/gpu/) runs eagerly on a CPU."""
import pytest
import torch
from helpers import run

from specviz.engine import kvcache
from specviz.engine.decoding import baseline, speculative
from specviz.engine.forward import new_cache, set_cache
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)
PROMPT = "def f(arr): arr arr = arr"


@pytest.mark.parametrize("kind", ["static", "graphs"])
def test_each_cache_kind_decodes_as_the_dynamic_path(tok, kind):
    target, draft = tiny_model(len(tok), seed=0, layers=3), tiny_model(len(tok), seed=1, layers=1)
    ids = tok.encode(PROMPT)
    with torch.inference_mode():
        _, want = run(baseline(target, tok, ids, 24, GREEDY))
        spec_want = run(speculative(target, DraftModelProposer(draft), tok, ids, 24, 4, GREEDY))[1]
        try:
            for m in (target, draft):
                assert set_cache(m, kind) == kind
            assert getattr(new_cache(target), "backend", None) is kvcache.backend(target)
            _, got = run(baseline(target, tok, ids, 24, GREEDY))
            spec = run(speculative(target, DraftModelProposer(draft), tok, ids, 24, 4, GREEDY))[1]
        finally:
            for m in (target, draft):
                set_cache(m, "dynamic")
    assert got.token_ids == want.token_ids and spec.token_ids == spec_want.token_ids


def test_the_backend_is_chosen_once_and_held_beside_the_model(tok):
    model = tiny_model(len(tok), seed=0, layers=2)
    first = kvcache.backend(model)
    assert kvcache.serving(model, new_cache(model)) is first is kvcache.backend(model)
    set_cache(model, "static")
    static = kvcache.backend(model)
    assert static is not first and new_cache(model).backend is static
    assert kvcache.serving(model, new_cache(model)) is static
    assert not hasattr(model, "backend") and "backend" not in vars(model)  # never on the module
    set_cache(model, "dynamic")
    assert kvcache.backend(model) is first  # the dynamic-cache backend is kept
