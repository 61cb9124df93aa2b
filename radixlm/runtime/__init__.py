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
