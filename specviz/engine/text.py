"""Incremental detokenising of a token stream."""
from __future__ import annotations

# tokens of context kept in the decode window: enough for decoders that treat
# the first token of a decode specially (a leading "▁" space is dropped)
_WINDOW = 4


class TextStream:
    """Incremental detokenizer: the text each new token adds, without splitting
    multi-byte characters that byte-level BPE spreads over several tokens.

    Each push decodes only a short window ids[start:] and returns what it adds
    to the window's text at the previous push (`seen`), so a run of n tokens
    costs O(n), not O(n²). Both decodes start at the same token, so whatever a
    decoder does to the first token of a decode cancels out."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.start = 0  # first id of the decode window
        self.seen = ""  # decode(ids[start:]) at the last emitted push
        self.text = ""

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        window = self._decode(self.ids[self.start:])
        new = window[len(self.seen):]
        # hold back a trailing replacement char: the character is not complete yet
        if new.endswith("\ufffd"):
            return ""
        self.seen = window
        self.text += new
        if len(self.ids) - self.start > 2 * _WINDOW:
            # slide at a complete character; the kept tokens are re-decoded as context
            self.start = len(self.ids) - _WINDOW
            self.seen = self._decode(self.ids[self.start:])
        return new

    def final(self) -> str:
        # one full decode: the final text is exactly tokenizer.decode(all ids)
        self.text = self._decode(self.ids)
        return self.text

    def token_text(self, token_id: int) -> str:
        return self.tok.decode([token_id], skip_special_tokens=False)
