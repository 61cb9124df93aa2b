"""Every message that crosses a process boundary, as tagged `msgspec.Struct` types.

Wire format: msgpack (`encode`), decoded by one `Decoder` for the tagged union `Message`.
No pickle. Flow (DESIGN §2):

    TokenizerManager --GenerateReq/AbortReq/FlushCacheReq/GetInfoReq/OpenSessionReq/
                       CloseSessionReq/UnpinReq--> Scheduler
    Scheduler --BatchTokenOut (one per step) / control replies--> Detokenizer
    Detokenizer --BatchStrOut / control replies (forwarded as is)--> TokenizerManager
    Scheduler, Detokenizer --Heartbeat (every ~0.5 s, see heartbeat.py)--> TokenizerManager

Token counts are in tokens; lists in a batch message are parallel (index i = request i).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from radixlm.errors import (
    InvalidRequestError,
    QueueFullError,
    RadixLMError,
    RequestTooLargeError,
    ServerError,
    SLOUnattainableError,
)
from radixlm.runtime.sampling.logprobs import LogprobOptions, TokenLogprobs
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.request import SchedOptions
from radixlm.runtime.sched.sessions import SessionParams


class DisaggParams(msgspec.Struct, kw_only=True):
    """SGLang's bootstrap fields of a disaggregated request (docs/scale-out.md).

    bootstrap_room: pairs the prefill worker's transfer with the decode worker's request.
    bootstrap_host, bootstrap_port: the decode worker's KV bootstrap address (the prefill
    worker sends there; None on the decode worker's copy of the request).
    """

    bootstrap_room: int
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None


class GenerateReq(msgspec.Struct, tag="generate", kw_only=True):
    """A validated, tokenized generation request.

    input_ids: prompt token ids (non-empty, each in [0, vocab)).
    extra_key: prefix-cache namespace (e.g. a cache salt); requests in different
        namespaces never share cached KV.
    logprobs: SGLang's logprob options (`LogprobOptions`, see `Req`): output-token
        logprobs, prompt logprobs from a position (-1: none), alternatives per position.
    session: SGLang's session_params (runtime/sched/sessions.py): input_ids are appended
        to the continued turn's sequence in the scheduler.
    pin_key: pin the finished sequence in the radix cache under this key (a stored
        Responses API response) until an `UnpinReq` or --session-timeout.
    disagg: the bootstrap fields of a prefill/decode disaggregated request (None: run
        here from prompt to end).
    sched: priority and SLO targets (`SchedOptions`).
    """

    rid: str
    input_ids: list[int]
    params: SamplingParams
    extra_key: str | None = None
    logprobs: LogprobOptions = LogprobOptions()
    session: SessionParams | None = None
    pin_key: str | None = None
    disagg: DisaggParams | None = None
    sched: SchedOptions = SchedOptions()


class AbortReq(msgspec.Struct, tag="abort"):
    """Stop request `rid` wherever it is (waiting, prefilling, decoding)."""

    rid: str


class FlushCacheReq(msgspec.Struct, tag="flush_cache"):
    """Drop every cached prefix; refused while requests run or wait."""

    rid: str


class GetInfoReq(msgspec.Struct, tag="get_info"):
    """Ask the scheduler for its counters (memory accounting, queue sizes, cache stats)."""

    rid: str


class OpenSessionReq(msgspec.Struct, tag="open_session", kw_only=True):
    """Open a session (SGLang's OpenSessionReqInput); the ControlResp's info carries
    ``session_id``, or ok False with the reason (an id already open). timeout: idle
    seconds before it closes (None: --session-timeout)."""

    rid: str
    session_id: str | None = None
    capacity_of_str_len: int = 0
    timeout: float | None = None


class CloseSessionReq(msgspec.Struct, tag="close_session"):
    """Close a session, release its pin and abort its running requests; the ControlResp
    is ok False for an unknown session."""

    rid: str
    session_id: str


class UnpinReq(msgspec.Struct, tag="unpin"):
    """Release the pin under `key` (a stored response was dropped); no reply."""

    key: str


class ControlResp(msgspec.Struct, tag="control"):
    """Reply to FlushCacheReq / GetInfoReq / OpenSessionReq / CloseSessionReq, matched to
    its request by `rid`."""

    rid: str
    ok: bool
    message: str = ""
    info: dict[str, Any] = msgspec.field(default_factory=dict)


# The errors a refusal can carry, by wire name; `ReqError.error` raises the same type.
_REFUSALS: dict[str, type[RadixLMError]] = {
    "invalid_request": InvalidRequestError,
    "request_too_large": RequestTooLargeError,
    "queue_full": QueueFullError,
    "slo_unattainable": SLOUnattainableError,
    "server_error": ServerError,
}
_REFUSAL_NAMES = {cls: name for name, cls in _REFUSALS.items()}

RefusalKind = Literal[
    "invalid_request", "request_too_large", "queue_full", "slo_unattainable", "server_error"
]


class ReqError(msgspec.Struct, tag="req_error", kw_only=True):
    """The scheduler refused a request; the HTTP process raises the same typed error.

    kind: the error's type (a `_REFUSALS` name; a radixlm error of another type travels
    as "server_error"). message: its text. param, code: an InvalidRequestError's fields
    (runtime field names, OpenAI codes), else None. retry_after_s: an
    SLOUnattainableError's, else None.
    """

    rid: str
    kind: RefusalKind
    message: str
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None

    @classmethod
    def of(cls, rid: str, exc: RadixLMError) -> ReqError:
        """The refusal of request `rid` by `exc` (its nearest type in `_REFUSALS`)."""
        kind = next(
            (_REFUSAL_NAMES[t] for t in type(exc).__mro__ if t in _REFUSAL_NAMES), "server_error"
        )
        if isinstance(exc, InvalidRequestError):
            return cls(rid=rid, kind=kind, message=str(exc), param=exc.param, code=exc.code)
        if isinstance(exc, SLOUnattainableError):
            return cls(rid=rid, kind=kind, message=str(exc), retry_after_s=exc.retry_after_s)
        return cls(rid=rid, kind=kind, message=str(exc))

    def error(self) -> RadixLMError:
        """The error to raise for the refused request: `kind`'s type with these fields."""
        err_type = _REFUSALS[self.kind]
        if issubclass(err_type, InvalidRequestError):
            return err_type(self.message, param=self.param, code=self.code)
        if issubclass(err_type, SLOUnattainableError):
            return err_type(self.message, retry_after_s=self.retry_after_s or 1.0)
        return err_type(self.message)


class _BatchOut(msgspec.Struct):
    """Per-step results of several requests (parallel lists, index i = request i).

    finish_reasons[i] is None while request i runs, else its `FinishReason`;
    matched_stops[i] is the EOS / stop token id or stop string that ended it.
    """

    rids: list[str]
    new_token_ids: list[list[int]]
    finish_reasons: list[FinishReason | None]
    matched_stops: list[int | str | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]


class BatchTokenOut(_BatchOut, tag="token_out"):
    """What one scheduler step produced. stops[i] are request i's stop strings (the
    detokenizer cuts the text before them and holds back their possible starts);
    no_stop_trim[i] keeps the matched stop string (empty list: all False);
    skip_special_tokens[i] / spaces_between_special_tokens[i]: request i's decode settings
    (`SamplingParams`; empty list: all True).
    output_logprobs[i] / input_logprobs[i]: see `ReqOutput` (empty list: no request of
    the step asked for logprobs).
    queue_times[i]: seconds request i waited before its first admission (-1: not admitted)."""

    stops: list[list[str]]
    no_stop_trim: list[bool] = msgspec.field(default_factory=list)
    skip_special_tokens: list[bool] = msgspec.field(default_factory=list)
    spaces_between_special_tokens: list[bool] = msgspec.field(default_factory=list)
    output_logprobs: list[TokenLogprobs | None] = msgspec.field(default_factory=list)
    input_logprobs: list[TokenLogprobs | None] = msgspec.field(default_factory=list)
    queue_times: list[float] = msgspec.field(default_factory=list)
    spec_accept_lengths: list[float] = msgspec.field(default_factory=list)


class BatchStrOut(_BatchOut, tag="str_out"):
    """A BatchTokenOut with text: texts[i] is the new text of request i (never a broken
    UTF-8 character, never text already sent, never a possible start of a stop string).
    queue_times: as in BatchTokenOut (empty when the sender did not report them)."""

    texts: list[str]
    output_logprobs: list[TokenLogprobs | None] = msgspec.field(default_factory=list)
    input_logprobs: list[TokenLogprobs | None] = msgspec.field(default_factory=list)
    queue_times: list[float] = msgspec.field(default_factory=list)
    spec_accept_lengths: list[float] = msgspec.field(default_factory=list)


class ProcessReady(msgspec.Struct, tag="ready"):
    """Sent once by a child process when it is ready to serve (info: model facts)."""

    name: str
    info: dict[str, Any] = msgspec.field(default_factory=dict)


class ProcessFailed(msgspec.Struct, tag="failed"):
    """Sent by a child process that could not start or crashed; `error` is "Type: message"
    for radixlm's own errors, else the traceback."""

    name: str
    error: str


class Heartbeat(msgspec.Struct, tag="heartbeat"):
    """A child process is alive (sent every `heartbeat.HEARTBEAT_INTERVAL_S`).

    name: "scheduler" or "detokenizer". steps: loop steps run since start (scheduler
    steps, detokenizer batches). turn_s: seconds the sender's main loop had been in its
    current turn (a long forward step or a stuck loop shows here; an idle scheduler's
    turn lasts up to its 1 s poll; 0 when the loop beats between turns).
    """

    name: str
    steps: int
    turn_s: float = 0.0


Message = (
    GenerateReq
    | AbortReq
    | FlushCacheReq
    | GetInfoReq
    | OpenSessionReq
    | CloseSessionReq
    | UnpinReq
    | ControlResp
    | ReqError
    | BatchTokenOut
    | BatchStrOut
    | ProcessReady
    | ProcessFailed
    | Heartbeat
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    """Serialize one message to msgpack bytes."""
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    """Parse msgpack bytes into the tagged message type. Raises msgspec.DecodeError."""
    return _decoder.decode(data)
