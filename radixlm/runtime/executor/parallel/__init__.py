"""Tensor parallelism's plumbing: the process group (`group`), each step's batch sent from
rank 0 to the other ranks (`step_broadcast`), and the per-parameter shard specs the weight
loader slices by (`shards`). The sharded layers are `executor/layers/tensor_parallel.py`;
the worker processes are started by `runtime/server/tp_ranks.py`."""
