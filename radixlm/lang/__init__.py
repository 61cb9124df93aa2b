"""The radixlm language: multi-call, branching programs that run as cache-friendly requests.

    import radixlm as rl

    @rl.function
    def qa(s, question):
        s += rl.system("You are a helpful assistant.")
        s += rl.user(question)
        s += rl.assistant(rl.gen("answer", max_tokens=64))

    rl.set_default_backend(rl.Engine(model="smollm2-135m"))  # or rl.RuntimeEndpoint(url)
    print(qa.run(question="What is 2 + 2?", temperature=0)["answer"])

Programs written for SGLang's frontend language run unchanged with ``import radixlm as
rl`` in place of ``import sglang as sgl``.
"""

from __future__ import annotations

from radixlm.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixlm.lang.backend.base import Backend, UnsupportedByBackendError
from radixlm.lang.backend.engine import EngineBackend
from radixlm.lang.backend.openai import OpenAI
from radixlm.lang.backend.runtime import Runtime
from radixlm.lang.backend.runtime_endpoint import RuntimeEndpoint
from radixlm.lang.chat_template import ChatTemplate
from radixlm.lang.program import Program, function, get_default_backend, set_default_backend
from radixlm.lang.state import ProgramState, ProgramStateGroup

__all__ = [
    "Backend",
    "ChatTemplate",
    "EngineBackend",
    "OpenAI",
    "Program",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "UnsupportedByBackendError",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_default_backend",
    "get_server_info",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
]
