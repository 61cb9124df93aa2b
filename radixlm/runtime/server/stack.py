"""Build the serving stack (config, tokenizer, model runner, scheduler) from ServerArgs.

Shared by the in-process `Engine` and the scheduler process, so both run the same code.
Request checks live in `request_checks.py`, the `/get_server_info` payload in `info.py`.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from radixlm import omp_policy
from radixlm.config import ServerArgs
from radixlm.errors import ModelNotFoundError
from radixlm.runtime.executor.model_registry import local_hf_dir, read_hf_config
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.sched.decode import DecodeStrategy, NormalDecode
from radixlm.runtime.sched.scheduler import Scheduler
from radixlm.runtime.speculative import make_speculative_decode

logger = logging.getLogger(__name__)


class ServingStack(NamedTuple):
    """A loaded model and the scheduler over it."""

    config: Any
    tokenizer: Any
    runner: ModelRunner
    scheduler: Scheduler


#: Files one of which a Hugging Face tokenizer is read from (fast tokenizer, SentencePiece
#: model, byte-level BPE vocabulary, WordPiece vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def load_tokenizer(args: ServerArgs):
    """The model's Hugging Face tokenizer (converting a GGUF model on first use).

    Raises ModelNotFoundError when the model directory holds none of `TOKENIZER_FILES`
    (transformers would otherwise build an empty tokenizer that encodes nothing)."""
    from transformers import AutoTokenizer

    hf_dir = local_hf_dir(args.model)
    if not any((hf_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{hf_dir} has no tokenizer: none of {', '.join(TOKENIZER_FILES)} is there"
        )
    return AutoTokenizer.from_pretrained(hf_dir)


def build_stack(args: ServerArgs) -> ServingStack:
    """Load config, tokenizer and weights; size the pools; create the decode strategy
    (`make_decoder`) and the scheduler.

    Sets the process's torch thread count and radixlm log level from `args`.
    Raises ModelNotFoundError / UnsupportedModelError / ValueError (see ModelRunner and
    `make_decoder`).
    """

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
    config = read_hf_config(hf_dir)
    tokenizer = load_tokenizer(args)
    runner = ModelRunner(args, hf_dir, config)
    eos = eos_token_ids(hf_dir, config)
    scheduler = Scheduler(args, runner, eos, tokenizer, decoder=make_decoder(args, runner))
    return ServingStack(config, tokenizer, runner, scheduler)


def make_decoder(args: ServerArgs, runner: ModelRunner) -> DecodeStrategy:
    """`NormalDecode`, or a `SpeculativeDecode` when --speculative-algorithm is set.

    Raises ValueError for a drafter that cannot be built (e.g. a missing draft path).
    """
    if args.speculative_algorithm is None:
        return NormalDecode()
    return make_speculative_decode(args, runner)


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
