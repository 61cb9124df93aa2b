"""SGLang's session routes: POST /open_session, POST /close_session, and the
``session_params`` of /generate (the scheduler side: runtime/sched/sessions.py).

- /open_session ``{"capacity_of_str_len": int, "session_id"?: str, "timeout"?: seconds}``
  answers the session id as a JSON string, as SGLang does (a new uuid hex id when none is
  given); an id already open is 400 (param session_id; SGLang answers 400 too).
- /close_session ``{"session_id": str}`` answers 200 with an empty body, as SGLang does;
  an unknown or closed id is 400 (param session_id), where SGLang only logs a warning.
- /generate with ``session_params`` runs one prompt as a turn of the session; its
  ``meta_info.id`` is the request id the next turn names in ``session_params.rid``. An
  unknown or closed session is 400 with param ``session_params.id``, an unknown turn or
  one still running 400 with ``session_params.rid`` (SGLang aborts such a request).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response
from pydantic import Field

from radixlm.frontend.errors import invalid_request
from radixlm.frontend.protocol import GenerateRequest, _Strict, check_supported
from radixlm.runtime.sched.sessions import SessionParams


class OpenSessionRequest(_Strict):
    """SGLang's OpenSessionReqInput: capacity_of_str_len (recorded, not enforced),
    session_id (None: generated), timeout (idle seconds; None: --session-timeout)."""

    capacity_of_str_len: int = Field(ge=0, le=2**53)
    session_id: str | None = Field(None, min_length=1, max_length=256)
    timeout: float | None = Field(None, gt=0, le=10**9)


class CloseSessionRequest(_Strict):
    """SGLang's CloseSessionReqInput."""

    session_id: str = Field(min_length=1)


class SessionServing:
    """The session routes over a TokenizerManager `tm`."""

    def __init__(self, tm):
        self.tm = tm
        self.strict_fields = tm.args.strict_request_fields

    async def open(self, body: bytes) -> Response:
        """POST /open_session. Raises pydantic ValidationError / InvalidRequestError (400)."""
        req = OpenSessionRequest.model_validate_json(body)
        check_supported(req, self.strict_fields)
        sid = await self.tm.open_session(req.session_id, req.capacity_of_str_len, req.timeout)
        return JSONResponse(sid)

    async def close(self, body: bytes) -> Response:
        """POST /close_session. Raises pydantic ValidationError / InvalidRequestError (400)."""
        req = CloseSessionRequest.model_validate_json(body)
        check_supported(req, self.strict_fields)
        await self.tm.close_session(req.session_id)
        return Response(status_code=200)


def session_params(req: GenerateRequest, prompts: int) -> SessionParams | None:
    """The runtime SessionParams of a /generate request (None without session_params).
    Raises APIError 400 (param session_params) when it runs more than one prompt."""
    p = req.session_params
    if p is None:
        return None
    if prompts != 1:
        raise invalid_request("session_params takes one prompt with n = 1", param="session_params")
    return SessionParams(
        id=p.id,
        rid=p.rid,
        offset=p.offset,
        replace=bool(p.replace),
        drop_previous_output=bool(p.drop_previous_output),
    )
