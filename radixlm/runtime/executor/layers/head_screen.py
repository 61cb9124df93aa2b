"""Exact greedy decoding from a half-size (fp16 or bfloat16) copy of the LM head.

A greedy step needs only the argmax of each row's logits l = W x (W [V, K] fp32). The
head's GEMM is a large share of a decode step (SmolLM2-135M: 113 MB of the 538 MB a
batch-1 step streams), so `ArgmaxScreen` first
computes approximate logits a from a half-size copy of W (half the bytes; on AVX-512 BF16
also twice the products per instruction), bounds each one's error, and computes exact
logits only for the candidates the bound cannot rule out. The argmax equals the one over
the full fp32 head, ties included (first index): the candidates' logits are computed by
the same fp32 kernel with the same rows, so they are the full head's values bit for bit.

Two forms of the copy (`Fp16Product`, `Bf16Product`): IEEE fp16 panels widened to fp32
and multiplied by x in fp32 (any AVX2 CPU; up to 4 rows, above which the FMAs bound it),
or bfloat16 pair panels against x rounded to bfloat16, multiplied and added by AVX-512
BF16's `vdpbf16ps` (up to 16 rows). Either way x's entries below 2^-40 in magnitude are
taken as zero, so no product or partial sum is subnormal (each is 0 or at least 2^-94 in
magnitude) and `vdpbf16ps`'s flushing of subnormals never applies.

The bound, per vocabulary row i and row x (xs: x as the product reads it; Cauchy-Schwarz,
and the error bound of a floating-point dot product, Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., 2002, section 3.1: |fl(w . x) - w . x| <= gamma_K sum_k
|w_k x_k|, gamma_K = K u / (1 - K u), u = 2^-24, in any summation order, with or without
FMA), with W16 the stored copy and ||x|| <= ||xs|| + ||x - xs||:

    |a_i - l_i| <= ||xs|| (||W_i - W16_i|| + gamma_K (||W16_i|| + ||W_i||))
                   + ||x - xs|| ||W_i|| (1 + gamma_K)

The bound assumes no partial sum overflows: the screen declines (the caller computes the
full head) when (||xs|| + ||x - xs||) max_i ||W_i|| could reach 2^127. The screen's c1_i
and c2_i are the two factors plus 4u (||W_i|| + ||W16_i||) and 4u ||W_i||, more than the
fp32 rounding of the norms and of the radius can take off; they are computed once in
float64 from the stored values and rounded up, and each radius adds 2^-100 for the fp32
head's own gradual underflow (at most 2^-150 per operation; where fp32 absorbs the 2^-100,
the radius is at least 2^-76 and the 4u terms cover it). Rounding a_i +- radius is
monotone, so it cannot reorder the comparisons below.

Row i is a candidate when a_i + r_i >= max_j (a_j - r_j): any other row's exact logit,
and its approximate one, lies below the best one's, so the logits returned keep the other
rows' approximate values. With SmolLM2-135M on the comparison workloads (single, burst16,
shared16, multiturn; 473 greedy steps), the bfloat16 form kept a median of 1 candidate
(for all rows together) at 1 row (13 at most), 4 at 4 rows (24) and 13 at 16 rows (60);
the fp16 form 1 at 1 row (2) and 4 at 4 rows (7).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from radixlm.kernels.cpu import CpuKernels
from radixlm.kernels.cpu.weights import pack_pair_panels, pack_panels

#: x entries below this magnitude are read as zero by the approximate product.
_TINY = 2.0**-40
#: Absolute slack added to every radius (see the module docstring).
_PAD = 2.0**-100
_U = 2.0**-24
#: Vocabulary rows whose norms are taken at once when the screen is built.
_NORM_ROWS = 4096
#: Bound on any partial sum of either product (half of float32's largest finite value).
_SUM_LIMIT = 2.0**127


class CopyProduct:
    """How the screen stores its copy of W and multiplies x by it: `rows` (the most rows it
    serves), `dtype` (the copy's), `pack(copy [V, K]) -> panels` and `approximate(x,
    panels, vocab) -> (approx [M, V] float32, xs [M, K] float32, x as the product read
    it)`."""

    rows: int
    dtype: torch.dtype

    def __init__(self, kernels: CpuKernels):
        self.kernels = kernels

    def pack(self, copy: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def approximate(
        self, x: torch.Tensor, panels: torch.Tensor, vocab: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class Fp16Product(CopyProduct):
    """The fp16 form: panels float16 [ceil(V / 16), K, 16] (`CpuKernels.hmm`).

    It is faster than the fp32 GEMM up to 4 rows and slower from 8, so it serves at most
    `rows` = 4 (figures in docs/perf-notes.md, "The LM head's greedy screen").
    """

    rows = 4
    dtype = torch.float16

    def pack(self, copy: torch.Tensor) -> torch.Tensor:
        """Panels of the float16 copy [V, K]."""
        return pack_panels(copy.float()).to(torch.float16)

    def approximate(
        self, x: torch.Tensor, panels: torch.Tensor, vocab: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(approx [M, V] float32, xs [M, K] float32): the product over xs, x with its
        entries below 2^-40 in magnitude set to zero."""
        xs = x.masked_fill(x.abs() < _TINY, 0.0)
        return self.kernels.hmm(xs, panels, vocab), xs


class Bf16Product(CopyProduct):
    """The bfloat16 form: pair panels bfloat16 [ceil(V / 16), ceil(K / 2), 16, 2]
    (`CpuKernels.bmm`, AVX-512 BF16), x rounded to bfloat16 (nearest even).

    It is faster than the fp32 GEMM up to 16 rows, so it serves up to `rows` = 16 (figures
    in docs/perf-notes.md). The copy's entries below 2^-40 in magnitude are zero (`flush`).
    """

    rows = 16
    dtype = torch.bfloat16

    @staticmethod
    def flush(t: torch.Tensor) -> torch.Tensor:
        """t with its entries below 2^-40 in magnitude set to zero."""
        return t.masked_fill(t.abs() < _TINY, 0.0)

    def pack(self, copy: torch.Tensor) -> torch.Tensor:
        """Pair panels of the bfloat16 copy [V, K]."""
        return pack_pair_panels(copy)

    def approximate(self, x, panels, vocab):
        """(approx, xs): the product over x rounded to bfloat16, then `flush`ed."""
        xs = self.flush(x.to(torch.bfloat16))
        if xs.shape[1] % 2:
            xs = torch.nn.functional.pad(xs, (0, 1))
        return self.kernels.bmm(xs, panels, vocab), xs[:, : x.shape[1]].float()


class ArgmaxScreen:
    """A half-size copy of an LM head's weight and its per-row error bounds.

    Args:
        weight: float32 [V, K] head weight (not kept). Every value must be finite in the
            copy's dtype; `ArgmaxScreen.fits(weight, kernels)` says whether it is.
        kernels: the loaded `CpuKernels`. The copy is bfloat16 where they have AVX-512 BF16
            (`CpuKernels.has_bf16`), else float16.

    Attributes:
        product: `Bf16Product` or `Fp16Product`; `product.rows` is the most rows served.
        panels: the copy, packed for `product`.
        c1, c2: float32 [V], the bound's factors (rounded up).

    Raises:
        ValueError: weight not float32 [V, K], not finite in the copy's dtype, or with a
            row norm beyond float32's range.
    """

    def __init__(self, weight: torch.Tensor, kernels: CpuKernels):
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError(f"ArgmaxScreen needs a float32 [V, K] weight, got {weight.dtype}")
        self.product = self.product_for(kernels)
        w = weight.detach()
        self.vocab, k = w.shape
        self.kernels = kernels
        copy = w.to(self.product.dtype)
        if not torch.isfinite(copy).all():
            raise ValueError(f"the head weight is not finite in {self.product.dtype}")
        if isinstance(self.product, Bf16Product):
            copy = Bf16Product.flush(copy)
        self.panels = self.product.pack(copy)
        gamma = k * _U / (1 - k * _U)
        # Row norms in float64, a block of rows at a time (not three float64 copies of W).
        e, wn, cn = (torch.empty(self.vocab, dtype=torch.float64) for _ in range(3))
        for r in range(0, self.vocab, _NORM_ROWS):
            w64, c64 = w[r : r + _NORM_ROWS].double(), copy[r : r + _NORM_ROWS].double()
            e[r : r + _NORM_ROWS] = (w64 - c64).norm(dim=1)
            wn[r : r + _NORM_ROWS], cn[r : r + _NORM_ROWS] = w64.norm(dim=1), c64.norm(dim=1)
        c1 = e + (gamma + 4 * _U) * (wn + cn)
        c2 = wn * (1 + gamma + 4 * _U)
        self.c1, self.c2 = (self._round_up(c) for c in (c1, c2))
        if not (torch.isfinite(self.c1).all() and torch.isfinite(self.c2).all()):
            raise ValueError("the head weight has a row norm beyond float32")
        #: The largest row norm of W and of its copy (float64): with ||x|| below
        #: `_SUM_LIMIT` / this, no partial sum of either product can overflow.
        self.max_norm = float(torch.maximum(wn, cn).max()) if self.vocab else 0.0

    @staticmethod
    def _round_up(c: torch.Tensor) -> torch.Tensor:
        c32 = c.float()
        return torch.nextafter(c32, torch.full_like(c32, math.inf))

    @staticmethod
    def product_for(kernels: CpuKernels) -> CopyProduct:
        """The copy's form on this CPU."""
        return Bf16Product(kernels) if kernels.has_bf16 else Fp16Product(kernels)

    @classmethod
    def fits(cls, weight: torch.Tensor, kernels: CpuKernels) -> bool:
        """Whether every value of `weight` is finite in the copy's dtype on this CPU."""
        dtype = cls.product_for(kernels).dtype
        return bool(torch.isfinite(weight.detach().to(dtype)).all())

    @property
    def rows(self) -> int:
        """Most rows of x `logits` takes."""
        return self.product.rows

    @property
    def extra_bytes(self) -> int:
        """Bytes of the copy's panels and the bounds."""
        return self.panels.numel() * 2 + (self.c1.numel() + self.c2.numel()) * 4

    def logits(
        self, x: torch.Tensor, exact: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        """Logits [M, V] float32 whose argmax (first index on ties) is each row's argmax of
        the full head: the candidates hold their exact logits, every other entry its
        approximate one, which lies below the row's largest exact logit.

        Args:
            x: float32 [M, K] final hidden states (M <= `rows`).
            exact: (x [M, K], ids int64 [C]) -> float32 [M, C], the full head's logits of
                vocabulary rows `ids` (bit for bit).
        Returns:
            The logits, or None where the screen does not decide (a non-finite x or
            approximate logit, an x large enough that a sum could overflow, or more than
            an eighth of the vocabulary left as candidates): the caller computes the full
            head.
        """
        approx, xs = self.product.approximate(x, self.panels, self.vocab)  # [M, V]
        x64, xs64 = x.double(), xs.double()
        n1 = torch.linalg.vector_norm(xs64, dim=1)  # [M]
        n2 = torch.linalg.vector_norm(x64 - xs64, dim=1)
        # Every partial sum of either product is at most ||W_i|| ||x|| <= ||W_i|| (n1 + n2)
        # in magnitude: decline where one could overflow (the bound assumes none does).
        if not float((n1 + n2).max()) * self.max_norm < _SUM_LIMIT:
            return None
        ids = self.kernels.screen_select(approx, self.c1, self.c2, n1.float(), n2.float(), _PAD)
        if ids is None or ids.numel() > self.vocab // 8:
            return None  # undecided, or too many candidates to be worth their exact logits
        # Every other entry stays approximate: below its row's floor, so below the exact
        # logit of the row's argmax (a candidate).
        approx[:, ids] = exact(x, ids)
        return approx
