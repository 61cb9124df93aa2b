"""Typed errors raised by radixlm's public APIs."""

from __future__ import annotations


class RadixLMError(Exception):
    """Base class of every error radixlm raises on purpose."""


class ModelNotFoundError(RadixLMError, FileNotFoundError):
    """A `--model` value names no alias, directory or file radixlm can load."""


class UnsupportedModelError(RadixLMError, ValueError):
    """The model exists but its architecture is not implemented."""


class InvalidRequestError(RadixLMError, ValueError):
    """A request is malformed (empty prompt, prompt beyond the context, bad sampling value).

    Raised before the request reaches the scheduler; the engine keeps serving others.
    """


class EngineClosedError(RadixLMError, RuntimeError):
    """The engine was shut down; create a new one."""


class RequestTooLargeError(InvalidRequestError):
    """Prompt + max_new_tokens can never fit the KV pool (or the context); HTTP 400.

    Raised at admission (`Scheduler.add_request`, `Engine.generate`) instead of retrying
    a request that no amount of eviction or retraction could make room for.
    """


class QueueFullError(RadixLMError, RuntimeError):
    """The waiting queue already holds `max_queued_requests` requests; HTTP 503.

    Raised by `Scheduler.add_request` at once (the request is not queued); retry later.
    """


class ServerError(RadixLMError, RuntimeError):
    """A server process failed or the request could not be served (HTTP 500/503)."""
