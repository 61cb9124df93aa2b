"""/generate's bootstrap fields (SGLang's names) for prefill/decode disaggregation.

The router (router_pd.py) sends each disaggregated request twice: to a prefill worker
with ``bootstrap_host``, ``bootstrap_port`` (the decode worker's KV bootstrap address)
and ``bootstrap_room``, and to a decode worker with the same ``bootstrap_room``
(runtime/disagg/ does the rest).
"""

from __future__ import annotations

from radixlm.frontend.errors import invalid_request
from radixlm.frontend.protocol import GenerateRequest
from radixlm.runtime.server.messages import DisaggParams


def disagg_params(req: GenerateRequest, prompts: int) -> DisaggParams | None:
    """The request's `DisaggParams` (None without ``bootstrap_room``). Raises APIError 400
    (param bootstrap_room) for more than one prompt, or a host without a port or room."""
    if req.bootstrap_room is None:
        if req.bootstrap_host is not None or req.bootstrap_port is not None:
            raise invalid_request(
                "bootstrap_host and bootstrap_port need bootstrap_room", param="bootstrap_room"
            )
        return None
    if prompts != 1:
        raise invalid_request("bootstrap_room takes one prompt with n = 1", param="bootstrap_room")
    if (req.bootstrap_host is None) != (req.bootstrap_port is None):
        raise invalid_request(
            "bootstrap_host and bootstrap_port go together", param="bootstrap_port"
        )
    return DisaggParams(
        bootstrap_room=req.bootstrap_room,
        bootstrap_host=req.bootstrap_host,
        bootstrap_port=req.bootstrap_port,
    )
