"""Sessions (SGLang's ``open_session`` / ``session_params``) and pins of stored responses.

A session is a tree of requests ("turns"). A request with `SessionParams` ``rid`` continues
that earlier, finished turn of the session: its prompt is the turn's full token sequence
(prompt + output, output cut at the turn's max_new_tokens), trimmed to its first
``offset`` tokens when offset is given and non-zero, followed by the request's own input
(its leading BOS dropped), as SGLang's `Session.create_req` composes it. Without ``rid``
the request starts a new branch from its own input. ``replace`` drops the other branches:
with ``rid``, every turn that continued that turn; without, every turn of the session
(running ones are aborted). ``drop_previous_output`` continues from the turn's prompt only.

While a session lives, the KV of its latest finished turn's sequence is pinned in the
radix cache (`PinTable`, key ``session:<id>``); closing the session, or ``timeout``
seconds without a request (``--session-timeout``, or the session's own), releases it.
A request may also carry a plain pin key (a stored Responses API response): when it
finishes, its sequence is pinned under that key until `unpin` or the same timeout.

Errors (InvalidRequestError, HTTP 400): an unknown or closed session (param
``session_params.id``), an unknown turn or one still running (``session_params.rid``),
opening an id already open (``session_id``), closing an unknown id (``session_id``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.sched.pins import PinTable
from radixlm.runtime.sched.request import Req


class SessionParams(msgspec.Struct, kw_only=True):
    """SGLang's ``session_params`` of a generate request (see the module docstring).

    id: the session. rid: the turn to continue (None: a new branch). offset: keep only
    that many tokens of the turn's sequence (None or 0: all). replace: drop the other
    branches. drop_previous_output: continue from the turn's prompt without its output.
    """

    id: str
    rid: str | None = None
    offset: int | None = None
    replace: bool = False
    drop_previous_output: bool = False


@dataclass
class _Turn:
    """A request of a session: parent turn rid, child rids, and once finished its full
    sequence (None while it runs) and its prompt's length."""

    parent: str | None
    children: list[str] = field(default_factory=list)
    ids: list[int] | None = None
    prompt_len: int = 0


@dataclass
class Session:
    """An open session: capacity_of_str_len (SGLang's field, recorded), timeout (seconds
    idle before it closes), last_used (clock seconds), turns by rid."""

    id: str
    capacity_of_str_len: int
    timeout: float
    last_used: float
    turns: dict[str, _Turn] = field(default_factory=dict)

    @property
    def pin_key(self) -> str:
        return f"session:{self.id}"

    def running(self) -> list[str]:
        return [rid for rid, t in self.turns.items() if t.ids is None]

    def drop(self, rid: str) -> list[str]:
        """Remove turn `rid` and its descendants; returns the removed ones still running."""
        turn = self.turns.pop(rid, None)
        if turn is None:
            return []
        if turn.parent in self.turns:
            self.turns[turn.parent].children.remove(rid)
        running = [rid] if turn.ids is None else []
        for child in list(turn.children):
            running += self.drop(child)
        return running


class SessionManager:
    """Open sessions and the requests that will pin when they finish.

    pins: the scheduler's PinTable. timeout: default idle seconds before a session (or a
    plain pin) is closed. bos_token_id: dropped from the start of an appended input.
    """

    def __init__(
        self,
        pins: PinTable,
        timeout: float,
        bos_token_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pins = pins
        self.timeout = timeout
        self.bos_token_id = bos_token_id
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self._pending: dict[str, tuple[str | None, str | None]] = {}  # rid -> (session, pin)

    # ---- sessions -----------------------------------------------------------------------

    def open(
        self, session_id: str | None, capacity_of_str_len: int = 0, timeout: float | None = None
    ) -> str:
        """Open a session (a new uuid hex id when `session_id` is None); returns its id.
        Raises InvalidRequestError (param session_id) when that id is already open."""
        sid = session_id if session_id is not None else uuid.uuid4().hex
        if sid in self.sessions:
            raise InvalidRequestError(
                f"session {sid!r} is already open", param="session_id", code="invalid_value"
            )
        t = self.timeout if timeout is None else timeout
        self.sessions[sid] = Session(sid, capacity_of_str_len, t, self.clock())
        return sid

    def close(self, session_id: str) -> list[str]:
        """Close a session and release its pin; returns its running requests' rids (the
        caller aborts them). Raises InvalidRequestError (param session_id) when unknown."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            raise InvalidRequestError(
                f"session {session_id!r} does not exist or was closed",
                param="session_id",
                code="invalid_value",
            )
        self.pins.unpin(session.pin_key)
        running = session.running()
        for rid in running:
            self._pending.pop(rid, None)
        return running

    def compose(self, rid: str, params: SessionParams, input_ids: list[int]) -> list[int]:
        """The prompt of request `rid` in its session (see the module docstring); checks
        only, records nothing. Raises InvalidRequestError for an unknown session, turn,
        or a turn still running."""
        session = self._session(params.id)
        if params.rid is None:
            return input_ids
        turn = session.turns.get(params.rid)
        if turn is None or turn.ids is None:
            state = "is still running" if turn is not None else "is not a request of it"
            raise InvalidRequestError(
                f"request {params.rid!r} of session {params.id!r} {state}",
                param="session_params.rid",
                code="invalid_value",
            )
        if input_ids and input_ids[0] == self.bos_token_id:
            input_ids = input_ids[1:]
        prev = turn.ids
        if params.drop_previous_output:
            prev = prev[: turn.prompt_len]
        if params.offset:
            prev = prev[: params.offset]
        return prev + input_ids

    def start(self, req: Req, params: SessionParams | None, pin_key: str | None) -> list[str]:
        """Record queued request `req` (its prompt from `compose`) as a turn of its session
        and/or a request to pin under `pin_key`; returns the rids `replace` dropped that
        are still running (the caller aborts them)."""
        if params is None and pin_key is None:
            return []
        dropped: list[str] = []
        if params is not None:
            session = self._session(params.id)
            if params.replace:
                if params.rid is None:
                    roots = [r for r, t in session.turns.items() if t.parent is None]
                else:
                    roots = list(session.turns[params.rid].children)
                for r in roots:
                    dropped += session.drop(r)
            session.turns[req.rid] = _Turn(params.rid)
            if params.rid is not None:
                session.turns[params.rid].children.append(req.rid)
            session.last_used = self.clock()
            self.pins.touch(session.pin_key)
        for r in dropped:
            self._pending.pop(r, None)
        self._pending[req.rid] = (None if params is None else params.id, pin_key)
        return dropped

    def finished(self, req: Req) -> None:
        """A request left the scheduler (`req.finish_reason` set, its KV released to the
        cache). A completed session turn records its sequence and moves the session's pin
        to it; a request with a pin key pins its sequence; an aborted one only leaves its
        session (no pin changes)."""
        sid, pin_key = self._pending.pop(req.rid, (None, None))
        session = self.sessions.get(sid) if sid is not None else None
        aborted = req.finish_reason is FinishReason.ABORT
        if session is not None and req.rid in session.turns:
            if aborted:
                session.drop(req.rid)
            else:
                cut = len(req.input_ids) + req.params.max_new_tokens
                turn = session.turns[req.rid]
                turn.ids, turn.prompt_len = req.all_ids[:cut], len(req.input_ids)
                session.last_used = self.clock()
                self.pins.pin(session.pin_key, req.all_ids[: req.kv_len], req.extra_key)
        if pin_key is not None and not aborted:
            self.pins.pin(pin_key, req.all_ids[: req.kv_len], req.extra_key)

    def unpin(self, key: str) -> None:
        """Release a plain pin (a stored response dropped); unknown keys are ignored."""
        self.pins.unpin(key)

    def expire(self) -> None:
        """Close sessions idle past their timeout (one with a request running is not
        idle) and release plain pins unused for the default timeout."""
        now = self.clock()
        for sid, s in list(self.sessions.items()):
            if now - s.last_used > s.timeout and not s.running():
                self.close(sid)
        session_keys = {s.pin_key for s in self.sessions.values()}
        for key in self.pins.keys():
            since = self.pins.idle_since(key)
            if key not in session_keys and since is not None and now - since > self.timeout:
                self.pins.unpin(key)

    def info(self) -> dict[str, int]:
        """Counters for /get_server_info: sessions open, pins, pinned tokens, the budget."""
        return {
            "sessions_open": len(self.sessions),
            "pins": len(self.pins),
            "pinned_tokens": self.pins.pinned_tokens(),
            "pin_budget": self.pins.budget,
            "pins_released_over_budget": self.pins.released_over_budget,
        }

    def _session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise InvalidRequestError(
                f"session {session_id!r} does not exist or was closed",
                param="session_params.id",
                code="invalid_value",
            )
        return session
