"""OpenAI logprob shapes built from `TokenLogprobs` (runtime/sampling/logprobs.py).

* completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` with
  top_logprobs a list of {token text: logprob} dicts (None for the first prompt token
  under ``echo``), text_offset the character offset of each token in the choice text.
* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
  "logprob", "bytes"}]}], "refusal": None}``.

Token text is the token decoded alone (special tokens kept); ``bytes`` are the token's
raw UTF-8 bytes (for byte-level BPE the bytes behind its symbols, so a piece of a
multi-byte character shows its real bytes rather than U+FFFD).
"""

from __future__ import annotations

import functools
from typing import Any

from radixlm.runtime.sampling.logprobs import TokenLogprobs


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: symbol -> byte (the inverse of bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenTexts:
    """Cached token id -> (text, UTF-8 bytes) for one tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.text = functools.lru_cache(maxsize=65536)(self._text)
        self.bytes = functools.lru_cache(maxsize=65536)(self._bytes)

    def _text(self, tok: int) -> str:
        return self.tokenizer.decode([tok])

    def _bytes(self, tok: int) -> list[int]:
        if tok not in self._special:
            piece = self.tokenizer.convert_ids_to_tokens(tok)
            table = _byte_decoder()
            if isinstance(piece, str) and piece and all(ch in table for ch in piece):
                return [table[ch] for ch in piece]
        return list(self._text(tok).encode("utf-8"))


def completion_logprobs(
    texts: TokenTexts, parts: list[TokenLogprobs | None], offset: int
) -> tuple[dict[str, Any] | None, int]:
    """The completions ``logprobs`` object of consecutive token runs (e.g. echoed prompt
    then output), text offsets counted from `offset`. Returns (object or None when every
    part is None, offset after the last token)."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    found = False
    for lp in parts:
        if lp is None:
            continue
        found = True
        for i, (value, tok) in enumerate(zip(lp.logprobs, lp.token_ids)):
            text = texts.text(tok)
            tokens.append(text)
            values.append(value)
            offsets.append(offset)
            offset += len(text)
            if value is None or lp.top_logprobs is None:
                tops.append(None if value is None else {})
            else:
                tops.append({texts.text(t): v for t, v in zip(lp.top_ids[i], lp.top_logprobs[i])})
    if not found:
        return None, offset
    body = {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset


def chat_logprobs(texts: TokenTexts, lp: TokenLogprobs | None, top_k: int) -> dict | None:
    """The chat ``logprobs`` object of output tokens (None without logprobs)."""
    if lp is None:
        return None
    content = []
    for i, (value, tok) in enumerate(zip(lp.logprobs, lp.token_ids)):
        top = []
        if top_k > 0 and lp.top_logprobs is not None:
            top = [
                {"token": texts.text(t), "logprob": v, "bytes": texts.bytes(t)}
                for t, v in zip(lp.top_ids[i][:top_k], lp.top_logprobs[i][:top_k])
            ]
        entry = {"token": texts.text(tok), "logprob": value, "bytes": texts.bytes(tok)}
        content.append({**entry, "top_logprobs": top})
    return {"content": content, "refusal": None}


def cumulative_logprob(lp: TokenLogprobs | None) -> float:
    """Sum of the output tokens' logprobs (best_of ranking); 0 for none."""
    if lp is None:
        return 0.0
    return float(sum(v for v in lp.logprobs if v is not None))
