"""The backend interface the interpreter calls, and the shared logic of radixlm's own
backends (in-process Engine and the native HTTP route), which speak SGLang's /generate
protocol:

    request:  {"text" | "input_ids": [...], "sampling_params": {...},
               "return_logprob", "logprob_start_len", "top_logprobs_num",
               "return_text_in_logprobs"}
    result:   {"text": str, "output_ids": [int], "meta_info": {"id", "finish_reason",
               "prompt_tokens", "completion_tokens", "cached_tokens",
               "input_token_logprobs": [[logprob | None, token_id, text | None], ...], ...}}

`select` (all choices in one batched request) is written once here on top of that.
"""

from __future__ import annotations

import logging
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixlm.errors import InvalidRequestError, RadixLMError
from radixlm.lang import choices as choices_mod
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.ir import SamplingOptions

logger = logging.getLogger(__name__)

# Prompt positions before the end of the shared prefix whose logprobs `select` asks for:
# a choice's first characters may merge with the prompt's last tokens when tokenized.
SELECT_LOOKBACK = 2

OnDelta = Callable[[str], None]

# Serializes first loads of chat templates: program threads reach a backend's template at
# once, and a load (a tokenizer import) must run once and give every thread the same
# markers. Reentrant: a wrapping backend loads through the backend it wraps.
_TEMPLATE_LOCK = threading.RLock()


class UnsupportedByBackendError(RadixLMError, NotImplementedError):
    """The backend's API cannot express a primitive or option (e.g. select on OpenAI)."""


@dataclass(frozen=True)
class Prompt:
    """What a gen continues: the state's text, its finished chat messages, the open role
    (None outside roles) and the text written inside that role so far."""

    text: str
    messages: list[dict[str, str]]
    role: str | None = None
    role_text: str | None = None


class Backend(ABC):
    """Where a program's gens and selects are executed. Methods may be called from many
    threads at once (one per running program state)."""

    _chat_template: ChatTemplate | None = None

    @property
    def chat_template(self) -> ChatTemplate:
        """Role markers (loaded once, on first use; threads that ask during the load wait
        for it and get the same markers)."""
        if self._chat_template is None:
            with _TEMPLATE_LOCK:
                if self._chat_template is None:
                    self._chat_template = self._load_chat_template()
        return self._chat_template

    @abstractmethod
    def _load_chat_template(self) -> ChatTemplate: ...

    @abstractmethod
    def generate(
        self, prompt: Prompt, options: SamplingOptions, on_delta: OnDelta | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Continue `prompt`; returns (text, meta_info). With `on_delta`, text pieces are
        passed to it as they arrive (their concatenation is a prefix of the result)."""

    def select(
        self,
        prompt: str,
        choices: list[str],
        temperature: float,
        method: choices_mod.ChoicesSamplingMethod,
        rng: random.Random | None = None,
    ) -> choices_mod.ChoicesDecision:
        """Pick one of `choices` to continue `prompt` (see `NativeBackend.select`)."""
        raise UnsupportedByBackendError(f"{type(self).__name__} cannot run select")

    def cache_prefix(self, text: str) -> int | None:
        """Put `text` into the server's prefix cache; returns its prompt tokens (None
        when the backend has no cache to fill)."""
        return None

    def expect_requests(self, n: int) -> None:  # noqa: B027 - optional hook
        """`n` requests are about to come from sibling states (the branches of a fork,
        whose shared prefix is already cached): a backend that batches may hold its next
        step briefly so they share one extend step."""

    def flush_cache(self) -> bool:
        """Drop the server's prefix cache; False when refused."""
        raise UnsupportedByBackendError(f"{type(self).__name__} cannot flush a cache")

    def get_server_info(self) -> dict[str, Any]:
        raise UnsupportedByBackendError(f"{type(self).__name__} has no server info")

    def shutdown(self) -> None:  # noqa: B027 - optional hook; most backends hold nothing
        """Release resources held for programs (idempotent)."""


def check_choices(choices: Any) -> list[str]:
    """The choices as a list of non-empty strings; raises ValueError / TypeError."""
    if isinstance(choices, str) or not choices:
        raise ValueError("select needs a non-empty list of choice strings")
    out = list(choices)
    for c in out:
        if not isinstance(c, str):
            raise TypeError(f"select choices must be strings, got {type(c).__name__}")
        if not c:
            raise ValueError("select choices must be non-empty strings")
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _scoring_logprob(start: int) -> dict[str, Any]:
    """The logprob arguments of a select scoring request: prompt logprobs from `start`."""
    return {"return_logprob": True, "logprob_start_len": start, "return_text_in_logprobs": True}


class NativeBackend(Backend):
    """A backend that speaks SGLang's /generate protocol (see the module docstring)."""

    @abstractmethod
    def request(
        self,
        *,
        text: list[str] | None = None,
        input_ids: list[list[int]] | None = None,
        sampling_params: dict[str, Any],
        logprob: dict[str, Any] | None = None,
        priority: int = 0,
    ) -> list[dict[str, Any]]:
        """One batched /generate request; one result per prompt, in order. `priority`:
        the requests' scheduling priority (higher first).

        Raises InvalidRequestError for a request the server refuses, ServerError when it
        fails.
        """

    @abstractmethod
    def request_stream(
        self, text: str, sampling_params: dict[str, Any], on_delta: OnDelta, priority: int = 0
    ) -> dict[str, Any]:
        """Stream one request, passing text deltas to `on_delta`; returns the result."""

    def generate(
        self, prompt: Prompt, options: SamplingOptions, on_delta: OnDelta | None = None
    ) -> tuple[str, dict[str, Any]]:
        params = options.to_sampling_params()
        logprob = options.logprob_args()
        prio = options.priority or 0
        if on_delta is None or logprob is not None:
            result = self.request(
                text=[prompt.text], sampling_params=params, logprob=logprob, priority=prio
            )[0]
            return result["text"], result["meta_info"]
        result = self.request_stream(prompt.text, params, on_delta, priority=prio)
        return result["text"], result["meta_info"]

    def cache_prefix(self, text: str) -> int | None:
        result = self.request(text=[text], sampling_params={"max_new_tokens": 0})[0]
        return result["meta_info"]["prompt_tokens"]

    def token_ids(self, texts: list[str]) -> list[list[int]] | None:
        """The ids the server gives each of `texts` as a plain prompt, or None where this
        backend cannot tell without a request (the default)."""
        return None

    #: Whether the server answers ``token_ids_logprob`` (`_score_next_tokens`); cleared
    #: the first time a result lacks ``output_token_ids_logprobs`` or the field is refused.
    asks_token_ids: bool = True

    def _score_by_ids(self, base: list[int], full: list[list[int]]) -> list[list[list]]:
        """`select` step 1-2 from local ids: `base` the prompt's, `full` each prompt +
        choice's. Returns each choice's [logprob, id, text] entries."""
        keeps = [min(_common_prefix(base, ids), len(ids) - 1) for ids in full]
        start = min(keeps)
        if start > 0 and all(k == start and len(ids) == k + 1 for k, ids in zip(keeps, full)):
            scored = self._score_next_tokens(base[:start], [ids[start] for ids in full])
            if scored is not None:
                return scored
        self.request(input_ids=[base], sampling_params={"max_new_tokens": 0})
        logprob = _scoring_logprob(start)
        results = self.request(
            input_ids=full, sampling_params={"max_new_tokens": 0, "temperature": 0}, logprob=logprob
        )
        return [
            [list(e) for e in r["meta_info"]["input_token_logprobs"][keep - start :]]
            for r, keep in zip(results, keeps)
        ]

    def _score_next_tokens(self, head: list[int], tokens: list[int]) -> list[list[list]] | None:
        """Each choice being one token after `head`: their logprobs from head's next-token
        position, in one request that also caches `head` (``token_ids_logprob`` with
        max_new_tokens 0). None when the server does not answer that field (leaves it
        out, or refuses it as unknown), and from then on without asking."""
        if not self.asks_token_ids:
            return None
        logprob = {
            "return_logprob": True,
            "token_ids_logprob": tokens,
            "return_text_in_logprobs": True,
        }
        try:
            result = self.request(
                input_ids=[head],
                sampling_params={"max_new_tokens": 0, "temperature": 0},
                logprob=logprob,
            )[0]
        except InvalidRequestError as e:
            if e.param != "token_ids_logprob":
                raise
            self.asks_token_ids = False
            return None
        positions = result["meta_info"].get("output_token_ids_logprobs")
        if not positions:
            self.asks_token_ids = False
            return None
        return [[list(entry)] for entry in positions[0]]

    def _score_by_lookback(self, prompt: str, choices: list[str]) -> list[list[list]]:
        """`select` step 1-2 without local ids (see `select`)."""
        start = max(self.cache_prefix(prompt) - SELECT_LOOKBACK, 0) if prompt else 0
        logprob = _scoring_logprob(start)
        texts = ([prompt] if prompt else []) + [prompt + c for c in choices]
        results = self.request(
            text=texts, sampling_params={"max_new_tokens": 0, "temperature": 0}, logprob=logprob
        )
        base_ids = [e[1] for e in results[0]["meta_info"]["input_token_logprobs"]] if prompt else []
        per_choice = []
        for r in results[len(results) - len(choices) :]:
            entries = r["meta_info"]["input_token_logprobs"]
            keep = _common_prefix(base_ids, [e[1] for e in entries])
            per_choice.append([list(e) for e in entries[min(keep, len(entries) - 1) :]])
        return per_choice

    def select(
        self,
        prompt: str,
        choices: list[str],
        temperature: float,
        method: choices_mod.ChoicesSamplingMethod,
        rng: random.Random | None = None,
    ) -> choices_mod.ChoicesDecision:
        """Score every choice as a continuation of `prompt` in one batched request.

        A choice's tokens are those of `prompt + choice` after the longest token prefix
        they share with `prompt`'s own (at most all but the last), so tokens merged
        across the boundary count for the choice.

        1. `prompt` is cached (a max_new_tokens=0 request).
        2. One batch scores `prompt + choice` for each choice with prompt logprobs
           (max_new_tokens=0). Where the backend tokenizes locally (`token_ids`), the
           logprobs start at the first position where any choice leaves the prompt's
           ids, so each choice recomputes one prompt position (the logits of its first
           token); otherwise they start SELECT_LOOKBACK tokens before the prompt's end
           and the batch also scores `prompt`, whose ids mark where each choice leaves.
           Where every choice is one token after the same prompt position (digits after
           "Score: ", words that merge with a trailing space), steps 1-2 are one request
           instead: that position's head, with ``token_ids_logprob`` of the choices'
           tokens (`_score_next_tokens`).
        3. With `method.requires_unconditional_logprobs`, one more batch scores each
           choice's tokens alone.
        Then `method` decides (temperature > 0: sample ∝ exp(score / temperature)).

        Raises ValueError for empty or non-string choices.
        """
        choices = check_choices(choices)
        ids = self.token_ids([prompt] + [prompt + c for c in choices]) if prompt else None
        if ids is None:
            per_choice = self._score_by_lookback(prompt, choices)
        else:
            per_choice = self._score_by_ids(ids[0], ids[1:])
        normalized = [choices_mod.mean_logprob(entries) for entries in per_choice]
        uncond = None
        if method.requires_unconditional_logprobs:
            ids = [[e[1] for e in entries] for entries in per_choice]
            scored = self.request(
                input_ids=ids,
                sampling_params={"max_new_tokens": 0, "temperature": 0},
                logprob=_scoring_logprob(0),
            )
            uncond = [r["meta_info"]["input_token_logprobs"] for r in scored]
        kw = {
            "choices": choices,
            "normalized_prompt_logprobs": normalized,
            "input_token_logprobs": per_choice,
            "output_token_logprobs": [[] for _ in choices],
            "unconditional_token_logprobs": uncond,
        }
        if temperature <= 1e-5:
            return method(**kw)
        decision = method(**kw)
        index = choices_mod.softmax_sample(
            method.scores(**kw), temperature, (rng or random).random()
        )
        decision.decision = choices[index]
        return decision
