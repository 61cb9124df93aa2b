"""Online model of a forward step's duration, fitted from the scheduler's own steps.

    t_ms(prefill_tokens, decode_batch) = a + b * prefill_tokens + c * decode_batch

a is the fixed per-step cost (weights read once, launches, sampling), b the cost of one
prefill token and c of one decoding request (its token plus its share of KV reads at the
current contexts). It is the linear form of the roofline of `radixlm plan` (radixlm/plan/
cost.py), which is exact for a step on one side of the ridge point; the planner's fit of
that roofline to the served model is the prior (`--slo-step-prior`).

Fit: ridge least squares over the last `window` measured steps, shrunk toward the prior,
with every coefficient >= 0 (no step gets cheaper with more work):
    theta = argmin_{theta >= 0} sum_i (y_i - x_i . theta)^2 + sum_j w_j (theta_j - prior_j)^2
with w_j = `prior_weight` / scale_j^2 (scale_j: a typical size of feature j), so the prior
decides only the directions the recent steps do not pin down (e.g. b before any prefill
ran) and is negligible once they do. Without a prior the shrinkage is toward zero. The
constraint matters on a noisy machine: decode batch and prefill size are correlated in
real traffic, and an unconstrained fit can trade a negative c for a larger b (then the
model would admit without limit). With three coefficients the constrained optimum is
found exactly by solving the ridge system on each subset of free coefficients (the
others held at 0) and keeping the best feasible one.
"""

from __future__ import annotations

from collections import deque

import numpy as np

#: Feature scales that make the prior's weight comparable across coefficients:
#: 1 step, 512 prefill tokens, 32 decoding requests.
_SCALES = np.array([1.0, 512.0, 32.0])


def _nonnegative_ridge(
    x: np.ndarray, y: np.ndarray, ridge: np.ndarray, prior: np.ndarray
) -> np.ndarray:
    """argmin_{theta >= 0} |y - x theta|^2 + sum_j ridge_j (theta_j - prior_j)^2 for x
    [n, 3], y [n] (module doc): the best of the ridge solutions over every subset of free
    coefficients whose solution is non-negative (the empty subset, theta = 0, always is)."""
    gram, rhs = x.T @ x, x.T @ y
    best, best_cost = np.zeros(3), np.inf
    for mask in range(8):
        free = [j for j in range(3) if mask >> j & 1]
        theta = np.zeros(3)
        if free:
            idx = np.ix_(free, free)
            theta[free] = np.linalg.solve(
                gram[idx] + np.diag(ridge[free]), rhs[free] + ridge[free] * prior[free]
            )
        if (theta < 0).any():
            continue
        resid = y - x @ theta
        cost = resid @ resid + ridge @ (theta - prior) ** 2
        if cost < best_cost:
            best, best_cost = theta, cost
    return best


class StepTimeModel:
    """t_ms = a + b * prefill_tokens + c * decode_batch, refitted after every step.

    Args:
        prior: (a, b, c) before any data (ms, ms/token, ms/request); None: zeros.
        window: steps kept for the fit (older ones are forgotten, so the model follows
            growing contexts and changing load).
        prior_weight: strength of the pull toward the prior, in squared-feature-scale
            units (module doc).
    """

    def __init__(
        self,
        prior: tuple[float, float, float] | None = None,
        window: int = 256,
        prior_weight: float = 1e-6,
    ):
        self.prior = np.array(prior if prior is not None else (0.0, 0.0, 0.0), dtype=np.float64)
        self.has_prior = prior is not None
        self.samples: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self.ridge = prior_weight / _SCALES**2
        self.theta = self.prior.copy()
        self.steps_seen = 0

    def observe(self, prefill_tokens: int, decode_batch: int, ms: float) -> None:
        """Record one measured step and refit."""
        self.samples.append((1.0, float(prefill_tokens), float(decode_batch), float(ms)))
        self.steps_seen += 1
        data = np.array(self.samples)
        self.theta = _nonnegative_ridge(data[:, :3], data[:, 3], self.ridge, self.prior)

    @property
    def ready(self) -> bool:
        """Whether predictions mean anything: a prior was given or a step was measured."""
        return self.has_prior or self.steps_seen > 0

    def predict_ms(self, prefill_tokens: int, decode_batch: int) -> float:
        """Predicted step time in ms (never below 0)."""
        a, b, c = self.theta
        return max(float(a + b * prefill_tokens + c * decode_batch), 0.0)

    def largest_prefill(self, limit_ms: float, decode_batch: int, cap: int) -> int:
        """The most prefill tokens (<= cap) whose step next to `decode_batch` decodes is
        predicted to take <= limit_ms (0 if even one token would not)."""
        a, b, c = self.theta
        room = limit_ms - (a + c * decode_batch)
        if room < 0:
            return 0
        if b <= 0:
            return cap
        return min(cap, int(room / b))

    def describe(self) -> dict[str, float | int | list[float] | None]:
        """The fitted and prior coefficients (ms, ms/token, ms/request) and steps seen."""
        a, b, c = (float(v) for v in self.theta)
        prior = [float(v) for v in self.prior] if self.has_prior else None
        return {
            "fixed_ms": a,
            "per_prefill_token_ms": b,
            "per_decode_request_ms": c,
            "prior": prior,
            "steps_seen": self.steps_seen,
            "window": len(self.samples),
        }
