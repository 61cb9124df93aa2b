"""Exact greedy decoding from a half-precision copy of the LM head.

A greedy step needs only the argmax of each row's logits l = W x (W [V, K] fp32). At a
few rows the head's GEMM is bound by the bytes of W it streams (SmolLM2-135M: 113 MB of
a decode step's 538), so `ArgmaxScreen` first computes approximate logits a = W16 x from
an IEEE fp16 copy of W (half the bytes), bounds each row's error, and computes exact
logits only for the candidates the bound cannot rule out. The argmax equals the one over
the full fp32 head, ties included (first index): the candidates' logits are computed by
the same fp32 kernel with the same rows, so they are the full head's values bit for bit.

The bound, per vocabulary row i (Cauchy-Schwarz, and the standard error bound of a
floating-point dot product, Higham, "Accuracy and Stability of Numerical Algorithms",
2nd ed., 2002, section 3.1: |fl(w . x) - w . x| <= gamma_K sum_k |w_k x_k|, gamma_K = K u /
(1 - K u), u = 2^-24, for any summation order, with or without FMA):

    |a_i - l_i| <= ||x||_2 (||W_i - W16_i||_2 + gamma_K (||W_i||_2 + ||W16_i||_2))

c_i adds 4u (||W_i||_2 + ||W16_i||_2) to that factor, more than the fp32 rounding of
||x||, of ||x|| c_i and of a_i +- ||x|| c_i can take off (|a_i| <= ||W16_i|| ||x|| (1 +
gamma_K)); it is computed once in float64 from the stored values and rounded up. Row i
is a candidate when a_i + ||x|| c_i >= max_j (a_j - ||x|| c_j): any other row's exact
logit lies below the best one's. With SmolLM2-135M on the comparison workloads, 1664
greedy steps gave 1 candidate at the median and 4 at most.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from radixlm.kernels.cpu import CpuKernels
from radixlm.kernels.cpu.weights import pack_panels

#: Most rows the screen serves; more go to the full fp32 head. Measured on the 2-core
#: AMD EPYC (Zen 4), SmolLM2-135M's head (49152 x 576), medians of 11 alternated calls:
#: the fp16 GEMM against the fp32 one takes 0.47x / 0.45x / 0.57x of the time at 1 / 2 /
#: 4 rows on 1 thread and 0.50x / 0.52x / 0.55x on 2; at 8 rows it is slower (1.25x /
#: 1.10x): the rows' FMAs, not the weight bytes, bound it there.
SCREEN_ROWS = 4


class ArgmaxScreen:
    """The fp16 copy of an LM head's weight and its per-row error bounds.

    Args:
        weight: float32 [V, K] head weight (not kept). Every value must be finite in fp16
            (|w| <= 65504); `ArgmaxScreen.fits(weight)` says whether it is.
        kernels: the loaded `CpuKernels` (`hmm` computes the approximate logits).

    Attributes:
        panels: float16 [ceil(V / 16), K, 16], W's fp32 panels rounded to fp16.
        coef: float32 [V], c_i above (rounded up).

    Raises:
        ValueError: weight not float32 [V, K], or not finite in fp16.
    """

    def __init__(self, weight: torch.Tensor, kernels: CpuKernels):
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"ArgmaxScreen needs a float32 [V, K] weight, got {weight.dtype}")
        if not self.fits(weight):
            raise ValueError("the head weight is not finite in float16")
        w = weight.detach()
        self.vocab, k = w.shape
        self.kernels = kernels
        half = w.to(torch.float16)
        self.panels = pack_panels(half.float()).to(torch.float16)
        u = 2.0**-24
        gamma = k * u / (1 - k * u)
        w64, h64 = w.double(), half.double()
        coef = (w64 - h64).norm(dim=1) + (gamma + 4 * u) * (w64.norm(dim=1) + h64.norm(dim=1))
        coef32 = coef.float()
        self.coef = torch.nextafter(coef32, torch.full_like(coef32, math.inf))

    @staticmethod
    def fits(weight: torch.Tensor) -> bool:
        """Whether every value of `weight` is finite in float16 (and in float32)."""
        return bool(torch.isfinite(weight.detach().to(torch.float16)).all())

    @property
    def extra_bytes(self) -> int:
        """Bytes of the fp16 panels and the bounds."""
        return self.panels.numel() * 2 + self.coef.numel() * 4

    def logits(
        self, x: torch.Tensor, exact: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        """Logits [M, V] float32 whose argmax (first index on ties) is each row's argmax of
        the full head: the candidates hold their exact logits, every other entry -inf.

        Args:
            x: float32 [M, K] final hidden states (M <= SCREEN_ROWS).
            exact: (x [M, K], ids int64 [C]) -> float32 [M, C], the full head's logits of
                vocabulary rows `ids` (bit for bit).
        Returns:
            The logits, or None where the bound cannot decide (a non-finite x or
            approximate logit): the caller computes the full head.
        """
        approx = self.kernels.hmm(x, self.panels, self.vocab)  # [M, V]
        norm = torch.linalg.vector_norm(x.double(), dim=1).float()  # [M]
        ids = self.kernels.screen_select(approx, self.coef, norm)
        if ids is None:
            return None
        out = torch.full_like(approx, -math.inf)
        out[:, ids] = exact(x, ids)
        return out
