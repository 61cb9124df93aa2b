"""Typed errors raised by radixlm's public APIs."""

from __future__ import annotations


class RadixLMError(Exception):
    """Base class of every error radixlm raises on purpose."""


class ModelNotFoundError(RadixLMError, FileNotFoundError):
    """A `--model` value names no alias, directory or file radixlm can load."""


class UnsupportedModelError(RadixLMError, ValueError):
    """The model exists but its architecture is not implemented."""


class WeightsMismatchError(RadixLMError, ValueError):
    """A checkpoint's tensors do not match its config (a tensor is missing, extra, of the
    wrong shape, or held under two names), or a weights file cannot be read. The message
    names every such tensor or file."""


class InvalidRequestError(RadixLMError, ValueError):
    """A request is malformed (empty prompt, prompt beyond the context, bad sampling value).

    Raised before the request reaches the scheduler; the engine keeps serving others.

    Args:
        message: what is wrong, for people.
        param: the request field at fault, by the runtime's names (`SamplingParams`
            fields such as "top_k" or "max_new_tokens", "prompt", "sampling_params",
            `LogprobOptions` fields, "rid"), or None when no one field is. The HTTP
            routes map it to their own field names.
        code: OpenAI's error code ("invalid_value", "invalid_type",
            "unknown_parameter", "context_length_exceeded") or None.
    """

    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code if code is not None else self.default_code

    def copy(self) -> InvalidRequestError:
        """A new error of the same type and fields (to raise a stored error again)."""
        return type(self)(str(self), param=self.param, code=self.code)


class EngineClosedError(RadixLMError, RuntimeError):
    """The engine was shut down; create a new one."""


class RequestTooLargeError(InvalidRequestError):
    """Prompt + max_new_tokens can never fit the KV pool (or the context); HTTP 400.

    Raised at admission (`Scheduler.add_request`, `Engine.generate`) instead of retrying
    a request that no amount of eviction or retraction could make room for.
    """

    default_code = "context_length_exceeded"


class QueueFullError(RadixLMError, RuntimeError):
    """The waiting queue already holds `max_queued_requests` requests; HTTP 503.

    Raised by `Scheduler.add_request` at once (the request is not queued); retry later.
    """


class SLOUnattainableError(RadixLMError, RuntimeError):
    """The request's TTFT target cannot be met behind the current queue and the server runs
    ``--slo-admission reject``; HTTP 429 with ``Retry-After`` (whole seconds, at least 1).

    retry_after_s: the predicted excess over the target, seconds.
    """

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServerError(RadixLMError, RuntimeError):
    """A server process failed or the request could not be served (HTTP 503)."""


class RequestTimeoutError(RadixLMError, TimeoutError):
    """A request waited and ran longer than `ServerArgs.request_timeout`; it was aborted
    and its KV slots freed (HTTP 504, code "request_timeout")."""
