"""Issue 22, item 2: self-speculation rebuilds the target's forward from its parts
(engine/layers.py: embed -> layers -> norm -> lm_head). Every architecture it accepts
must match the model's own forward exactly; the others are refused in words.

Failing first (2026-11-23): tiny Granite (embedding_multiplier 12, logits_scaling 8)
ran early exit with KV reuse and its greedy output differed from plain decoding."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from specviz.engine.decoding import baseline, speculative
from specviz.engine.layers import VERIFIED, decoder_parts, layers_forward, n_layers
from specviz.engine.proposers.early_exit import SharedCacheExitProposer
from specviz.engine.sampling import SamplingParams
from specviz.errors import RequestError

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
             bos_token_id=0, eos_token_id=1, pad_token_id=0)
# families whose forward scales on the way (what the parts alone would miss)
SCALED = {"granite": dict(embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.5,
                          attention_multiplier=0.3),
          "cohere": dict(logit_scale=0.0625)}


class Tok:
    def decode(self, ids, skip_special_tokens=False):
        return ""


def tiny(kind: str, **extra):
    cfg = AutoConfig.for_model(kind)
    for k, v in {**SMALL, **extra}.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)


@pytest.mark.parametrize("kind", VERIFIED)
def test_verified_architectures_match_their_own_forward(kind):
    torch.set_num_threads(1)
    m = tiny(kind)
    ids = torch.randint(2, 64, (10,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = m(torch.tensor([ids])).logits[0].float()
    got = layers_forward(m, ids, DynamicCache(), range(n_layers(m)), start=0, keep=len(ids))
    assert torch.equal(got, ref) or float((got - ref).abs().max()) < 1e-5


@pytest.mark.parametrize("kind", sorted(SCALED))
def test_scaled_architectures_run_exact_or_are_refused(kind):
    """Early exit with KV reuse must equal plain greedy decoding, or refuse to run."""
    torch.set_num_threads(1)
    m = tiny(kind, **SCALED[kind])
    prompt, greedy = [2, 3, 4, 5, 6], SamplingParams(0.0)
    plain = list(baseline(m, Tok(), prompt, 10, greedy))[-1].token_ids
    try:
        spec = list(speculative(m, SharedCacheExitProposer(m, 1), Tok(), prompt, 10, 3, greedy))[-1].token_ids
    except RequestError as e:
        assert kind in str(e) and "pick another method" in str(e)
        return
    assert spec == plain


def test_unverified_architecture_is_refused_in_words():
    with pytest.raises(RequestError, match="checked exact only for .*this target is 'granite'"):
        decoder_parts(tiny("granite", **SCALED["granite"]))
