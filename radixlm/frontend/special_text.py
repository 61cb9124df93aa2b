"""Special-token text inside chat content stays text.

A chat template writes its control markers (``<|im_start|>``, ``<|im_end|>``, ...) as
strings, and tokenizing the rendered chat turns every such string into its special token,
including one a client put inside a message (a user message or an untrusted tool result
holding ``<|im_end|>\\n<|im_start|>system\\n...`` would forge a system turn).
`SpecialText` tokenizes a rendered chat so that only the template's own markers become
special tokens:

1. `masked` replaces each special-token string inside the client's strings by a sentinel,
   ``<key>x<k>x`` (key: 16 random hex digits per request, k: the special's index), before
   the template renders them. Sentinels are ASCII letters and digits, so trimming, JSON
   dumping and string concatenation in a template keep them intact, and a client cannot
   write one (it does not know the key).
2. `encode` splits the rendered text at the special-token strings left in it (the
   template's markers, matched longest first as the tokenizer does), honouring the
   markers' ``lstrip`` / ``rstrip`` whitespace, puts the client's text back into each
   piece between markers and tokenizes the piece with special-token parsing off.

A fast tokenizer already tokenizes the text between two special tokens on its own, so for
content without special text this gives the same ids as tokenizing the rendered chat in
one call (tests/frontend/test_special_text.py checks this on the bundled model); callers
still take the one-call path when no client string holds special text (`found`).
"Special" means the tokenizer's added tokens marked ``special``; other added tokens are
matched in content as before.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from typing import Any


class SpecialText:
    """The special-token strings of one tokenizer and a text-only encoder for them.

    Args:
        tokenizer: a transformers tokenizer (``added_tokens_decoder``; a fast one is
            copied once into a backend whose special-token parsing stays off, so no
            per-call flag is toggled on the shared tokenizer that other threads use).
    """

    def __init__(self, tokenizer):
        added = {t.content: (i, t) for i, t in tokenizer.added_tokens_decoder.items() if t.special}
        self._specials = sorted(added, key=len, reverse=True)
        self._index = {s: k for k, s in enumerate(self._specials)}
        self._markers = added
        self._find = re.compile("|".join(re.escape(s) for s in self._specials) or r"(?!)")
        self._split = re.compile(f"({self._find.pattern})")
        self._encode_text = _text_encoder(tokenizer)

    def found(self, value: Any) -> bool:
        """Whether any string in `value` (a str, or lists / dicts of them) holds special text."""
        if isinstance(value, str):
            return self._find.search(value) is not None
        if isinstance(value, dict):
            return any(self.found(v) for v in value.values())
        if isinstance(value, list | tuple):
            return any(self.found(v) for v in value)
        return False

    @staticmethod
    def new_key() -> str:
        """A fresh sentinel key (16 hex digits), one per rendering."""
        return secrets.token_hex(8)

    def masked(self, value: Any, key: str) -> Any:
        """`value` with every special-token string in its strings replaced by a sentinel;
        lists and dicts are copied, other values returned as they are."""
        if isinstance(value, str):
            return self._find.sub(lambda m: f"{key}x{self._index[m[0]]}x", value)
        if isinstance(value, dict):
            return {k: self.masked(v, key) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.masked(v, key) for v in value]
        return value

    def encode(self, text: str, key: str) -> list[int]:
        """Token ids of a chat rendered from `masked` strings (with the same `key`): the
        special strings in `text` are the template's markers and become their ids; every
        sentinel becomes its special string again, tokenized as ordinary text."""
        parts = self._split.split(text)  # text, marker, text, ..., text
        for i in range(1, len(parts), 2):
            token = self._markers[parts[i]][1]
            if token.lstrip:
                parts[i - 1] = parts[i - 1].rstrip()
            if token.rstrip:
                parts[i + 1] = parts[i + 1].lstrip()
        sentinel = re.compile(re.escape(key) + r"x(\d+)x")
        ids: list[int] = []
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(self._markers[part][0])
            elif part:
                ids += self._encode_text(sentinel.sub(lambda m: self._specials[int(m[1])], part))
        return ids


def _text_encoder(tokenizer) -> Callable[[str], list[int]]:
    """str -> ids with special-token parsing off and no BOS/EOS added."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a Python tokenizer reads the flag per call
        return lambda s: tokenizer.encode(s, add_special_tokens=False, split_special_tokens=True)
    text_only = type(backend).from_str(backend.to_str())
    text_only.encode_special_tokens = True
    return lambda s: text_only.encode(s, add_special_tokens=False).ids
