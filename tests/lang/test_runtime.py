"""`rl.Runtime` (SGLang's `sgl.Runtime`): a program run on a server the Runtime starts
itself equals the same program on the in-process Engine; the server goes away on
shutdown; a bad flag is a ServerError carrying the server's message."""

from __future__ import annotations

import pytest

import radixlm as rl
from radixlm.errors import ServerError
from radixlm.lang.backend.runtime import serve_flags
from tests.lang.test_backends import GREEDY, multi_turn


def test_serve_flags():
    options = {"max_total_tokens": 8192, "disable_radix_cache": True, "x": False, "y": None}
    assert serve_flags(options) == ["--max-total-tokens", "8192", "--disable-radix-cache"]


def test_a_program_on_a_runtime_equals_the_engine(engine_backend):
    runtime = rl.Runtime(model_path="smollm2-135m", max_total_tokens=4096, num_threads=1)
    try:
        rl.set_default_backend(runtime)
        st = multi_turn.run(questions=["Name a fruit."], **GREEDY)
        ref = multi_turn.run(questions=["Name a fruit."], backend=engine_backend, **GREEDY)
        assert st["a0"] == ref["a0"] and st["a0"]
        proc = runtime._proc
    finally:
        runtime.shutdown()
        rl.set_default_backend(None)
    assert proc.poll() is not None  # the server is gone
    runtime.shutdown()  # idempotent


def test_a_bad_flag_is_a_server_error():
    with pytest.raises(ServerError, match="--no-such-flag"):
        rl.Runtime(model_path="smollm2-135m", no_such_flag=3)
