"""Sampling parameters and the batched sampler.

Per step and batch: logit processors (logit bias, penalties, min_new_tokens; see
`penalties.py`), then greedy rows take the argmax, the other rows divide by their
temperature, keep top-k / top-p / min-p, and draw with counter-based noise
(`random_draw.py`: reproducible per seed and output position whatever the batch).

Top-p is nucleus sampling (Holtzman et al. 2020): keep the smallest set of most probable
tokens whose probability mass reaches p. Min-p keeps tokens with p >= min_p * p_max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

import msgspec
import torch

from radixlm.errors import InvalidRequestError
from radixlm.runtime.sampling.penalties import apply_processors
from radixlm.runtime.sampling.random_draw import inverse_cdf_draw

_GREEDY_TEMPERATURE = 1e-5

#: Largest token count or token id a request may carry (int32). Larger values mean
#: nothing for any model, and every int of a request crosses a process boundary, where
#: msgpack cannot encode one of 2**64 or more: bounding them here makes such a value a
#: 400 on its field instead of a failure after validation.
MAX_REQUEST_INT = 2**31 - 1
#: Largest top_k (int64): any larger k means the whole vocabulary, as top_k is clamped
#: to it when sampling, so every int64 is accepted.
MAX_TOP_K = 2**63 - 1

# Grammar constraints (runtime/sampling/grammar.py); a request sets at most one of them.
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf", "structural_tag")


class SamplingParams(msgspec.Struct, kw_only=True):
    """Per-request sampling settings, with SGLang's names.

    Attributes:
        max_new_tokens: tokens to generate at most (0 only fills the cache and returns).
        temperature: 0 (or below 1e-5) means greedy (argmax).
        top_p: nucleus mass in (0, 1]. top_k: keep the k most likely (-1 = all).
        min_p: relative probability floor in [0, 1).
        seed: per-request RNG seed; the same seed and request give the same output.
        stop: strings that end generation when the decoded output contains one; the
            output text is cut before it.
        stop_token_ids: extra token ids that end generation (as EOS does).
        ignore_eos: keep generating past EOS.
        frequency_penalty, presence_penalty: OpenAI penalties in [-2, 2] over the
            generated tokens (see penalties.py).
        repetition_penalty: > 0; CTRL-style penalty over prompt + output (1 = off).
        logit_bias: token id -> bias added to its logit (in [-100, 100]).
        min_new_tokens: EOS, stop token ids and stop strings do not end the request
            before this many tokens.
        no_stop_trim: keep the matched stop string at the end of the output text.
        skip_special_tokens: leave special tokens (e.g. ``<|im_end|>``) out of the output
            text; False writes them (stop strings are matched in that same text).
        spaces_between_special_tokens: passed to the tokenizer's decode (slow tokenizers
            put a space around special tokens; fast ones ignore it).
        json_schema / regex / ebnf / structural_tag: a grammar the output must match (a
            JSON schema as a string, a regular expression, a GBNF grammar with rule
            ``root``, an xgrammar structural tag as JSON); at most one
            (runtime/sampling/grammar.py).
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_new_tokens: int = 0
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @classmethod
    def from_any(cls, value: SamplingParams | dict[str, Any] | None) -> SamplingParams:
        """Accept a SamplingParams, a dict with these names, or None (defaults); `stop`
        may be one string.

        Raises InvalidRequestError for unknown keys or wrong types (param
        "sampling_params") or out-of-range values (param: the field, see `validate`).
        """
        if value is None:
            value = {}
        elif isinstance(value, cls):
            # Struct constructors do not type-check: re-check the fields like a dict.
            value = msgspec.structs.asdict(value)
        elif not isinstance(value, dict):
            raise InvalidRequestError(
                f"sampling_params must be a dict, got {type(value).__name__}",
                param="sampling_params",
                code="invalid_type",
            )
        unknown = set(value) - set(cls.__struct_fields__)
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameters: {sorted(unknown)}",
                param="sampling_params",
                code="unknown_parameter",
            )
        if isinstance(value.get("logit_bias"), dict):
            value = {**value, "logit_bias": _int_keys(value["logit_bias"])}
        if isinstance(value.get("stop"), str):  # one stop string, as the HTTP routes take
            value = {**value, "stop": [value["stop"]]}
        try:
            params = msgspec.convert(value, cls)
        except msgspec.ValidationError as e:
            raise InvalidRequestError(
                f"invalid sampling parameters: {e}", param="sampling_params", code="invalid_type"
            ) from None
        params.validate()
        return params

    def validate(self) -> None:
        """Raise InvalidRequestError (param: the field at fault, code "invalid_value";
        param None for two grammar fields set at once) when a value is out of range.

        Every int field is bounded (counts and token ids by MAX_REQUEST_INT, top_k by
        MAX_TOP_K, seed below 2**63), so a validated SamplingParams always crosses the
        process boundary.
        Token ids are checked against the model's vocabulary later (`check_request`)."""
        floats = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty")
        for name in (*floats, "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                _bad(name, f"{name} must be finite, got {getattr(self, name)}")
        _check_range("max_new_tokens", self.max_new_tokens, 0)
        if self.temperature < 0:
            _bad("temperature", f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            _bad("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or not -1 <= self.top_k <= MAX_TOP_K:
            _bad("top_k", f"top_k must be -1 or in [1, 2**63 - 1], got {self.top_k}")
        if not 0 <= self.min_p < 1:
            _bad("min_p", f"min_p must be in [0, 1), got {self.min_p}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            _bad("seed", f"seed must be in [0, 2**63), got {self.seed}")
        if any(not s for s in self.stop):
            _bad("stop", "stop strings must be non-empty")
        for tok in self.stop_token_ids:
            _check_range("stop_token_ids", tok, 0, what="stop_token_ids entries")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                _bad(name, f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0:
            _bad(
                "repetition_penalty",
                f"repetition_penalty must be > 0, got {self.repetition_penalty}",
            )
        _check_range("min_new_tokens", self.min_new_tokens, 0)
        if self.min_new_tokens > self.max_new_tokens:
            _bad(
                "min_new_tokens",
                f"min_new_tokens must be <= max_new_tokens ({self.max_new_tokens}), "
                f"got {self.min_new_tokens}",
            )
        for tok, bias in (self.logit_bias or {}).items():
            _check_range("logit_bias", tok, 0, what="logit_bias keys")
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                _bad("logit_bias", f"logit_bias values must be in [-100, 100], got {bias}")
        grammars = [f for f in GRAMMAR_FIELDS if getattr(self, f) is not None]
        if len(grammars) > 1:
            _bad(None, f"set at most one of {', '.join(grammars)}")

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding: temperature below 1e-5 (where logits / T overflows) or top_k 1."""
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1


def _bad(param: str | None, message: str) -> NoReturn:
    """Raise the InvalidRequestError of an out-of-range value of field `param`."""
    raise InvalidRequestError(message, param=param, code="invalid_value")


def _check_range(param: str, value: int, low: int, *, what: str | None = None) -> None:
    """Raise the InvalidRequestError of field `param` unless low <= value <=
    MAX_REQUEST_INT; `what` names the value in the message (default: `param`)."""
    if not low <= value <= MAX_REQUEST_INT:
        _bad(param, f"{what or param} must be in [{low}, {MAX_REQUEST_INT}], got {value}")


def _int_keys(bias: dict) -> dict:
    """logit_bias with integer keys (JSON object keys are strings: "50256" -> 50256)."""
    out = {}
    for key, value in bias.items():
        if isinstance(key, str):
            try:
                key = int(key)
            except ValueError:
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids, got {key!r}",
                    param="logit_bias",
                    code="invalid_value",
                ) from None
        out[key] = value
    return out


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """int64 [B]: index of each row's maximum of float [B, V] logits, the first one on ties
    (as `torch.argmax`).

    On the CPU this goes through numpy's vectorized argmax, which is several times faster
    than `torch.argmax` over a large vocabulary (docs/perf-notes.md, "Sampling"); other
    devices use `torch.argmax`.
    """
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64):
        return torch.argmax(logits, dim=-1)
    return torch.from_numpy(logits.detach().numpy().argmax(-1).astype("int64", copy=False))


class Sampler:
    """Picks the next token of each row of a logits batch.

    Args:
        eos_token_ids: ids that min_new_tokens masks (unless a request ignores EOS).
    """

    def __init__(self, eos_token_ids: Sequence[int] = ()):
        self.eos_token_ids = list(eos_token_ids)

    def sample(self, logits: torch.Tensor, reqs: Sequence[Any]) -> torch.Tensor:
        """Sample one token per row.

        Args:
            logits: float32 [B, vocab], raw model logits (not modified).
            reqs: B objects with ``params`` (SamplingParams), ``seed`` (int in
                [0, 2**63)), ``input_ids`` and ``output_ids`` (lists of ints); the draw of
                row b is a function of its processed logits, seed and len(output_ids).
        Returns:
            int64 [B] token ids. Greedy rows are exactly the argmax of the processed logits.
        """
        logits = apply_processors(logits, reqs, self.eos_token_ids)
        out = argmax_rows(logits)
        rows = [i for i, r in enumerate(reqs) if not r.params.is_greedy]
        if not rows:
            return out
        sub_reqs = [reqs[i] for i in rows]
        idx = torch.tensor(rows, device=logits.device)
        sub = logits[idx]
        temps = torch.tensor([r.params.temperature for r in sub_reqs], dtype=sub.dtype)
        probs = self._filter(sub / temps[:, None].to(sub.device), [r.params for r in sub_reqs])
        seeds = torch.tensor([r.seed for r in sub_reqs], dtype=torch.int64)
        steps = torch.tensor([len(r.output_ids) for r in sub_reqs], dtype=torch.int64)
        drawn = inverse_cdf_draw(probs, seeds.to(probs.device), steps.to(probs.device))
        out[idx] = drawn
        return out

    @staticmethod
    def _filter(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Softmax after top-k, top-p and min-p masks; returns probabilities [R, vocab].

        Rows without any filter skip the candidate search (one softmax for the whole
        batch then); the others go through `filter_probs`."""
        probs = torch.softmax(logits, dim=-1)
        if all(p.top_k < 0 and p.top_p >= 1 and p.min_p <= 0 for p in params):
            return probs
        return filter_probs(probs, params)


#: Candidates tried first by `filter_probs` (doubled until every row is decided).
_FIRST_CANDIDATES = 64


def filter_probs(probs: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Top-k, then top-p over the top-k renormalized mass, then min-p relative to the
    most likely token; survivors renormalized. probs: float [R, vocab] softmax rows.

    Instead of sorting the whole vocabulary it takes the K most likely tokens
    (`torch.topk`, K = 64, or the largest top-k) and doubles K until every row's kept
    set provably lies inside them: its top-k fits, or its candidates' top-k-renormalized
    mass reaches top-p, or the K-th candidate is below its min-p floor. A row with no
    filter keeps its probabilities. Same result as a full sort up to the order of exact
    ties, and much cheaper when the kept set is small (docs/perf-notes.md, "Sampling").
    """
    rows, vocab = probs.shape
    device = probs.device
    top_k = torch.tensor(
        [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params], device=device
    )
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype, device=device)
    min_p = torch.tensor([p.min_p for p in params], dtype=probs.dtype, device=device)
    filtered = (top_k < vocab) | (top_p < 1) | (min_p > 0)
    k = min(vocab, max([_FIRST_CANDIDATES] + [int(x) for x in top_k if x < vocab]))
    while True:
        cand, order = torch.topk(probs, k, dim=-1)  # descending
        ranks = torch.arange(k, device=device)[None, :]
        cand = cand.masked_fill(ranks >= top_k[:, None], 0.0)
        # top-k renormalization: over the top-k set, or the whole vocabulary without one
        denom = torch.where(top_k < vocab, cand.sum(-1), torch.ones_like(top_p))
        renorm = cand / denom[:, None]
        cum = torch.cumsum(renorm, dim=-1)
        decided = (
            (top_k <= k)
            | ((top_p < 1) & (cum[:, -1] >= top_p))
            | ((min_p > 0) & (cand[:, -1] < min_p * cand[:, 0]))
            | ~filtered
        )
        if k == vocab or bool(decided.all()):
            break
        k = min(vocab, 2 * k)
    drop = (cum - renorm >= top_p[:, None]) | (renorm < min_p[:, None] * renorm[:, :1])
    drop |= ranks >= top_k[:, None]
    drop[:, 0] = False
    kept = renorm.masked_fill(drop, 0.0)
    kept = kept / kept.sum(-1, keepdim=True)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return torch.where(filtered[:, None], out, probs)
