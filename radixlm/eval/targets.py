"""Where the evaluation's requests run: an in-process `radixlm.Engine` (one configuration's
engine at a time, closed before the next loads, to bound memory) or a running
`radixlm serve` reached over HTTP (its SGLang-native ``POST /generate``).

A request is a dict of ``POST /generate``'s body fields: ``input_ids`` (list[int]),
``sampling_params`` (dict), ``return_logprob``, ``logprob_start_len``,
``top_logprobs_num``; a result has ``text``, ``output_ids`` and ``meta_info`` (with the
logprob lists of `runtime/server/meta_info.py` when asked).
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from radixlm.eval.configs import EvalConfig

_LOGPROB_FIELDS = {"return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0}


class Target(Protocol):
    """Runs requests of one configuration."""

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One result per request, in order."""

    def info(self) -> dict[str, Any]:
        """``get_server_info``'s dict (weights_bytes, kv_bytes_per_token, resolved...)."""

    def close(self) -> None:
        """Release the engine or the HTTP client."""


class EngineTarget:
    """An in-process `radixlm.Engine` built from the configuration's engine args; every
    request of a `run` call is submitted at once (continuous batching decodes them
    together).

    Raises (at construction): whatever `radixlm.Engine` raises for the configuration
    (ModelNotFoundError, ValueError for an unsupported setting...)."""

    def __init__(self, config: EvalConfig):
        from radixlm.runtime import Engine

        self.engine = Engine(**config.engine_args)

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not requests:
            return []
        opts = {k: [r.get(k, d) for r in requests] for k, d in _LOGPROB_FIELDS.items()}
        return self.engine.generate(
            input_ids=[r["input_ids"] for r in requests],
            sampling_params=[r["sampling_params"] for r in requests],
            **opts,
        )

    def info(self) -> dict[str, Any]:
        return self.engine.get_server_info()

    def close(self) -> None:
        self.engine.shutdown()


class HTTPTarget:
    """A running `radixlm serve` (or any server with SGLang's ``/generate`` and
    ``/get_server_info``); requests go one at a time.

    Raises (from `run` / `info`): httpx.HTTPError when the server is unreachable or
    answers with an error status."""

    def __init__(self, config: EvalConfig, timeout_s: float = 600.0):
        self.url = config.url
        self.client = httpx.Client(timeout=timeout_s)

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for r in requests:
            resp = self.client.post(f"{self.url}/generate", json=r)
            resp.raise_for_status()
            out.append(resp.json())
        return out

    def info(self) -> dict[str, Any]:
        resp = self.client.get(f"{self.url}/get_server_info")
        resp.raise_for_status()
        return resp.json()

    def close(self) -> None:
        self.client.close()


def open_target(config: EvalConfig) -> Target:
    """The target of `config`: HTTP for a URL, else an in-process engine."""
    return HTTPTarget(config) if config.url else EngineTarget(config)
