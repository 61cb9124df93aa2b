"""Value parsers and range checks of `radixlm.config.ServerArgs` (kept apart so the
settings dataclass stays a list of fields): size flags, the SLO step prior, comma
lists, and the cross-field checks `ServerArgs.__post_init__` runs after its type checks.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.config import ServerArgs

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> tuple[int, bool]:
    """A size flag as (value, is_bytes): a plain integer is a count of tokens; a number
    with a K/M/G/T suffix (optionally followed by B or iB; powers of 1024) or a trailing
    B is bytes. Raises ValueError on anything else."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"size must be tokens (e.g. 200000) or bytes (e.g. 4G), got {text!r}")
    number, unit, suffix = m.groups()
    if not unit and not suffix:
        if "." in number:
            raise ValueError(f"a size in tokens must be an integer, got {text!r}")
        return int(number), False
    return int(float(number) * _UNITS[unit.lower()]), True


def parse_step_prior(text: str | None) -> tuple[float, float, float] | None:
    """``"a,b,c"`` (ms, ms per prefill token, ms per decoding request) -> a tuple; None ->
    None. Raises ValueError unless three finite numbers >= 0."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or not all(0 <= v < float("inf") for v in values):
        raise ValueError(f"slo_step_prior must be 'a,b,c' with three numbers >= 0, got {text!r}")
    return values  # type: ignore[return-value]


def csv_entries(value: str | None) -> list[str]:
    """The non-empty, stripped entries of a comma-separated flag value (none: [])."""
    return [e.strip() for e in (value or "").split(",") if e.strip()]


def _check_nodes(self: ServerArgs) -> None:
    """Raise ValueError for a multi-node layout that cannot run."""
    n = self.nnodes
    if n < 1 or not 0 <= self.node_rank < n:
        raise ValueError(f"need nnodes >= 1 and 0 <= node_rank < nnodes, got {n}, {self.node_rank}")
    if self.tp_size % n:
        raise ValueError(f"--nnodes {n} does not divide --tp-size {self.tp_size}")
    if n > 1 and self.dist_init_addr is None:
        raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address)")
    if self.dist_init_addr is not None:
        host, _, port = self.dist_init_addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--dist-init-addr must be HOST:PORT, got {self.dist_init_addr!r}")
    if self.dist_timeout <= 0:
        raise ValueError(f"dist_timeout must be > 0, got {self.dist_timeout}")


def check_ranges(self: ServerArgs) -> None:
    """The ranges and combinations of `ServerArgs` fields that their types cannot say
    (called by `ServerArgs.__post_init__`). Raises ValueError naming the field."""
    ps = self.page_size
    if ps < 1 or ps & (ps - 1):
        raise ValueError(f"page_size must be a positive power of two, got {ps}")
    if self.num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
    if self.tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
    _check_nodes(self)
    if self.ep_size not in (1, self.tp_size):
        raise ValueError(f"--ep-size must be 1 or --tp-size ({self.tp_size}), got {self.ep_size}")
    if self.tp_size > 1 and self.dp_size > 1:
        raise ValueError(
            "--tp-size and --dp-size cannot be combined: run data-parallel replicas of a "
            "tensor-parallel model as separate `radixlm serve --tp-size N` workers behind "
            "`radixlm router`"
        )
    if self.tp_size > 1 and self.hicache_tier is not None:
        raise ValueError(
            "--hicache-tier is not supported with --tp-size > 1 (each rank would need its "
            "own tier copy of its KV heads)"
        )
    _check_fp8_kv(self)
    if self.max_total_tokens is not None and self.max_total_tokens < ps:
        raise ValueError(f"max_total_tokens must be >= page_size, got {self.max_total_tokens}")
    if self.max_running_requests < 1 or self.max_prefill_tokens < 1:
        raise ValueError("max_running_requests and max_prefill_tokens must be >= 1")
    if self.context_length is not None and self.context_length < 2:
        raise ValueError(f"context_length must be >= 2, got {self.context_length}")
    if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
        raise ValueError(
            f"chunked_prefill_size must be >= 1 or -1, got {self.chunked_prefill_size}"
        )
    if self.cuda_graph_max_bs < 1 or self.max_queued_requests < 1:
        raise ValueError("cuda_graph_max_bs and max_queued_requests must be >= 1")
    if self.session_pin_budget is not None and self.session_pin_budget < 0:
        raise ValueError(f"session_pin_budget must be >= 0, got {self.session_pin_budget}")
    if self.session_timeout <= 0:
        raise ValueError(f"session_timeout must be > 0 (seconds), got {self.session_timeout}")
    if self.responses_store_size < 0:
        raise ValueError(f"responses_store_size must be >= 0, got {self.responses_store_size}")
    if self.schedule_fallback_queue_len < 1 or self.schedule_conservativeness <= 0:
        raise ValueError(
            "schedule_fallback_queue_len must be >= 1 and schedule_conservativeness > 0"
        )
    if not 0 <= self.port < 65536:
        raise ValueError(f"port must be in [0, 65535], got {self.port}")
    if min(self.speculative_num_steps, self.speculative_topk) < 1:
        raise ValueError("speculative_num_steps and speculative_topk must be >= 1")
    if self.speculative_num_draft_tokens < 1 or self.speculative_max_batch_size < 0:
        raise ValueError(
            "speculative_num_draft_tokens must be >= 1 and speculative_max_batch_size >= 0"
        )
    if self.speculative_algorithm in ("eagle", "draft") and not self.speculative_draft_path:
        raise ValueError(
            f"--speculative-algorithm {self.speculative_algorithm} needs --speculative-draft-path"
        )
    if any("/" in e for e in csv_entries(self.allowed_hosts)):
        raise ValueError(f"allowed_hosts are host names, got {self.allowed_hosts!r}")
    if any(e != "*" and "://" not in e for e in csv_entries(self.allow_origins)):
        raise ValueError(
            f"allow_origins are '*' or scheme://host[:port], got {self.allow_origins!r}"
        )
    if self.health_timeout < 1:
        raise ValueError(f"health_timeout must be >= 1 (seconds), got {self.health_timeout}")
    if self.request_timeout is not None and self.request_timeout <= 0:
        raise ValueError(f"request_timeout must be > 0 (seconds), got {self.request_timeout}")
    if not 0 <= self.grammar_compile_timeout <= 86400:  # also refuses nan and inf
        raise ValueError(
            "grammar_compile_timeout must be 0 (no limit) to 86400 seconds, "
            f"got {self.grammar_compile_timeout}"
        )
    if self.hicache_size is not None:
        parse_size(self.hicache_size)
    if self.hicache_tier is not None and self.disable_radix_cache:
        raise ValueError("hicache_tier needs the radix cache (drop --disable-radix-cache)")
    if self.dp_size < 1 or self.dp_balance_threshold < 0:
        raise ValueError(
            f"dp_size must be >= 1 and dp_balance_threshold >= 0, got {self.dp_size} "
            f"and {self.dp_balance_threshold}"
        )
    if self.disaggregation_mode is not None and self.dp_size != 1:
        raise ValueError("disaggregation_mode needs dp_size 1 (one scheduler per worker)")
    if self.disaggregation_timeout <= 0:
        raise ValueError(
            f"disaggregation_timeout must be > 0 (seconds), got {self.disaggregation_timeout}"
        )
    for name in ("slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(self, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be > 0 (ms), got {value}")
    parse_step_prior(self.slo_step_prior)
    if not 0 < self.mem_fraction < 1:
        raise ValueError(f"mem_fraction must be in (0, 1), got {self.mem_fraction}")


def _check_fp8_kv(self: ServerArgs) -> None:
    """An fp8 --kv-cache-dtype with what cannot take it, refused before any process
    starts: FlashInfer reads no fp8 pool, and an fp8 / int8 --hicache-tier would quantize
    the pool's 8-bit values again (with scales on top, more bytes than the pool's own).
    Raises ValueError naming both settings."""
    name = self.kv_cache_dtype
    if not name.startswith("fp8"):
        return
    if self.attention_backend == "flashinfer":
        raise ValueError(
            f"attention backend 'flashinfer' does not read an fp8 KV cache "
            f"(--kv-cache-dtype {name}); use --attention-backend triton (GPU) or the CPU "
            "backends"
        )
    if self.hicache_tier in ("fp8", "int8"):
        raise ValueError(
            f"--kv-cache-dtype {name} stores 8-bit KV already: --hicache-tier "
            f"{self.hicache_tier} would quantize it again; use --hicache-tier host or disk"
        )
