"""The in-process backend's driver (lang/backend/engine.py): every chunk of a step reaches
its job before the next step, and a failed step fails the jobs in flight."""

from __future__ import annotations

import threading

import pytest

LONG = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
SHORT = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
PROMPTS = ["The river", "A small town", "Mountains are"]


def _plain(backend, prompt: str, params: dict) -> list[int]:
    return backend.engine_call(lambda e: e.generate(prompt, params))["output_ids"]


def test_a_job_returns_in_the_step_that_finishes_it(engine_backend, monkeypatch):
    """Three prompts of 6 tokens beside a running 40-token call: their job returns 6 steps
    (prefill + 5 decodes) after its round starts, plus at most the step in progress when
    it was queued; not after the other call's steps drained its chunks one by one."""
    refs = [_plain(engine_backend, p, SHORT) for p in PROMPTS]
    long_ref = _plain(engine_backend, "Once upon a time", LONG)
    scheduler = engine_backend.engine.scheduler
    steps: list[int] = []
    real_step = scheduler.step

    def counted():
        steps.append(1)
        return real_step()

    monkeypatch.setattr(scheduler, "step", counted)
    started = threading.Event()
    long_out: list = []

    def long_call() -> None:
        result = engine_backend.request_stream(
            "Once upon a time", LONG, on_delta=lambda _: started.set()
        )
        long_out.append(result)

    runner = threading.Thread(target=long_call)
    runner.start()
    assert started.wait(60)
    before = len(steps)
    results = engine_backend.request(text=PROMPTS, sampling_params=SHORT)
    taken = len(steps) - before
    runner.join(60)
    assert [r["output_ids"] for r in results] == refs
    assert long_out[0]["output_ids"] == long_ref
    assert 6 <= taken <= 7


def test_a_failed_step_fails_the_jobs_in_flight(engine_backend, monkeypatch):
    runner = engine_backend.engine.runner
    real_forward = runner.forward
    calls: list[int] = []

    def broken(fb):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("kernel exploded")
        return real_forward(fb)

    monkeypatch.setattr(runner, "forward", broken)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        engine_backend.request(text=PROMPTS, sampling_params=SHORT)
    monkeypatch.undo()
    info = engine_backend.get_server_info()
    assert info["num_running"] == 0 and info["num_waiting"] == 0
    again = engine_backend.request(text=PROMPTS[:1], sampling_params=SHORT)
    assert again[0]["output_ids"] == _plain(engine_backend, PROMPTS[0], SHORT)
