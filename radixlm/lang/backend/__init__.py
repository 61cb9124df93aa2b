"""Backends a program runs on: in-process Engine, radixlm's HTTP server, OpenAI APIs."""

from __future__ import annotations

from radixlm.lang.backend.base import Backend, NativeBackend, Prompt, UnsupportedByBackendError

__all__ = ["Backend", "NativeBackend", "Prompt", "UnsupportedByBackendError"]
