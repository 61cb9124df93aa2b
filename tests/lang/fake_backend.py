"""A model-free NativeBackend for interpreter tests: one token per character.

Token ids are code points. A token's logprob given its position depends only on the
character (`char_logprob`), so expected select scores can be computed by hand. Generated
text is ``gen_text(prompt, params)``; hooks let a test block or fail requests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from radixlm.errors import InvalidRequestError
from radixlm.lang.backend.base import NativeBackend
from radixlm.lang.chat_template import CHATML, ChatTemplate


def char_logprob(ch: str) -> float:
    """Deterministic fake logprob of a character token."""
    return -((ord(ch) * 7) % 13) / 4.0 - 0.1


class FakeBackend(NativeBackend):
    """Records every request as (kind, payload) in `calls` (thread-safe)."""

    def __init__(self, template: ChatTemplate = CHATML):
        self._chat_template = template
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.on_request: Callable[[str, dict], None] | None = None
        self.gen_text: Callable[[str, dict], str] = lambda prompt, params: (
            f"<{params['max_new_tokens']}>"
        )
        self.deltas = 3  # streamed gens arrive in this many pieces
        # How a request with token_ids_logprob is answered: "yes", "omits" (an older
        # server leaves the field out) or "refuses" (a strict older server: 400).
        self.answers_token_ids = "yes"

    def _load_chat_template(self) -> ChatTemplate:
        return CHATML

    def _record(self, kind: str, payload: dict) -> None:
        with self.lock:
            self.calls.append((kind, payload))
        if self.on_request is not None:
            self.on_request(kind, payload)

    def _one(self, prompt: str | list[int], params: dict, logprob: dict | None) -> dict:
        text = prompt if isinstance(prompt, str) else "".join(chr(t) for t in prompt)
        if "BAD" in text:
            raise InvalidRequestError("fake refusal: prompt contains BAD")
        meta: dict[str, Any] = {
            "id": "fake",
            "finish_reason": {"type": "length", "length": params["max_new_tokens"]},
            "prompt_tokens": len(text),
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        if logprob:
            start = logprob.get("logprob_start_len", -1)
            start = len(text) if start < 0 else start
            meta["input_token_logprobs"] = [
                [None if i == 0 else char_logprob(ch), ord(ch), ch]
                for i, ch in enumerate(text)
                if i >= start
            ]
            asked = logprob.get("token_ids_logprob")
            if asked is not None and self.answers_token_ids == "refuses":
                raise InvalidRequestError(
                    "Unrecognized request argument supplied: token_ids_logprob",
                    param="token_ids_logprob",
                    code="unknown_parameter",
                )
            if asked is not None and self.answers_token_ids == "yes":  # the next position's
                meta["output_token_ids_logprobs"] = [
                    [[char_logprob(chr(t)), t, chr(t)] for t in asked]
                ]
        out = "" if params["max_new_tokens"] == 0 else self.gen_text(text, params)
        return {"text": out, "output_ids": [ord(c) for c in out], "meta_info": meta}

    def request(self, *, text=None, input_ids=None, sampling_params, logprob=None, priority=0):
        prompts = text if text is not None else input_ids
        payload = {
            "prompts": list(prompts),
            "sampling_params": dict(sampling_params),
            "logprob": logprob,
            "priority": priority,
        }
        self._record("request", payload)
        return [self._one(p, sampling_params, logprob) for p in prompts]

    def request_stream(self, text, sampling_params, on_delta, priority=0):
        self._record(
            "stream",
            {"prompts": [text], "sampling_params": dict(sampling_params), "priority": priority},
        )
        result = self._one(text, sampling_params, None)
        out, n = result["text"], max(1, self.deltas)
        step = max(1, -(-len(out) // n))
        for i in range(0, len(out), step):
            on_delta(out[i : i + step])
        return result

    def prompts_of(self, kind: str = "request") -> list[str]:
        with self.lock:
            return [p for k, c in self.calls if k == kind for p in c["prompts"]]
