"""The work model of one forward step: FLOPs, bytes moved, and roofline time.

A step runs `decode_batch` sequences that each add one token after `context` cached
tokens, and optionally one prefill chunk of `chunk` tokens after `chunk_prefix` cached
tokens of its own prompt, repeated over `chunk_seqs` prompts (whole-prompt prefill of a
batch). Per GPU of a `tp`-way group:

FLOPs (Kaplan et al. 2020, "Scaling Laws", section 2.1: 2 FLOPs per parameter per token
for the forward pass, plus attention):
    2 * matmul_params * tokens / tp
  + attn_coeff * (decode_batch * context + chunk_seqs * (chunk * chunk_prefix
                                                         + chunk * (chunk + 1) / 2)) / tp
where attn_coeff = FLOPs per query token per cached token (4 * heads * head_dim * layers;
for MLA the absorbed form for decode and the expanded form for chunks, see
`ModelSpec.attn_flops_per_context_token`; causal self-attention of a chunk sees on
average half of itself).

Bytes (the dominant traffic; activations are ignored):
    weights read once per step (MoE: the experts the step's tokens route to) / tp
  + cached KV read: (decode_batch * context + chunk_seqs * chunk_prefix) * kv_per_gpu
  + new KV written: tokens * kv_per_gpu

Time (Williams, Waterman, Patterson 2009, "Roofline: an insightful visual performance
model"): a step cannot beat either the compute or the memory roof,
    t = max(FLOPs / peak_flops, bytes / bandwidth) + overhead
with `overhead` a fixed per-step cost (kernel launches, scheduling, sampling) that is
zero by default. Tensor-parallel all-reduces are not priced.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.plan.hardware import Hardware
from radixlm.plan.kv import kv_bytes_per_token_per_gpu
from radixlm.plan.models import ModelSpec
from radixlm.plan.validate import NON_NEGATIVE, POSITIVE_INT
from radixlm.plan.weights import weights_read_bytes


@dataclass(frozen=True)
class Step:
    """Per-GPU cost of one forward step. Units: FLOPs, bytes, seconds."""

    tokens: int
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    time_s: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP/byte."""
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class Deployment:
    """A model served on one replica of `tp` GPUs of `hw`, in given number formats."""

    model: ModelSpec
    hw: Hardware
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    overhead_s: float = 0.0

    def __post_init__(self) -> None:
        POSITIVE_INT.check("tp", self.tp)
        NON_NEGATIVE.check("overhead_s", self.overhead_s)

    @property
    def peak_flops(self) -> float:
        return self.hw.flops_for_weights(self.weight_dtype)

    @property
    def kv_per_token(self) -> float:
        return kv_bytes_per_token_per_gpu(self.model, self.kv_dtype, self.tp)

    def step(
        self,
        decode_batch: int = 0,
        context: int = 0,
        chunk: int = 0,
        chunk_prefix: int = 0,
        chunk_seqs: int = 1,
    ) -> Step:
        """Cost of one step (see module doc). A step with no tokens costs nothing."""
        if min(decode_batch, context, chunk, chunk_prefix) < 0 or chunk_seqs < 1:
            raise ValueError(
                "step needs decode_batch, context, chunk, chunk_prefix >= 0 and "
                f"chunk_seqs >= 1, got {decode_batch}, {context}, {chunk}, {chunk_prefix}, "
                f"{chunk_seqs}"
            )
        m, tp = self.model, self.tp
        prefill_tokens = chunk * chunk_seqs if chunk else 0
        tokens = decode_batch + prefill_tokens
        if tokens == 0:
            return Step(0, 0.0, 0.0, 0.0, 0.0, 0.0)
        attn = m.attn_flops_per_context_token() * decode_batch * context
        if chunk:
            pairs = chunk_seqs * (chunk * chunk_prefix + chunk * (chunk + 1) / 2)
            attn += m.attn_flops_per_context_token(prefill=True) * pairs
        flops = (2.0 * m.matmul_params_per_token() * tokens + attn) / tp
        kv_read = decode_batch * context + (chunk_seqs * chunk_prefix if chunk else 0)
        nbytes = (
            weights_read_bytes(m, tokens, self.weight_dtype) / tp
            + (kv_read + tokens) * self.kv_per_token
        )
        compute_s = flops / self.peak_flops
        memory_s = nbytes / self.hw.mem_bandwidth
        return Step(
            tokens, flops, nbytes, compute_s, memory_s, max(compute_s, memory_s) + self.overhead_s
        )

    def decode(self, batch: int, context: int) -> Step:
        return self.step(decode_batch=batch, context=context)

    def prefill(self, prompt: int, batch: int = 1) -> Step:
        """One step prefilling `batch` prompts of `prompt` tokens each (no cached prefix)."""
        return self.step(chunk=prompt, chunk_seqs=batch)

    def prefill_time(self, prompt: int, chunk: int | None = None) -> float:
        """Seconds to prefill one prompt alone, in chunks of `chunk` tokens (one step if
        None); each chunk attends to the chunks before it."""
        POSITIVE_INT.check("prompt", prompt)
        if chunk is not None:
            POSITIVE_INT.check("chunk", chunk)
        chunk = chunk or prompt
        total, done = 0.0, 0
        while done < prompt:
            size = min(chunk, prompt - done)
            total += self.step(chunk=size, chunk_prefix=done).time_s
            done += size
        return total
