"""Prometheus metrics of one server (`GET /metrics`), named after SGLang's ``sglang:*``.

Two sources:

* Request latencies and token counters are observed in the HTTP process, where each
  request's tokens arrive (`ServerMetrics` is the TokenizerManager's `RequestObserver`).
  Times are `time.perf_counter()` seconds, so they include the scheduler, the
  detokenizer and the IPC hops, but not HTTP transfer to the client.
* Scheduler state (running / waiting requests, KV token usage, cache hit rate,
  retractions, aborts) is read from the scheduler's `stats()` at scrape time through the
  existing `GetInfoReq` control call (`SchedulerStatsCollector`).

Definitions per request (N = output tokens):
    time_to_first_token = first token arrival - submit
    inter_token_latency = gap between successive token arrivals; a message carrying k
        tokens after the first counts k observations of gap / k (N - 1 in total when
        every message has one token)
    time_per_output_token = (last arrival - first arrival) / (N - 1), when N > 1
    e2e_request_latency = finish arrival - submit (finished requests only)
    queue_time = scheduler admission - scheduler arrival (reported by the scheduler)

Every server owns its `CollectorRegistry`, so several servers (or apps) in one process
never clash.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from radixlm.runtime.sched.finish import FinishReason
from radixlm.runtime.server.messages import BatchStrOut
from radixlm.runtime.server.request_observer import RequestObserver

PREFIX = "radixlm:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Bucket upper bounds in seconds (CPU steps are tens of ms; long prompts take seconds).
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
    5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class _Timing:
    """Arrival times of one in-flight request (seconds, perf_counter)."""

    __slots__ = ("submit", "first", "last", "tokens")

    def __init__(self, submit: float) -> None:
        self.submit = submit
        self.first: float | None = None
        self.last = submit
        self.tokens = 0


class ServerMetrics(RequestObserver):
    """The server's Prometheus registry and the request-level observations.

    Attributes: registry (this server's CollectorRegistry), scheduler (the collector to
    `update()` with `Scheduler.stats()` before each scrape).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, buckets=buckets, registry=r)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=r)

        self.ttft = hist(
            "time_to_first_token_seconds", "Submit to first output token (s).", LATENCY_BUCKETS
        )
        self.itl = hist(
            "inter_token_latency_seconds",
            "Gap between successive output tokens (s).",
            TOKEN_LATENCY_BUCKETS,
        )
        self.tpot = hist(
            "time_per_output_token_seconds",
            "Per request: (last - first token arrival) / (output tokens - 1) (s).",
            TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = hist("e2e_request_latency_seconds", "Submit to finish (s).", LATENCY_BUCKETS)
        self.queue = hist(
            "queue_time_seconds",
            "Time in the scheduler's waiting queue before first admission (s).",
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("generation_tokens", "Output tokens streamed.")
        self.cached_tokens = counter("cached_tokens", "Prompt tokens served from the prefix cache.")
        self.requests = counter("requests", "Requests ended, by finish reason.", ("finish_reason",))
        self.scheduler = SchedulerStatsCollector()
        r.register(self.scheduler)
        self._live: dict[str, _Timing] = {}

    # ---- RequestObserver ----------------------------------------------------------------

    def on_submit(self, rid: str, now: float) -> None:
        self._live[rid] = _Timing(now)

    def on_batch(self, batch: BatchStrOut, now: float) -> None:
        queue_times = batch.queue_times
        for i, rid in enumerate(batch.rids):
            t = self._live.get(rid)
            if t is None:
                continue
            n = len(batch.new_token_ids[i])
            if t.first is None and (n or batch.finish_reasons[i] is not None):
                self._on_first(t, batch, i, now, queue_times)
            elif n:
                gap = (now - t.last) / n
                for _ in range(n):
                    self.itl.observe(gap)
            if n:
                t.last = now
                t.tokens += n
                self.generation_tokens.inc(n)
            reason = batch.finish_reasons[i]
            if reason is not None:
                del self._live[rid]
                self.requests.labels(finish_reason=reason).inc()
                self.e2e.observe(now - t.submit)
                if t.tokens > 1 and t.first is not None:
                    self.tpot.observe((t.last - t.first) / (t.tokens - 1))

    def _on_first(self, t: _Timing, batch: BatchStrOut, i: int, now: float, queue_times) -> None:
        """First message of a request: its prompt counters, TTFT and queue time."""
        self.prompt_tokens.inc(batch.prompt_tokens[i])
        self.cached_tokens.inc(batch.cached_tokens[i])
        if i < len(queue_times) and queue_times[i] >= 0:
            self.queue.observe(queue_times[i])
        if batch.new_token_ids[i]:
            t.first = now
            self.ttft.observe(now - t.submit)
        else:  # finished without a token (aborted while waiting, max_tokens 0)
            t.first = None

    def on_abandoned(self, rid: str, now: float, refused: bool) -> None:
        if self._live.pop(rid, None) is not None and not refused:
            self.requests.labels(finish_reason=FinishReason.ABORT).inc()

    # ---- exposition -----------------------------------------------------------------------

    def render(
        self, scheduler_stats: dict[str, Any] | None, replicas: list[dict] | None = None
    ) -> bytes:
        """The text exposition format, with the scheduler gauges from `scheduler_stats`
        (`Scheduler.stats()`, the whole server's; None leaves the last values) and the
        per-replica ones from `replicas` (`/get_server_info`'s ``replicas``)."""
        if scheduler_stats is not None:
            self.scheduler.update(scheduler_stats, replicas)
        return generate_latest(self.registry)


class SchedulerStatsCollector:
    """Exposes the latest `Scheduler.stats()` snapshot as gauges and counters.

    Gauges: num_running_reqs, num_queue_reqs, token_usage ((total - free - evictable) /
    total KV tokens), cache_hit_rate (cached / prompt tokens since start),
    max_total_tokens, pinned_tokens (runtime/sched/pins.py), and the speculative-decoding
    figures spec_accept_length, spec_accept_rate, spec_draft_time_share (0 without
    speculation), hicache_capacity_tokens and hicache_used_tokens (the second KV tier,
    docs/hicache.md; 0 when off). Counters: retractions_total, aborts_total (scheduler-side
    counts, which include client disconnects and failed steps), and the second tier's
    hicache_{loaded,written}_tokens_total, hicache_{loaded,written}_bytes_total,
    hicache_load_seconds_total and hicache_corrupt_pages_total. With SLO scheduling
    (docs/slo.md; all 0 when off): the gauge slo_prefill_budget_tokens (the last step's
    chosen budget) and the counters slo_requests_total, slo_ttft_met_total,
    slo_tpot_met_total, slo_goodput_requests_total (both met), slo_rejected_total,
    slo_queued_late_total, slo_prefill_budget_tokens_total and slo_budget_steps_total (their
    ratio: the mean budget per extend step). Per scheduler replica,
    labelled ``dp_rank`` (one series per replica, also with --dp-size 1): the gauges
    replica_num_running_reqs, replica_num_queue_reqs, replica_cache_hit_rate and the
    counter replica_requests_routed_total (requests the front end sent that replica).
    """

    _GAUGES = (
        ("num_running_reqs", "num_running", "Requests decoding or prefilling."),
        ("num_queue_reqs", "num_waiting", "Requests in the waiting queue."),
        ("token_usage", "token_usage", "Fraction of KV slots held (not free or evictable)."),
        ("cache_hit_rate", "cache_hit_rate", "Cached / prompt tokens since start."),
        ("max_total_tokens", "total", "KV pool size in tokens."),
        ("pinned_tokens", "pinned", "KV tokens pinned by sessions and stored responses."),
        ("hicache_capacity_tokens", "tier_total", "Second KV tier size in tokens (0: off)."),
        ("hicache_used_tokens", "tier_used", "Second KV tier tokens holding cached prefixes."),
        (
            "spec_accept_length",
            "spec_accept_length",
            "Speculative decoding: tokens emitted per request per verify step (0: off).",
        ),
        (
            "spec_accept_rate",
            "spec_accept_rate",
            "Speculative decoding: accepted / proposed draft tokens.",
        ),
        (
            "spec_draft_time_share",
            "spec_draft_time_share",
            "Speculative decoding: time in the drafter / time in speculative steps.",
        ),
        (
            "slo_prefill_budget_tokens",
            "slo_prefill_budget",
            "SLO scheduling: the prefill token budget the last extend step chose (0: off).",
        ),
    )
    _COUNTERS = (
        ("retractions", "num_retracted_total", "Requests retracted under KV pressure."),
        ("aborts", "num_aborted_total", "Requests aborted in the scheduler."),
        (
            "hicache_loaded_tokens",
            "tier_tokens_loaded",
            "Second KV tier: tokens loaded back into the KV pool.",
        ),
        (
            "hicache_written_tokens",
            "tier_tokens_written",
            "Second KV tier: tokens written from the KV pool.",
        ),
        (
            "hicache_loaded_bytes",
            "tier_bytes_loaded",
            "Second KV tier: bytes copied into the KV pool.",
        ),
        (
            "hicache_written_bytes",
            "tier_bytes_written",
            "Second KV tier: bytes copied out of the KV pool.",
        ),
        ("hicache_load_seconds", "tier_load_seconds", "Second KV tier: seconds spent loading."),
        (
            "hicache_corrupt_pages",
            "tier_corrupt_pages",
            "Second KV tier: pages that failed their check (recomputed, never served).",
        ),
        ("slo_requests", "slo_finished_total", "SLO scheduling: finished requests judged."),
        ("slo_ttft_met", "slo_ttft_met_total", "SLO scheduling: requests meeting TTFT."),
        ("slo_tpot_met", "slo_tpot_met_total", "SLO scheduling: requests meeting TPOT."),
        (
            "slo_goodput_requests",
            "slo_both_met_total",
            "SLO scheduling: requests meeting both TTFT and TPOT (goodput).",
        ),
        (
            "slo_rejected",
            "slo_rejected_total",
            "SLO scheduling: requests refused at arrival (HTTP 429).",
        ),
        (
            "slo_queued_late",
            "slo_queued_late_total",
            "SLO scheduling: requests queued although their TTFT target looked unattainable.",
        ),
        (
            "slo_prefill_budget_tokens",
            "slo_prefill_budget_sum",
            "SLO scheduling: sum of the prefill budgets chosen (per step: / slo_budget_steps).",
        ),
        ("slo_budget_steps", "slo_budget_steps_total", "SLO scheduling: budgets chosen."),
    )

    _REPLICA_GAUGES = (
        ("replica_num_running_reqs", "num_running", "Requests running on the replica."),
        ("replica_num_queue_reqs", "num_waiting", "Requests waiting on the replica."),
        ("replica_cache_hit_rate", "cache_hit_rate", "Replica's cached / prompt tokens."),
    )

    def __init__(self) -> None:
        self._stats: dict[str, Any] = {}
        self._replicas: list[dict[str, Any]] = []

    def update(self, stats: dict[str, Any], replicas: list[dict] | None = None) -> None:
        """Replace the snapshot (a `Scheduler.stats()` dict, and the replicas' entries of
        `/get_server_info`)."""
        self._stats = dict(stats)
        self._replicas = list(replicas or [])

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._stats)

    def _families(self, s: dict[str, Any]) -> list[Metric]:
        out: list[Metric] = []
        for name, key, doc in self._GAUGES:
            out.append(GaugeMetricFamily(PREFIX + name, doc, value=float(s.get(key, 0))))
        for name, key, doc in self._COUNTERS:
            out.append(CounterMetricFamily(PREFIX + name, doc, value=float(s.get(key, 0))))
        for name, key, doc in self._REPLICA_GAUGES:
            family = GaugeMetricFamily(PREFIX + name, doc, labels=("dp_rank",))
            for r in self._replicas:
                family.add_metric((str(r["dp_rank"]),), float(r[key]))
            out.append(family)
        routed = CounterMetricFamily(
            PREFIX + "replica_requests_routed",
            "Requests the front end sent to the replica.",
            labels=("dp_rank",),
        )
        for r in self._replicas:
            routed.add_metric((str(r["dp_rank"]),), float(r["requests_routed"]))
        out.append(routed)
        return out
