"""Hook through which the HTTP process observes request progress (metrics, tracing).

The TokenizerManager calls an observer when a request is submitted, for every batch of
results it receives, and when a request ends without finishing (refused, client gone).
The default observer does nothing; `radixlm.frontend.metrics.ServerMetrics` records
Prometheus metrics. Times are `time.perf_counter()` seconds in the HTTP process.
"""

from __future__ import annotations

from radixlm.runtime.server.messages import BatchStrOut


class RequestObserver:
    """No-op base: subclasses override what they need. Calls come from the event loop
    thread only, and must not block (they run once per scheduler step)."""

    def on_submit(self, rid: str, now: float) -> None:
        """Request `rid` was sent to the scheduler at `now`."""

    def on_batch(self, batch: BatchStrOut, now: float) -> None:
        """One scheduler step's results arrived at `now` (may name rids never submitted
        through this observer, e.g. abandoned ones: ignore them)."""

    def on_abandoned(self, rid: str, now: float, refused: bool) -> None:
        """Request `rid` ended without a finish event: refused by the scheduler or the
        server (`refused`), else aborted by its client (disconnect)."""
