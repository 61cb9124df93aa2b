"""Speculative decoding: drafters (n-gram, draft model, EAGLE head) and tree verification.

`make_speculative_decode(args, runner)` builds the decode strategy that
`runtime/server/stack.py` hands to the Scheduler when --speculative-algorithm is set (see
`decode.py` for the step, `base.py` for the drafter interface, `accept.py` for the
acceptance rules). Drafter imports are lazy: only the chosen drafter's module loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixlm.config import ServerArgs
    from radixlm.runtime.speculative.base import Drafter
    from radixlm.runtime.speculative.decode import SpeculativeDecode


def make_drafter(args: ServerArgs, runner) -> Drafter:
    """The drafter named by args.speculative_algorithm. Raises ValueError if unknown."""
    algo = args.speculative_algorithm
    if algo == "ngram":
        from radixlm.runtime.speculative.ngram import NgramDrafter

        return NgramDrafter(args.speculative_num_steps, args.speculative_topk)
    if algo == "draft":
        from radixlm.runtime.speculative.draft_model import DraftModelDrafter

        return DraftModelDrafter.load(args, runner)
    if algo == "eagle":
        from radixlm.runtime.speculative.eagle import EagleDrafter

        return EagleDrafter.load(args, runner)
    raise ValueError(f"unknown speculative algorithm {algo!r}")


def make_speculative_decode(args: ServerArgs, runner) -> SpeculativeDecode:
    """A SpeculativeDecode over the drafter named by args."""
    from radixlm.runtime.speculative.decode import SpeculativeDecode

    return SpeculativeDecode(args, runner, make_drafter(args, runner))
