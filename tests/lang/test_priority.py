"""`priority` in the program language: set for every gen by `run(priority=...)` or for
one gen by `gen(..., priority=...)`, it reaches the scheduler as the request's priority
(Engine backend) and the /generate body's ``priority`` (RuntimeEndpoint)."""

from __future__ import annotations

import radixlm as rl
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint


@rl.function
def two_gens(s):
    s += "Hi" + rl.gen("a", max_tokens=2, priority=3)
    s += rl.gen("b", max_tokens=2)


def test_engine_backend_passes_priorities(engine_backend, monkeypatch):
    engine = engine_backend.engine
    seen: list[int] = []
    submit = engine._submit_all

    def spy(*args):
        seen.extend(o.priority for o in args[4])  # (ids, params, salt, logprobs, sched)
        return submit(*args)

    monkeypatch.setattr(engine, "_submit_all", spy)
    assert two_gens.run(backend=engine_backend, temperature=0, priority=1).error() is None
    assert seen == [3, 1]
    assert two_gens.run(backend=engine_backend, temperature=0).error() is None
    assert seen == [3, 1, 3, 0]


def test_runtime_endpoint_sends_priority(monkeypatch):
    bodies: list[dict] = []
    backend = RuntimeEndpoint.__new__(RuntimeEndpoint)

    def call(method, path, body=None):
        bodies.append(body)
        return [{"text": "x", "meta_info": {}}]

    monkeypatch.setattr(backend, "_call", call, raising=False)
    backend.request(text=["Hi"], sampling_params={"max_new_tokens": 1}, priority=2)
    backend.request(text=["Hi"], sampling_params={"max_new_tokens": 1})
    assert bodies[0]["priority"] == 2 and "priority" not in bodies[1]


def test_openai_backend_sends_priority_in_extra_body():
    from radixlm.lang.backend.openai import OpenAI
    from radixlm.lang.ir import SamplingOptions

    backend = OpenAI("m", base_url="http://127.0.0.1:9/v1")  # no request is sent
    kwargs = backend._request_kwargs(SamplingOptions(max_new_tokens=2, priority=2))
    assert kwargs["extra_body"] == {"priority": 2}
    assert "extra_body" not in backend._request_kwargs(SamplingOptions(max_new_tokens=2))
