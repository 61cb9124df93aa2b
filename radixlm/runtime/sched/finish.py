"""Why a request ended: the finish reasons the runtime reports."""

from __future__ import annotations

import enum


class FinishReason(enum.StrEnum):
    """A finished request's reason, with the wire values of SGLang and OpenAI.

    STOP: an EOS token, a stop token id or a stop string ended it (`Req.matched_stop`
    says which). LENGTH: max_new_tokens or the context length was reached. ABORT: the
    client or the server stopped it (abort, shutdown, a failed step or grammar compile).

    A `str` subclass: members compare equal to their values and `str()`, f-strings,
    `json` and msgspec give the value, so "stop" / "length" / "abort" stay the wire format.
    """

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
