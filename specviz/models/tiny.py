"""Tiny randomly initialised models and a character tokenizer.

Used by the tests, the CPU smoke runs and the UI's "tiny" pair, so the whole
app can be exercised in seconds without real weights.
"""
from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHARS = string.ascii_letters + string.digits + " .,:;!?()[]{}<>=+-*/_'\"#\n"


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<eos>": 0, "<unk>": 1}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>",
                                   pad_token="<eos>")


def tiny_model(vocab_size: int, seed: int, layers: int = 2, hidden: int = 32,
               init: float = 0.2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, initializer_range=init, tie_word_embeddings=False,
        eos_token_id=0, bos_token_id=0, pad_token_id=0,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    model.requires_grad_(False)
    return model


def save_tiny_pair(root, vocab_size: int = 96) -> tuple[str, str]:
    """Write a tiny target (3 layers) and draft (1 layer) with a shared
    tokenizer to root/target and root/draft; the output layer is padded past
    the tokenizer, as real models often are."""
    from pathlib import Path
    tok = tiny_tokenizer()
    dirs = []
    for name, seed, layers in (("target", 0, 3), ("draft", 1, 1)):
        d = Path(root) / name
        tiny_model(vocab_size, seed, layers=layers).save_pretrained(d)
        tok.save_pretrained(d)
        dirs.append(str(d))
    return dirs[0], dirs[1]
