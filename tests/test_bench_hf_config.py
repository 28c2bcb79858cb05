"""Bench fairness: HF generate runs plain greedy, whatever the model's own
generation_config says (transformers fills unset fields from it)."""
from types import SimpleNamespace

import pytest
import torch
from helpers import fake_pair
from transformers import GenerationConfig

from specviz.bench.hf import clean_defaults, greedy_config, run_hf
from specviz.engine.decoding import baseline
from specviz.engine.sampling import SamplingParams

# bookkeeping, not sampling: token ids, lengths, the assistant schedule, the version stamp
IGNORE = {"transformers_version", "_from_model_config", "max_new_tokens", "max_length", "eos_token_id",
          "pad_token_id", "bos_token_id", "num_assistant_tokens", "num_assistant_tokens_schedule",
          "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind", "is_assistant"}

HOSTILE = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, typical_p=0.9,
               repetition_penalty=1.1, no_repeat_ngram_size=2, min_new_tokens=3, renormalize_logits=True,
               forced_eos_token_id=3, suppress_tokens=[5], begin_suppress_tokens=[6],
               sequence_bias={(7,): 2.0},
               output_scores=True, return_dict_in_generate=True, cache_implementation="static",
               epsilon_cutoff=0.001, eta_cutoff=0.001, bad_words_ids=[[8]])


def _effective(model, cfg):
    with clean_defaults(model):
        return model._prepare_generation_config(cfg)[0].to_dict()


@pytest.fixture
def hostile_target(target):
    old = target.generation_config
    target.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, **HOSTILE)
    yield target
    target.generation_config = old


def test_no_sampling_field_is_inherited(hostile_target, target):
    got = _effective(hostile_target, greedy_config(16, [1]))
    plain_model = SimpleNamespace(generation_config=GenerationConfig(), config=target.config)
    plain_model._prepare_generation_config = \
        lambda cfg: type(target)._prepare_generation_config(plain_model, cfg)
    want = plain_model._prepare_generation_config(greedy_config(16, [1]))[0].to_dict()
    diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want)
            if k not in IGNORE and got.get(k) != want.get(k)}
    assert not diff, diff
    # and without the clean swap the hostile defaults would leak in (the test can fail)
    leaked = hostile_target._prepare_generation_config(greedy_config(16, [1]))[0]
    assert leaked.forced_eos_token_id == 3 and leaked.cache_implementation == "static"


def test_hf_greedy_matches_plain_greedy_despite_model_defaults(hostile_target, tok):
    ids = tok.encode("abcab")
    pair = fake_pair(target=hostile_target, eos_ids=(), draft=None, quantize=None)
    hf = run_hf(pair, "hf-greedy", 4, ids, 12)
    ours = list(baseline(hostile_target, tok, ids, 12, SamplingParams()))[-1]
    assert hf["token_ids"] == ours.token_ids
    assert hostile_target.generation_config.repetition_penalty == 1.1  # restored after the call
    assert torch.is_tensor(torch.tensor(hf["token_ids"]))
