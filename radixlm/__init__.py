"""radixlm: an agent-oriented LLM serving runtime (radix-tree prefix cache, continuous batching).

Public API: `Engine` (in-process generation) and `SamplingParams`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Engine", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.sampling import SamplingParams


def __getattr__(name: str):
    # Lazy: `import radixlm` stays cheap (no torch) for the CLI and `radixlm plan`.
    if name == "Engine":
        from radixlm.runtime.engine import Engine

        return Engine
    if name == "SamplingParams":
        from radixlm.runtime.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'radixlm' has no attribute {name!r}")
