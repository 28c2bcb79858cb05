"""A draft with a trimmed output layer (models/vocab_trim.py) stays lossless: greedy
output equals plain, sampled sequences follow the target's law, and the draft
never proposes a token outside its kept set."""
from collections import Counter

import torch
from helpers import assert_follows_target, noisy_copy, run, sample_sequences

from specviz.engine.decoding import baseline, speculative
from specviz.engine.proposers import DraftModelProposer
from specviz.engine.sampling import SamplingParams
from specviz.models import vocab_trim
from specviz.models.tiny import tiny_model

GREEDY = SamplingParams(temperature=0)


def test_trimmed_head_keeps_its_tokens_and_floors_the_rest():
    model = tiny_model(50, seed=0, layers=1)
    h = torch.randn(2, 3, model.config.hidden_size)
    full = model.get_output_embeddings()(h)
    keep = [0, 3, 7, 11, 49]
    assert vocab_trim.trim(model, keep) == 5 and vocab_trim.is_trimmed(model) == 5
    out = model.get_output_embeddings()(h)
    assert out.shape == full.shape
    assert torch.allclose(out[..., keep], full[..., keep], atol=1e-6)
    rest = [i for i in range(50) if i not in keep]
    assert (out[..., rest] == torch.finfo(out.dtype).min).all()
    assert torch.softmax(out, -1)[..., rest].max() == 0


def test_frequent_tokens_rank_by_corpus_count_then_lowest_id():
    class Tok:
        all_special_ids = [0]

        def __len__(self):
            return 40

        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[int(w) for w in t.split()] for t in texts]}

    texts = ["5 5 5 9 9 30", "9 5 30 30 30 30"]
    assert vocab_trim.count_tokens(Tok(), texts) == Counter({30: 5, 5: 4, 9: 3})
    assert vocab_trim.frequent_tokens(Tok(), 3, texts=texts) == [0, 5, 30]
    assert vocab_trim.frequent_tokens(Tok(), 6, texts=texts, always=(39,)) == [0, 1, 5, 9, 30, 39]


def test_greedy_speculative_equals_plain_with_a_trimmed_draft(tok, target):
    draft = noisy_copy(target, 3, scale=0.3)
    ids = tok.encode("def quicksort(arr): arr arr arr")
    keep = list(range(0, len(tok), 2)) + ids  # half the vocabulary, and the prompt's tokens
    vocab_trim.trim(draft, keep)
    _, base = run(baseline(target, tok, ids, 32, GREEDY))
    rounds, spec = run(speculative(target, DraftModelProposer(draft), tok, ids, 32, 4, GREEDY))
    assert spec.token_ids == base.token_ids
    drafted = {t.token_id for r in rounds for t in r.tokens if t.outcome.value in ("accepted", "rejected")}
    assert drafted <= set(keep)


def test_sampled_sequences_follow_the_target_with_a_trimmed_draft():
    V, N = 4, 1500
    t = tiny_model(V, seed=10, layers=2, init=0.8)
    d = noisy_copy(t, 0)
    vocab_trim.trim(d, [0, 2, 3])  # token 1 can only come from a resampled rejection or a bonus
    params = SamplingParams(temperature=1.0)
    exact, counts, runs = sample_sequences(speculative, t, lambda: DraftModelProposer(d), 2, params, N)
    assert_follows_target(counts, exact, N)
    assert any(1 in s.token_ids for _, s in runs)
