"""``n`` / ``best_of`` of the OpenAI routes: the copies a prompt runs as, and which return.

Each prompt runs as ``best_of`` (default ``n``) requests, its copies; runs are
prompt-major (run p * copies + c is copy c of prompt p). The scheduler's in-batch prefix
guard holds the copies back one round, so the prompt is prefilled once and the others
hit the radix cache (prompts shorter than the guard's 32-token threshold may be
prefilled per copy: waiting a round would cost more than they do). With a seed, copy i
draws with `derive_seed(seed, i)` (copy 0 keeps the seed: n=1 and n>1 agree on choice
0). Usage counts each prompt's tokens once and every copy's completion tokens (OpenAI's
rule; best_of copies that are not returned are counted too, as OpenAI bills them).
``best_of`` > n keeps the n copies with the highest cumulative logprob of their sampled
tokens (vLLM's rule; raw-logit logprobs, see runtime/sampling/logprobs.py) and cannot be streamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from radixlm.frontend.errors import invalid_request
from radixlm.frontend.logprob_format import cumulative_logprob
from radixlm.frontend.protocol import SamplingFields
from radixlm.runtime.sampling.random_draw import derive_seed
from radixlm.runtime.sampling.sampler import SamplingParams

T = TypeVar("T")


@dataclass(frozen=True)
class Fanout:
    """Copies run (`copies`) and returned (`n`) per prompt; copies >= n >= 1."""

    n: int = 1
    copies: int = 1

    @classmethod
    def of(cls, req: SamplingFields) -> Fanout:
        """The request's ``n`` and ``best_of`` (only completions have best_of).

        Raises APIError (400, param best_of) for best_of < n and for a streamed
        best_of > n (choices are ranked once every copy has finished).
        """
        n = req.n or 1
        best_of = getattr(req, "best_of", None) or n
        if best_of < n:
            raise invalid_request(f"'best_of' ({best_of}) must be >= 'n' ({n})", param="best_of")
        if best_of > n and req.stream:
            raise invalid_request("'best_of' > 'n' cannot be streamed", param="best_of")
        return cls(n, best_of)

    @property
    def selects(self) -> bool:
        """Whether copies are ranked and only the best n returned (best_of > n)."""
        return self.copies > self.n

    @property
    def param(self) -> str:
        """The request field that set `copies`, for error messages."""
        return "best_of" if self.selects else "n"

    def counts_prompt(self, run: int) -> bool:
        """Whether run `run` is the copy whose usage counts its prompt's tokens."""
        return run % self.copies == 0

    def expand(self, items: list[T]) -> list[T]:
        """One entry per run: each prompt's item repeated `copies` times."""
        return [item for item in items for _ in range(self.copies)]

    def expand_params(self, params: list[SamplingParams]) -> list[SamplingParams]:
        """Sampling settings per run: copy c > 0 of a seeded prompt gets
        derive_seed(seed, c); unseeded copies share the settings."""
        return [_copy_params(p, c) for p in params for c in range(self.copies)]

    def check_count(self, num_prompts: int, limit: int) -> None:
        """400 when the request runs more sequences than the server can ever hold
        (`limit` = running rows + waiting queue), which retrying would not fix."""
        count = num_prompts * self.copies
        if count > limit:
            raise invalid_request(
                f"the request runs {count} sequences (prompts x {self.param}), more than the "
                f"server can hold at once ({limit}: --max-running-requests + "
                "--max-queued-requests)",
                param=self.param if self.copies > 1 else None,
            )

    def check_fits(self, prompt_len: int, max_new: int, pool_tokens: int) -> None:
        """400 when a prompt's copies cannot all fit a KV pool of `pool_tokens` tokens at
        once (the prompt is shared, each copy owns its completion)."""
        if self.copies == 1:
            return
        need = prompt_len + self.copies * max_new
        if need > pool_tokens:
            raise invalid_request(
                f"{self.param} ({self.copies}) x max_tokens ({max_new}) + the prompt "
                f"({prompt_len}) need {need} KV tokens, more than the server's {pool_tokens}",
                param=self.param,
            )

    def best(self, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per prompt, the n of its copies' results (run order, each with
        ``output_logprobs``) with the highest cumulative logprob, best first."""
        out = []
        for start in range(0, len(results), self.copies):
            group = results[start : start + self.copies]
            ranked = sorted(group, key=lambda r: -cumulative_logprob(r["output_logprobs"]))
            out.extend(ranked[: self.n])
        return out


def _copy_params(params: SamplingParams, copy: int) -> SamplingParams:
    """Sampling settings of copy `copy` of a prompt: a derived seed when seeded."""
    if copy == 0 or params.seed is None:
        return params
    return msgspec.structs.replace(params, seed=derive_seed(params.seed, copy))
