"""OpenAI response bodies: full responses and streamed chunks, for completions and chat.

A format turns generation results into the exact JSON shapes of the OpenAI API:
``text_completion`` (completions, streamed and not), ``chat.completion`` and
``chat.completion.chunk``. `usage` always has prompt_tokens, completion_tokens,
total_tokens and prompt_tokens_details.cached_tokens (prompt tokens served from the
prefix cache). Logprob objects come from `logprob_format.py`. With n > 1 a prompt's
tokens are counted once (as OpenAI does), its completions once per choice.

Output logprobs have one entry per generated token, streamed or not: the tokens of a
stop string the text leaves out (the one that completed the match included) and a
matched EOS / stop token are listed too, so the entries, ``usage.completion_tokens`` and
/generate's ``output_ids`` always count the same tokens (as vLLM's token_ids and
logprobs do); only the text is trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from radixlm.frontend.logprob_format import TokenTexts, chat_logprobs, completion_logprobs

_encoder = msgspec.json.Encoder()


@dataclass
class Usage:
    """Token counts summed over a request's choices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, usage: dict[str, int] | None, count_prompt: bool = True) -> None:
        """Add one finished choice's usage ({prompt_tokens, completion_tokens,
        cached_tokens}); count_prompt False for the 2nd.. copies of one prompt (n > 1)."""
        if usage:
            if count_prompt:
                self.prompt_tokens += usage["prompt_tokens"]
                self.cached_tokens += usage["cached_tokens"]
            self.completion_tokens += usage["completion_tokens"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


class OutputFormat:
    """Shared envelope; subclasses define the choice shapes."""

    object_full = ""
    object_chunk = ""

    def __init__(
        self,
        id: str,  # noqa: A002 - OpenAI's field name
        created: int,
        model: str,
        texts: TokenTexts | None = None,
    ):
        self.id = id
        self.created = created
        self.model = model
        self.texts = texts  # None: logprobs not asked for

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _chunk(self, choice: dict[str, Any], include_usage: bool) -> dict[str, Any]:
        body = self._envelope(self.object_chunk, [choice])
        if include_usage:  # OpenAI sends "usage": null on every chunk but the last
            body["usage"] = None
        return body

    def opening(self, n: int, include_usage: bool) -> list[dict[str, Any]]:
        """Chunks sent before any text (none by default)."""
        return []

    def deltas(self, index: int, chunk: dict[str, Any], include_usage: bool) -> list[dict]:
        """Stream chunks for one generation chunk of choice `index` (may be none)."""
        raise NotImplementedError

    def full_choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The last streamed chunk when stream_options.include_usage is set."""
        body = self._envelope(self.object_chunk, [])
        body["usage"] = usage.to_dict()
        return body

    def encode_full(self, results: list[dict[str, Any]], usage: Usage) -> bytes:
        """The non-streamed response body (JSON bytes)."""
        body = self._envelope(
            self.object_full, [self.full_choice(i, r) for i, r in enumerate(results)]
        )
        body["usage"] = usage.to_dict()
        return _encoder.encode(body)


class CompletionFormat(OutputFormat):
    """/v1/completions: ``text_completion`` objects, streamed or not.

    texts: token texts for ``logprobs`` (None: no logprobs asked). echo: per choice the
    prompt text put before its completion (None: no echo); under echo the prompt tokens'
    logprobs come first in ``logprobs``.
    """

    object_full = "text_completion"
    object_chunk = "text_completion"

    def __init__(
        self,
        id: str,  # noqa: A002 - OpenAI's field name
        created: int,
        model: str,
        texts: TokenTexts | None = None,
        echo: list[str] | None = None,
    ):
        super().__init__(id, created, model, texts)
        self.echo = echo
        self._offsets: dict[int, int] = {}  # streamed choice -> text offset so far

    def _logprobs(self, index: int, result: dict[str, Any], offset: int):
        if self.texts is None:
            return None, offset
        parts = [result.get("output_logprobs")]
        if self.echo is not None:
            parts.insert(0, result.get("input_logprobs"))
        return completion_logprobs(self.texts, parts, offset)

    def deltas(self, index: int, chunk: dict[str, Any], include_usage: bool) -> list[dict]:
        reason = chunk["finish_reason"]
        text = chunk["text"]
        first = index not in self._offsets
        if first and self.echo is not None:
            text = self.echo[index] + text
        logprobs, self._offsets[index] = self._logprobs(index, chunk, self._offsets.get(index, 0))
        if not text and reason is None and logprobs is None:
            return []
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        return [self._chunk(choice, include_usage)]

    def full_choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        prefix = self.echo[index] if self.echo is not None else ""
        return {
            "index": index,
            "text": prefix + result["text"],
            "logprobs": self._logprobs(index, result, 0)[0],
            "finish_reason": result["finish_reason"],
        }


class ChatFormat(OutputFormat):
    """/v1/chat/completions: ``chat.completion`` and ``chat.completion.chunk`` objects.

    A stream sends, per choice, a role chunk (``{"role": "assistant", "content": ""}``),
    one ``{"content": ...}`` chunk per text delta, and a chunk with an empty delta and
    the finish_reason.
    """

    object_full = "chat.completion"
    object_chunk = "chat.completion.chunk"

    def __init__(
        self,
        id: str,  # noqa: A002 - OpenAI's field name
        created: int,
        model: str,
        texts: TokenTexts | None = None,
        top_logprobs: int = 0,
    ):
        super().__init__(id, created, model, texts)
        self.top_logprobs = top_logprobs

    def _logprobs(self, result: dict[str, Any]) -> dict[str, Any] | None:
        if self.texts is None:
            return None
        lp = result.get("output_logprobs")
        if lp is None:
            return {"content": [], "refusal": None}
        return chat_logprobs(self.texts, lp, self.top_logprobs)

    def opening(self, n: int, include_usage: bool) -> list[dict[str, Any]]:
        return [
            self._chunk(self._choice(i, {"role": "assistant", "content": ""}, None), include_usage)
            for i in range(n)
        ]

    def deltas(self, index: int, chunk: dict[str, Any], include_usage: bool) -> list[dict]:
        out = []
        logprobs = self._logprobs(chunk) if chunk.get("output_logprobs") is not None else None
        if chunk["text"] or logprobs is not None:
            choice = self._choice(index, {"content": chunk["text"]})
            choice["logprobs"] = logprobs
            out.append(self._chunk(choice, include_usage))
        if chunk["finish_reason"] is not None:
            choice = self._choice(index, {}, chunk["finish_reason"])
            out.append(self._chunk(choice, include_usage))
        return out

    @staticmethod
    def _choice(index: int, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}

    def full_choice(self, index: int, result: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": index,
            "message": {"role": "assistant", "content": result["text"], "refusal": None},
            "logprobs": self._logprobs(result),
            "finish_reason": result["finish_reason"],
        }
