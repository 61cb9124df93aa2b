"""The engine, in rooms; each subpackage holds one concern and imports only those below it.

- `engine`: `Engine`, the in-process entry point (same scheduler and detokenizer, no HTTP).
- `server/`: the processes around the scheduler: tokenizer manager, detokenizer, process
  launch, IPC sockets and the cross-process messages, building the serving stack.
- `speculative/`: drafters (n-gram, draft model, EAGLE) and tree verification: a decode
  strategy handed to the scheduler.
- `sched/`: the scheduler and the state only it changes: requests, admission, retraction,
  the KV ledger, stop conditions, the plain decode strategy.
- `sampling/`: sampling parameters, the sampler, penalties, seeded draws, logprobs,
  grammar masks.
- `executor/`: the model runner, memory pools, `models/` (one module per family, by
  registry), weight loading, the model registry, CUDA graphs, forward-batch construction.

Layer order (checked by import-linter, see pyproject.toml): engine and server above
speculative, above sched, above sampling and executor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.executor.model_registry import (
        MODEL_ALIASES,
        load_hf_config,
        local_hf_dir,
        resolve_model_path,
    )
    from radixlm.runtime.sampling.sampler import SamplingParams

#: The runtime's public API: what `lang`, `bench`, `plan` and user code may import (from
#: `radixlm.runtime`), loaded on first use so that importing the package stays cheap.
_PUBLIC = {
    "Engine": "radixlm.runtime.engine",
    "SamplingParams": "radixlm.runtime.sampling.sampler",
    "MODEL_ALIASES": "radixlm.runtime.executor.model_registry",
    "load_hf_config": "radixlm.runtime.executor.model_registry",
    "local_hf_dir": "radixlm.runtime.executor.model_registry",
    "resolve_model_path": "radixlm.runtime.executor.model_registry",
}
__all__ = [
    "MODEL_ALIASES",
    "Engine",
    "SamplingParams",
    "load_hf_config",
    "local_hf_dir",
    "resolve_model_path",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'radixlm.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
