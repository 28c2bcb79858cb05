"""Incremental detokenising of a token stream."""
from __future__ import annotations


class TextStream:
    """Incremental detokenizer: the text each new token adds, without splitting
    multi-byte characters that byte-level BPE spreads over several tokens."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        # hold back a trailing replacement char: the character is not complete yet
        full = self.tok.decode(self.ids, skip_special_tokens=False)
        if full.endswith("\ufffd"):
            return ""
        new, self.text = full[len(self.text):], full
        return new

    def final(self) -> str:
        self.text = self.tok.decode(self.ids, skip_special_tokens=False)
        return self.text

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)
