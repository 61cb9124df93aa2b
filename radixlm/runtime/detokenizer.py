"""Incremental detokenization that never emits half a UTF-8 character or re-emits text.

Byte-level BPE splits multi-byte characters across tokens; decoding a partial character
yields U+FFFD. The decoder keeps a short window of already-emitted tokens as left context
(so spacing decodes correctly) and holds text back while it ends in U+FFFD.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    The concatenation of every `add` delta plus `flush()` equals
    `tokenizer.decode(all_ids, skip_special_tokens=...)` for the same ids.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""

    def _decode(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (may be empty)."""
        self.ids.extend(new_ids)
        text = self._decode()
        if text.endswith("\ufffd"):
            return ""
        return self._take(text)

    def flush(self) -> str:
        """Return whatever is still held back (call once, when the request finishes)."""
        return self._take(self._decode())

    def _take(self, text: str) -> str:
        # Byte-level BPE decodes a prefix of the ids to a prefix of the text once the
        # trailing partial character is complete, so the new text extends `emitted`.
        delta = text[len(self.emitted) :]
        self.emitted = text
        return delta
