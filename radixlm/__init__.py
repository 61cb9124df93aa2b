"""radixlm: an agent-oriented LLM serving runtime (radix-tree prefix cache, continuous batching).

Public API: `Engine` (in-process generation), `SamplingParams`, and the language
(`radixlm.lang`): `function`, `gen`, `select`, roles, `set_default_backend`, backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixlm import omp_policy as _omp_policy

# Before anything loads torch (and with it libgomp, which reads the variable once).
_omp_policy.apply_default()

__version__ = "0.1.0"
# Re-exported lazily from radixlm.lang (the names programs use as `rl.<name>`).
_LANG_NAMES = (
    "OpenAI",
    "ProgramState",
    "Runtime",
    "RuntimeEndpoint",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_server_info",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
)
__all__ = ["Engine", "SamplingParams", "__version__", *_LANG_NAMES]

if TYPE_CHECKING:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.sampling.sampler import SamplingParams


def __getattr__(name: str):
    # Lazy: `import radixlm` stays cheap (no torch) for the CLI and `radixlm plan`.
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    if name == "SamplingParams":
        from radixlm.runtime.sampling.sampler import SamplingParams

        return SamplingParams
    if name in _LANG_NAMES:
        import radixlm.lang

        return getattr(radixlm.lang, name)
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
