"""Request length distributions (prompt or output tokens) for fleet sizing.

Written on the command line as one length ("512") or length:weight pairs
("128:0.5,2048:0.5"); weights are normalized to sum to 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LengthDist:
    """A discrete length distribution: values and weights (normalized)."""

    values: tuple[int, ...]
    weights: tuple[float, ...]

    @classmethod
    def parse(cls, text: str) -> LengthDist:
        """ "512" (fixed) or "128:0.5,2048:0.5" (length:weight pairs)."""
        values, weights = [], []
        try:
            for part in text.split(","):
                length, _, weight = part.strip().partition(":")
                values.append(int(length))
                weights.append(float(weight) if weight else 1.0)
        except ValueError:
            values = []
        if (
            not values
            or min(values) <= 0
            or not all(math.isfinite(w) and w >= 0 for w in weights)
            or sum(weights) <= 0
        ):
            raise ValueError(
                f"bad length distribution {text!r}: expected a length or 'len:weight,...' "
                "with integer lengths >= 1 and finite weights >= 0, not all zero"
            )
        total = sum(weights)
        return cls(tuple(values), tuple(w / total for w in weights))

    @property
    def mean(self) -> float:
        return sum(v * w for v, w in zip(self.values, self.weights, strict=True))

    @property
    def max(self) -> int:
        return max(v for v, w in zip(self.values, self.weights, strict=True) if w > 0)
