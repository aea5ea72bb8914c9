"""Prometheus metrics, one registry per app (no process-global collectors)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """The service's series. ``samples_saved`` counts, per query, the policy's cap minus samples drawn."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ttc_requests", "Requests by policy and outcome", ["policy", "outcome"], registry=r)
        self.samples = Counter("ttc_samples_drawn", "Samples drawn from backends", ["policy"], registry=r)
        self.samples_saved = Counter(
            "ttc_samples_saved", "Samples not drawn compared with the per-query cap", ["policy"], registry=r
        )
        self.rounds = Histogram(
            "ttc_rounds", "Rounds per request", ["policy"], buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
            registry=r,
        )
        self.stop_reasons = Counter("ttc_stop_reasons", "Why runs stopped", ["policy", "reason"], registry=r)
        self.tokens = Counter("ttc_tokens", "Tokens spent (prompt/completion)", ["policy", "kind"], registry=r)
        self.backend_latency = Histogram(
            "ttc_backend_latency_seconds", "Latency of one backend call", ["backend"], buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_errors = Counter("ttc_backend_errors", "Failed backend calls", ["backend", "kind"], registry=r)
        self.answer_fallbacks = Counter(
            "ttc_answer_fallbacks", "Answers keyed by normalised text because the worker's key did not come "
            "(timeout, busy, error, no_sandbox, code)", ["reason"], registry=r,
        )
        self.sampling_width = Gauge(
            "ttc_sampling_width", "Width the stream schedule last granted a query (narrowed under load)",
            registry=r, multiprocess_mode="livemin")
        self.stream_in_flight = Gauge("ttc_stream_samples_in_flight", "Streamed samples in flight", registry=r,
                                      multiprocess_mode="livesum")
        self.backend_busy = Gauge("ttc_backend_busy", "How busy the backends last said they are (0 idle, 1 saturated: "
                                  "requests waiting, or running at capacity)", registry=r,
                                  multiprocess_mode="livemax")
        self.speculative = Counter("ttc_speculative_samples", "Samples started beyond what the allocator asked for, "
                                   "while the backends were idle", ["policy"], registry=r)
        self.batches_running = Gauge("ttc_batches_running", "Background batches this replica runs", registry=r,
                                     multiprocess_mode="livesum")
        self.batch_takeovers = Counter("ttc_batch_takeovers", "Batches this replica took over from a replica whose "
                                       "lease ran out", registry=r)
        self.request_latency = Histogram(
            "ttc_request_latency_seconds", "End-to-end latency of inference requests", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )

        self._series: LRUCache[str, PolicySeries] = LRUCache(1024)

    def policy(self, name: str) -> PolicySeries:
        """The per-policy series of one policy, looked up once (``labels()`` costs on every request)."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = PolicySeries(
                self.requests.labels(name, "ok"), self.samples.labels(name), self.samples_saved.labels(name),
                self.rounds.labels(name), self.tokens.labels(name, "prompt"), self.tokens.labels(name, "completion"))
        return series

    def render(self) -> bytes:
        """The text exposition; summed over every worker process when ``ttc serve --workers`` runs
        several (prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``)."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class PolicySeries:
    ok: Any
    samples: Any
    saved: Any
    rounds: Any
    prompt_tokens: Any
    completion_tokens: Any
