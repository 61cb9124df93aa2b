"""Build the serving stack (config, tokenizer, model runner, scheduler) from ServerArgs.

Shared by the in-process `Engine` and the scheduler process, so both run the same code:
request checks (`check_request`) and the `/get_server_info` payload (`server_info`) live
here too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

import torch

from radixlm import omp_policy
from radixlm.config import ServerArgs
from radixlm.errors import InvalidRequestError
from radixlm.runtime.executor.memory import check_fits
from radixlm.runtime.executor.model_registry import local_hf_dir
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sampling.sampler import SamplingParams
from radixlm.runtime.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)


class ServingStack(NamedTuple):
    """A loaded model and the scheduler over it."""

    config: Any
    tokenizer: Any
    runner: ModelRunner
    scheduler: Scheduler


def load_tokenizer(args: ServerArgs):
    """The model's Hugging Face tokenizer (converting a GGUF model on first use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_hf_dir(args.model))


def build_stack(args: ServerArgs) -> ServingStack:
    """Load config, tokenizer and weights; size the pools; create the scheduler.

    Sets the process's torch thread count and radixlm log level from `args`.
    Raises ModelNotFoundError / UnsupportedModelError / ValueError (see ModelRunner).
    """
    from transformers import AutoConfig

    logging.getLogger("radixlm").setLevel(args.log_level.upper())
    torch.set_num_threads(args.num_threads)
    if args.num_threads > 1 and omp_policy.spins():
        logger.warning(
            "OpenMP wait policy: %s; beside other busy processes a step can run many times "
            "slower: import radixlm before torch, or export OMP_WAIT_POLICY=PASSIVE (or "
            "GOMP_SPINCOUNT=%s) before Python starts",
            omp_policy.describe(),
            omp_policy.DEFAULTS["GOMP_SPINCOUNT"],
        )
    hf_dir = local_hf_dir(args.model)
    config = AutoConfig.from_pretrained(hf_dir)
    tokenizer = load_tokenizer(args)
    runner = ModelRunner(args, hf_dir, config)
    scheduler = Scheduler(args, runner, eos_token_ids(hf_dir, config), tokenizer)
    return ServingStack(config, tokenizer, runner, scheduler)


def eos_token_ids(hf_dir, config) -> list[int]:
    """EOS ids from the model config and its generation config (sorted, unique)."""
    from transformers import GenerationConfig

    sources = [config.eos_token_id]
    try:
        sources.append(GenerationConfig.from_pretrained(hf_dir).eos_token_id)
    except OSError:
        pass
    ids: list[int] = []
    for value in sources:
        if isinstance(value, int):
            ids.append(value)
        elif value:
            ids.extend(value)
    return sorted(set(ids))


def model_facts(stack: ServingStack) -> dict[str, int]:
    """Limits a front end needs to validate requests without the model."""
    return {
        "vocab_size": stack.config.vocab_size,
        "context_length": stack.runner.context_len,
        "max_total_tokens": stack.runner.max_total_tokens,
    }


def check_request(
    ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    context_len: int,
    max_total_tokens: int,
    page_size: int,
) -> None:
    """Reject a request that can never run.

    Raises InvalidRequestError for an empty prompt or a token id (prompt, stop_token_ids,
    logit_bias keys) outside [0, vocab_size);
    RequestTooLargeError (an InvalidRequestError) for a prompt of context_len tokens or
    more, or prompt + max_new_tokens (capped by the context) needing more KV slots than
    the whole pool holds.
    """
    if not ids:
        raise InvalidRequestError("empty prompt")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InvalidRequestError(f"token ids must be in [0, {vocab_size})")
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise InvalidRequestError(f"stop_token_ids must be in [0, {vocab_size})")
    if params.logit_bias and max(params.logit_bias) >= vocab_size:
        raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {vocab_size})")
    check_fits(
        len(ids),
        params.max_new_tokens,
        context_len=context_len,
        total_tokens=max_total_tokens,
        page_size=page_size,
    )


def server_info(args: ServerArgs, runner: ModelRunner, scheduler: Scheduler) -> dict[str, Any]:
    """Settings, KV capacity and pool counters (tokens unless stated): the payload of
    `Engine.get_server_info()` and `GET /get_server_info`. `args` echoes the settings as
    given; `resolved` says what they chose: the attention backend class (after `auto`
    and any fallback, e.g. `cpu` -> TorchNativeBackend where the C kernels cannot run)
    and the CPU weight layout (`packed`, `input-major`, or None on CUDA), its weight format
    (`gguf` or `fp32` for packed panels, else None) and how many projections it keeps as
    quantized GGUF panels (`quantized_weights`)."""
    return {
        "args": dataclasses.asdict(args),
        "resolved": {
            "device": runner.device,
            "attention_backend": type(runner.backend).__name__,
            "cpu_layout": runner.cpu_layout,
            "weight_format": runner.weight_format,
            "quantized_weights": runner.quantized_weights,
            "omp_wait_policy": omp_policy.describe(),
        },
        "kv_bytes_per_token": runner.kv_bytes_per_token,
        "max_total_tokens": runner.max_total_tokens,
        "weights_bytes": runner.weights_bytes,
        "kv_budget_bytes": runner.kv_budget_bytes,
        "page_size": args.page_size,
        "context_length": runner.context_len,
        "memory": scheduler.memory_accounting(),
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "scheduler": scheduler.stats(),
    }


def flush_cache(scheduler: Scheduler) -> tuple[bool, str]:
    """Drop every cached prefix and return its KV slots to the pool.

    Refused (False, reason) while requests run or wait: their matched prefixes are locked.
    """
    busy = len(scheduler.running) + len(scheduler.waiting) + (scheduler.chunked is not None)
    if busy:
        return False, f"cannot flush the cache while {busy} requests are running or waiting"
    tree = scheduler.tree
    tree.evict(tree.evictable_size())
    tree.reset()
    return True, "cache flushed"
