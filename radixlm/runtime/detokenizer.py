"""Incremental detokenization that never emits half a UTF-8 character or re-emits text.

Byte-level BPE splits multi-byte characters across tokens; decoding a partial character
yields U+FFFD. The decoder keeps a short window of already-emitted tokens as left context
(so leading spaces and merges decode as in the full text) and holds text back while it
ends in U+FFFD. Each step decodes only the window, so the cost per token stays constant.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    The concatenation of every `add` delta plus `flush()` equals
    `tokenizer.decode(all_ids, skip_special_tokens=...)` for byte-level BPE tokenizers.

    Window: ids[prefix_offset:read_offset] were emitted already and serve as context;
    ids[read_offset:] are pending.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; return the newly complete text (may be empty)."""
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return whatever is still held back (call once, when the request finishes)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        emitted = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) <= len(emitted) or (text.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return text[len(emitted) :]
