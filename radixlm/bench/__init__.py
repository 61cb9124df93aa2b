"""Serving benchmark client and workloads (`radixlm bench`).

Public API: workloads (`random_workload`, `shared_prefix_workload`,
`multi_turn_workload`, `sharegpt_workload`), backends (`make_backend`: 'radixlm' native
/generate, 'openai' /v1/completions), `run_workload` / `run` (Poisson rate or
concurrency cap), `summarize` (throughput, TTFT/TPOT/ITL/e2e percentiles, cache hit
rate, goodput) and the sweep analysis (`radixlm.bench.sweep`). The command line checks
its flags (`radixlm.bench.flags`), the server and a local tokenizer
(`radixlm.bench.preflight`) before it sends a request.
"""

from radixlm.bench.backends import Backend, make_backend
from radixlm.bench.runner import run, run_workload
from radixlm.bench.stats import RequestResult, format_summary, summarize
from radixlm.bench.workloads import (
    Session,
    Turn,
    multi_turn_workload,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
)

__all__ = [
    "Backend",
    "RequestResult",
    "Session",
    "Turn",
    "format_summary",
    "make_backend",
    "multi_turn_workload",
    "random_workload",
    "run",
    "run_workload",
    "sharegpt_workload",
    "shared_prefix_workload",
    "summarize",
]
