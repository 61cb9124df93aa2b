"""The in-process backend's driver (lang/backend/engine.py): every chunk of a step reaches
its job before the next step, and a failed step fails the jobs in flight."""

from __future__ import annotations

import threading
import time

import pytest

from radixlm.lang.backend import engine as driver_module

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


def test_next_calls_after_a_step_are_prefilled_together(engine_backend, monkeypatch):
    """Four programs whose first calls finish in one step send their second calls 0-30 ms
    apart: the driver holds the next round until all four arrived (the gather windows are
    widened here so that the test does not depend on thread wake-up times)."""
    monkeypatch.setattr(engine_backend._driver, "gather_s", 0.5)
    monkeypatch.setattr(driver_module, "NEXT_CALL_GATHER_S", 0.5)
    scheduler = engine_backend.engine.scheduler
    steps: list[int] = []
    queued: dict[str, int] = {}  # request id -> steps run before it was queued
    real_step, real_add = scheduler.step, scheduler.add_request

    def step():
        steps.append(1)
        return real_step()

    def add(req, *args, **kwargs):
        queued[req.rid] = len(steps)
        return real_add(req, *args, **kwargs)

    monkeypatch.setattr(scheduler, "step", step)
    monkeypatch.setattr(scheduler, "add_request", add)
    second: dict[int, dict] = {}

    def program(i: int) -> None:
        first = engine_backend.request(text=[PROMPTS[i % 3] + f" {i}"], sampling_params=SHORT)
        time.sleep(0.01 * i)
        second[i] = engine_backend.request(
            text=[PROMPTS[i % 3] + f" {i}" + first[0]["text"]], sampling_params=SHORT
        )[0]

    engine_backend.expect_requests(4)
    threads = [threading.Thread(target=program, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    firsts = sorted(queued.values())[:4]
    seconds = sorted(queued[r["meta_info"]["id"]] for r in second.values())
    assert len(set(firsts)) == 1 and len(seconds) == 4
    assert len(set(seconds)) == 1 and seconds[0] == firsts[0] + SHORT["max_new_tokens"]
