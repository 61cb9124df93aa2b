"""Server and engine settings: one frozen dataclass, every knob with its default and help.

`ServerArgs` fields become CLI flags (``max_total_tokens`` -> ``--max-total-tokens``) via
`add_cli_args` / `from_cli_args`, so the CLI, `radixlm.Engine(**kwargs)` and the server
share one source of truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from radixlm.config_checks import (  # noqa: F401 - re-exported for callers
    check_ranges,
    csv_entries,
    parse_size,
    parse_step_prior,
)


def cache_dir() -> Path:
    """radixlm's cache root (converted weights, compiled CPU kernels): ``$RADIXLM_CACHE_DIR``
    or ``~/.cache/radixlm``."""
    return Path(os.environ.get("RADIXLM_CACHE_DIR") or Path.home() / ".cache" / "radixlm")


def _opt(default, help: str, **extra):  # noqa: A002 - mirrors argparse's keyword
    return field(default=default, metadata={"help": help, **extra})


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "int | None": (int, type(None)),
    "str | None": (str, type(None)),
    "float": (float, int),
    "float | None": (float, int, type(None)),
    "bool": (bool,),
}


#: ServerArgs fields that only the HTTP server reads (`radixlm generate` has no flags for them).
HTTP_ONLY_FIELDS = (
    "host",
    "port",
    "api_key",
    "allowed_hosts",
    "allow_origins",
    "served_model_name",
    "health_timeout",
    "request_timeout",
    "allow_special_tokens_in_content",
    "strict_request_fields",
    "responses_store_size",
    "tool_call_parser",
    "reasoning_parser",
    "dp_size",
    "dp_policy",
    "dp_balance_threshold",
)


@dataclass(frozen=True)
class ServerArgs:
    """Every setting of the engine. Units: tokens unless stated."""

    model: str = _opt(
        "smollm2-135m",
        "model alias (smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m), local Hugging Face "
        "directory, or .gguf file, of a supported family (docs/models.md)",
    )
    dtype: str = _opt(
        "float32", "weights and activations dtype", choices=["float32", "bfloat16", "float16"]
    )
    kv_cache_dtype: str = _opt(
        "auto",
        "KV cache dtype ('auto' = the model dtype); on CPU the C kernels serve float32, "
        "float16 and fp8 pools (attention computed in fp32), bfloat16 falls back to "
        "torch_native attention; fp8_e4m3 / fp8_e5m2: one byte a value with per-layer "
        "scales from the checkpoint, else 1.0 (cpu, torch_native, triton backends; "
        "docs/quant-kv.md)",
        choices=["auto", "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2"],
    )
    device: str = _opt(
        "auto",
        "torch device ('auto' = cuda when available, else cpu)",
        choices=["auto", "cpu", "cuda"],
    )
    num_threads: int = _opt(
        1,
        "torch compute threads per process (more than the free cores is slower; beside "
        "other busy processes 1 is as fast as 2 on a 2-core machine; threads wait at "
        "barriers by radixlm's short-spin policy unless OMP_WAIT_POLICY or GOMP_SPINCOUNT "
        "is set, see docs/perf-notes.md)",
    )
    tp_size: int = _opt(
        1,
        "tensor-parallel ranks: worker processes joined by torch.distributed (gloo on CPU, "
        "NCCL on CUDA, one GPU each), each holding 1/N of the attention heads, MLP columns "
        "and vocabulary; rank 0 schedules (docs/parallelism.md)",
    )
    ep_size: int = _opt(
        1,
        "expert parallelism for MoE models: 1 (every expert split over the --tp-size ranks) "
        "or --tp-size (each rank holds num_experts / N whole routed experts)",
    )
    nnodes: int = _opt(
        1,
        "machines the --tp-size ranks span (each runs tp_size / nnodes of them; node 0 serves "
        "HTTP and schedules)",
    )
    node_rank: int = _opt(
        0, "this machine's node index in [0, nnodes): node r runs ranks r * tp_size / nnodes.."
    )
    dist_init_addr: str | None = _opt(
        None,
        "HOST:PORT where the ranks meet (node 0's address, the same on every node; needed "
        "with --nnodes > 1; default a free loopback port)",
    )
    dist_timeout: float = _opt(
        120.0, "seconds to wait for every rank to reach --dist-init-addr and join the group"
    )
    page_size: int = _opt(1, "tokens per KV page (a power of two)")
    max_total_tokens: int | None = _opt(
        None, "KV pool size in tokens (none: sized from --mem-fraction)"
    )
    mem_fraction: float = _opt(
        0.25, "fraction of available memory for weights + KV pool when --max-total-tokens is unset"
    )
    max_running_requests: int = _opt(
        64, "maximum concurrently running requests (rows of the request-to-token table)"
    )
    max_prefill_tokens: int = _opt(
        8192,
        "maximum new (uncached) prompt tokens per extend step (a single longer prompt "
        "still runs alone in one step)",
    )
    context_length: int | None = _opt(
        None, "maximum tokens per request (none: the model's max positions)"
    )
    attention_backend: str = _opt(
        "auto",
        "attention backend ('auto' = flashinfer on CUDA when installed, else triton on CUDA; "
        "cpu on CPU: radixlm's C decode attention, KV store and (head_dim a multiple of 16) "
        "prefill attention, torch_native for the rest; it is torch_native altogether for "
        "KV pools other than float32 / float16, head_dim not a multiple of 8, query heads "
        "not a multiple of KV heads, or without a C compiler; torch_native = the torch "
        "reference; get_server_info's 'resolved' says which ran)",
        choices=["auto", "cpu", "torch_native", "triton", "flashinfer"],
    )
    cpu_gemm: str = _opt(
        "auto",
        "CPU fp32 weights: 'auto' = radixlm's C kernels (built with the system C compiler on "
        "first use; need AVX2/FMA): packed-panel GEMM, C RMSNorm/SwiGLU/RoPE, and all the "
        "decoder layers of a decode step in one C call; falls back to torch where they cannot "
        "be built. 'torch' = torch's GEMM (MKL) and ops (the attention backend is chosen "
        "separately)",
        choices=["auto", "torch"],
    )
    weight_format: str = _opt(
        "auto",
        "CPU packed weights of a .gguf model (the smollm2-135m alias is one): 'gguf' keeps "
        "its Q4_1 / Q8_0 tensors as quantized panels (0.625 / 1.0625 bytes per weight "
        "instead of 4: the file's exact values, computed in fp32, the same tokens as "
        "'fp32'; a decode step streams a sixth of the bytes); other tensors and block types "
        "stay fp32. A quantized checkpoint directory (compressed-tensors, GPTQ, AWQ; "
        "docs/quant-weights.md) keeps its int4 / int8 / fp8 weights packed the same way. "
        "'fp32' = dequantize every weight. 'auto' = the file's quantized format where "
        "radixlm's CPU kernels run (--cpu-gemm auto) and --dtype is float32, else fp32",
        choices=["auto", "fp32", "gguf"],
    )
    disable_lm_head_screen: bool = _opt(
        False,
        "CPU packed fp32 LM head: do not keep its half-size copy (vocab x hidden x 2 bytes). "
        "With it, decode batches of up to 16 requests (AVX-512 BF16) or 4 (other CPUs) that "
        "only take the argmax (greedy, no penalties, logit bias, logprobs or grammar) read "
        "the copy and compute exact fp32 logits only where an error bound allows the argmax: "
        "the same tokens, half the head's bytes",
    )
    disable_cuda_graph: bool = _opt(False, "run decode without CUDA graphs (graphs are CUDA-only)")
    cuda_graph_max_bs: int = _opt(256, "largest decode batch captured in a CUDA graph")
    schedule_policy: str = _opt(
        "lpm",
        "order of the waiting queue: lpm (longest prefix match), dfs-weight, fcfs, "
        "lof (longest output first), random",
        choices=["lpm", "dfs-weight", "fcfs", "lof", "random"],
    )
    schedule_fallback_queue_len: int = _opt(
        128, "cache-aware policies (lpm, dfs-weight) fall back to fcfs above this queue length"
    )
    schedule_conservativeness: float = _opt(
        1.0, "scales the estimated new-token reservation for running decodes (higher = safer)"
    )
    chunked_prefill_size: int = _opt(
        512, "prompt tokens prefilled per step for one request (-1 disables chunking)"
    )
    slo_ttft_ms: float | None = _opt(
        None,
        "time-to-first-token target, ms: turns on SLO-aware scheduling (docs/slo.md); "
        "requests may set their own with slo_ttft_ms",
    )
    slo_tpot_ms: float | None = _opt(
        None,
        "time-per-output-token target, ms: with it each step's prefill budget is the largest "
        "chunk that keeps running requests within it (replaces --chunked-prefill-size); "
        "requests may set their own with slo_tpot_ms",
    )
    slo_admission: str = _opt(
        "queue",
        "a request whose TTFT target the queue cannot meet: queue (with a warning) or reject "
        "(HTTP 429 with Retry-After)",
        choices=["queue", "reject"],
    )
    slo_step_prior: str | None = _opt(
        None,
        "step-time model before any step is measured, 'a,b,c': ms per step, per prefill "
        "token, per decoding request (none: the planner's roofline for the model when "
        "`radixlm serve` can compute it, else the first measured steps)",
    )
    enable_mixed_chunk: bool = _opt(
        True,
        "run a prefill chunk and the running decodes in the same forward (the decodes ride "
        "in the extend step's weight pass instead of a decode step of their own; "
        "--no-enable-mixed-chunk runs a decode step after every extend step)",
    )
    disable_jump_forward: bool = _opt(
        False,
        "turn off jump-forward decoding of grammar-constrained requests (on: text the "
        "grammar forces is drafted as tokens and verified in one forward, giving exactly "
        "the tokens of token-by-token decoding in fewer forwards; docs/serving.md)",
    )
    grammar_compile_timeout: float = _opt(
        60.0,
        "seconds a request waits for its grammar (JSON schema, regex, EBNF) to compile "
        "before it is refused (HTTP 400, code grammar_compile_timeout); 0-86400, 0: no limit",
    )
    max_queued_requests: int = _opt(
        4096,
        "requests allowed to wait beyond the free running rows; more are refused (HTTP 503)",
    )
    disable_radix_cache: bool = _opt(
        False, "use no prefix cache (every prompt is prefilled in full)"
    )
    hicache_tier: str | None = _opt(
        None,
        "second KV tier that keeps prefixes evicted from the KV pool and loads them back "
        "(docs/hicache.md): host (host memory; for a CUDA pool), disk (a memory-mapped "
        "file in --hicache-dir), fp8 or int8 (host memory, 8-bit values with per-row "
        "scales: lossy, a quarter of an fp32 pool's bytes per token); none: evicted "
        "prefixes are dropped",
        choices=["host", "disk", "fp8", "int8"],
    )
    hicache_size: str | None = _opt(
        None,
        "second tier size: tokens (e.g. 200000) or bytes with a K/M/G/T suffix (e.g. 8G; "
        "powers of 1024); none: twice the KV pool's tokens",
    )
    hicache_write_policy: str = _opt(
        "write_through",
        "when the second tier gets a prefix's KV: write_through (as soon as it is cached; "
        "eviction then only drops the primary copy) or write_back (when it is evicted)",
        choices=["write_through", "write_back"],
    )
    hicache_dir: str | None = _opt(
        None, "directory of the disk tier's file (none: <cache dir>/hicache)"
    )
    random_seed: int = _opt(
        0, "seed of the generator that seeds sampled requests without their own seed"
    )
    log_level: str = _opt("info", "logging level", choices=["debug", "info", "warning", "error"])
    host: str = _opt("127.0.0.1", "HTTP server bind address")
    port: int = _opt(30000, "HTTP server port")
    api_key: str | None = _opt(
        None, "when set, requests must send 'Authorization: Bearer <key>' (else HTTP 401)"
    )
    allowed_hosts: str | None = _opt(
        None,
        "comma-separated Host header names the HTTP server answers besides --host, localhost, "
        "127.0.0.1 and ::1 (ports are not compared; '*': any); others get HTTP 400. Binding "
        "all interfaces (0.0.0.0 or ::) answers any Host unless this is set",
    )
    allow_origins: str | None = _opt(
        None,
        "comma-separated browser origins allowed cross-origin requests (CORS), e.g. "
        "'http://localhost:3000'; '*': any (none: CORS off, cross-origin POSTs get HTTP 403)",
    )
    health_timeout: float = _opt(
        5.0,
        "seconds without a heartbeat from the scheduler or detokenizer process (they beat "
        "every 0.5 s, also during long steps) after which GET /health answers 503 (>= 1)",
    )
    request_timeout: float | None = _opt(
        None,
        "seconds a request may wait and run in all; a longer one is aborted (its KV freed) "
        "and answered 504 request_timeout (none: no limit)",
    )
    dp_size: int = _opt(
        1,
        "data-parallel replicas: scheduler processes behind the one HTTP front end, each "
        "with its own radix cache and KV pool (--max-total-tokens each) and --num-threads / "
        "dp-size torch threads (at least 1); docs/scale-out.md",
    )
    dp_policy: str = _opt(
        "cache_aware",
        "how a request picks its replica with --dp-size > 1: the longest cached prefix "
        "unless loads are imbalanced (cache_aware), in turn, or the fewest in flight",
        choices=["cache_aware", "round_robin", "least_load"],
    )
    dp_balance_threshold: int = _opt(
        4,
        "cache_aware: requests in flight by which the busiest replica may exceed the idlest "
        "before a request goes to the idlest regardless of its prefix (>= 0)",
    )
    disaggregation_mode: str | None = _opt(
        None,
        "prefill/decode disaggregation role (none: prefill and decode here): a prefill "
        "server sends each bootstrapped request's prompt KV to a decode server, which "
        "decodes it; docs/scale-out.md",
        choices=["prefill", "decode"],
    )
    disaggregation_bootstrap_port: int = _opt(
        8998,
        "decode mode: the port of the KV transfer bootstrap store (torch.distributed "
        "TCPStore; 0: a free port, shown under `disaggregation` in /get_server_info)",
    )
    disaggregation_timeout: float = _opt(
        30.0,
        "seconds a KV transfer step may take, and a decode request may wait for its KV, "
        "before the request fails (> 0)",
    )
    speculative_algorithm: str | None = _opt(
        None,
        "speculative decoding drafter (none: off); see runtime/speculative/",
        choices=["eagle", "ngram", "draft"],
    )
    speculative_num_steps: int = _opt(4, "draft tree depth (draft tokens along one path)")
    speculative_topk: int = _opt(1, "draft tree width: children kept per level (1 = a chain)")
    speculative_num_draft_tokens: int = _opt(
        4, "draft tokens verified per request and step at most (tree nodes, root excluded)"
    )
    speculative_draft_path: str | None = _opt(
        None, "draft model (draft: a model like --model) or EAGLE head directory (eagle)"
    )
    speculative_budget: str = _opt(
        "goodput",
        "draft tokens per request: goodput (those whose estimated acceptance pays for their "
        "measured verify cost) or fixed (up to --speculative-num-draft-tokens each)",
        choices=["goodput", "fixed"],
    )
    speculative_max_batch_size: int = _opt(
        16,
        "running requests above which decode steps run without speculation (a verify "
        "step costs more than a plain step at large batches on CPU, see docs/speculative.md)",
    )
    served_model_name: str | None = _opt(
        None, "model name reported by /v1/models and accepted in requests (none: --model)"
    )
    allow_special_tokens_in_content: bool = _opt(
        False,
        "tokenize special-token text inside chat messages (contents, tool calls, tools) as "
        "special tokens, as the chat template's own markers are; for trusted clients only "
        "(off: such text is ordinary text, so a message cannot forge a turn)",
    )
    strict_request_fields: bool = _opt(
        False,
        "refuse request fields radixlm does not know (HTTP 400 unknown_parameter) on "
        "/v1/completions, /v1/chat/completions and /generate; off: they are ignored with "
        "one warning per request, as vLLM and SGLang do",
    )
    responses_store_size: int = _opt(
        1024,
        "responses kept in memory for GET /v1/responses/{id} and previous_response_id "
        "(least recently used dropped first; 0: nothing is stored)",
    )
    session_pin_budget: int | None = _opt(
        None,
        "tokens of KV that open sessions and stored responses may pin in the radix cache "
        "(never evicted while pinned; past the budget the least recently used pin is "
        "released; none: a quarter of the KV pool; 0: no pinning)",
    )
    session_timeout: float = _opt(
        600.0,
        "seconds a session (open_session) or a stored response's pin may stay unused "
        "before it is closed and its pinned prefix released",
    )
    tool_call_parser: str = _opt(
        "auto",
        "how chat output is parsed into tool calls: auto (detected from the chat template; "
        "hermes when it shows no known convention), hermes, llama3, mistral, deepseek or "
        "pythonic (see docs/serving.md)",
        choices=["auto", "hermes", "llama3", "mistral", "deepseek", "pythonic"],
    )
    reasoning_parser: str = _opt(
        "none",
        "split <think>...</think> reasoning out of chat content into reasoning_content: "
        "none, deepseek-r1 (the output starts inside the reasoning) or qwen3",
        choices=["none", "deepseek-r1", "qwen3"],
    )

    def __post_init__(self) -> None:
        """Check types and ranges. Raises ValueError with the field name and allowed values."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            allowed = _FIELD_TYPES[str(f.type)]
            if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
                raise ValueError(f"{f.name} must be {str(f.type)}, got {value!r}")
            choices = f.metadata.get("choices")
            if choices and value is not None and value not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")
        check_ranges(self)

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
        """Add one ``--flag`` per field to `parser`, but for the fields named in `exclude`
        (`from_cli_args` gives those their defaults)."""
        for f in dataclasses.fields(cls):
            if f.name in exclude:
                continue
            flag = "--" + f.name.replace("_", "-")
            meta = dict(f.metadata)
            default = "none" if f.default is None else f.default
            help_text = f"{meta.pop('help')} (default: {default})"
            if f.type in ("bool", bool):
                # a field that defaults to True is turned off by its --no- form
                action = argparse.BooleanOptionalAction if f.default else "store_true"
                parser.add_argument(flag, action=action, default=f.default, help=help_text)
            else:
                kind = {"int | None": int, "int": int, "float": float, "float | None": float}.get(
                    str(f.type), str
                )
                parser.add_argument(flag, type=kind, default=f.default, help=help_text, **meta)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        """Build from a namespace produced by a parser set up with `add_cli_args`."""
        fields = dataclasses.fields(cls)
        return cls(**{f.name: getattr(args, f.name) for f in fields if hasattr(args, f.name)})
