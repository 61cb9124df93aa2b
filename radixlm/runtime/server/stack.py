"""Build the serving stack (config, tokenizer, model runner, scheduler) from ServerArgs.

Shared by the in-process `Engine` and the scheduler process, so both run the same code.
Request checks live in `request_checks.py`, the `/get_server_info` payload in `info.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from radixlm import omp_policy
from radixlm.config import ServerArgs
from radixlm.errors import ModelNotFoundError
from radixlm.runtime.executor.model_registry import local_hf_dir, read_hf_config
from radixlm.runtime.executor.model_runner import ModelRunner
from radixlm.runtime.executor.parallel.group import RankFailedError
from radixlm.runtime.sched.decode import DecodeStrategy, NormalDecode
from radixlm.runtime.sched.scheduler import Scheduler
from radixlm.runtime.server.tp_ranks import TensorParallelRanks
from radixlm.runtime.speculative import make_speculative_decode

logger = logging.getLogger(__name__)


class ServingStack(NamedTuple):
    """A loaded model and the scheduler over it."""

    config: Any
    tokenizer: Any
    runner: ModelRunner
    scheduler: Scheduler
    #: The other tensor-parallel ranks (None at --tp-size 1); `close()` stops them.
    ranks: TensorParallelRanks | None = None

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (no-op without them; idempotent)."""
        if self.ranks is not None:
            self.ranks.stop()


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


def build_stack(
    args: ServerArgs, on_rank_failure: Callable[[str], None] | None = None
) -> ServingStack:
    """Load config, tokenizer and weights; size the pools; create the decode strategy
    (`make_decoder`) and the scheduler. With `--tp-size N > 1` this process is rank 0 and
    starts ranks 1..N-1 (`TensorParallelRanks`; `on_rank_failure(message)` is called from
    a watchdog thread when one dies while serving).

    Sets the process's torch thread count and radixlm log level from `args`.
    Raises ModelNotFoundError / UnsupportedModelError / ValueError (see ModelRunner,
    `make_decoder` and `tp_ranks.check_args`), RankFailedError naming a rank that failed
    to start.
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
    if args.tp_size == 1:
        runner = ModelRunner(args, hf_dir, config)
        eos = eos_token_ids(hf_dir, config)
        scheduler = Scheduler(args, runner, eos, tokenizer, decoder=make_decoder(args, runner))
        return ServingStack(config, tokenizer, runner, scheduler)
    ranks = TensorParallelRanks.start(args, config)  # checks the split before it spawns
    try:
        runner = _rank0_runner(args, hf_dir, config, ranks)
        ranks.wait_ready()
        eos = eos_token_ids(hf_dir, config)
        scheduler = Scheduler(args, runner, eos, tokenizer, decoder=make_decoder(args, runner))
    except BaseException:
        ranks.abort()
        raise
    ranks.set_on_failure(on_rank_failure)
    return ServingStack(config, tokenizer, runner, scheduler, ranks)


def _rank0_runner(args: ServerArgs, hf_dir, config, ranks: TensorParallelRanks) -> ModelRunner:
    """Rank 0's shard. Raises RankFailedError naming a rank that died while the shards
    were built (its exit breaks the collectives rank 0 runs meanwhile)."""
    try:
        return ModelRunner(args, hf_dir, config, ranks.group)
    except RuntimeError as exc:
        deadline = time.monotonic() + 3.0
        while ranks.failure() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if ranks.failure() is None:
            raise
        raise RankFailedError(ranks.failure()) from exc


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
