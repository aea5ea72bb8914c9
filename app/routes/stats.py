"""A compact JSON view of the service's own metrics (for the console's overview), and who a key is.

* ``GET /v1/ttc/stats`` (same access as ``/metrics``) -> cumulative counters since start: requests by
  outcome, per policy the requests served, samples drawn, samples saved against the policy's cap,
  tokens and stop reasons; the request-latency histogram (``le`` bounds and cumulative counts, all
  routes summed); the backends (up, calls in flight, errors) and the stream schedule's gauges. A
  client gets rates and windowed percentiles from the difference of two snapshots. It reads the
  registry's current values, nothing more: O(series), no I/O.
* ``GET /v1/ttc/whoami`` (any key) -> the caller's role and name, and whether auth is on.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

from fastapi import APIRouter
from prometheus_client import CollectorRegistry

from app.deps import AuthDep, MetricsDep, ReaderDep, SourceDep, UserDep
from app.metrics import Metrics
from app.protocol import BackendStats, LatencyHistogram, PolicyStats, Stats, WhoAmI

router = APIRouter(tags=["system"])


def _registry(metrics: Metrics) -> Any:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # the sum over worker processes, as /metrics shows
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return metrics.registry


def summarise(registry: Any, backends: list[Any], now: float) -> Stats:
    """:class:`Stats` from a Prometheus registry's samples and the pool's backends."""
    requests: dict[str, float] = defaultdict(float)
    policies: dict[str, PolicyStats] = defaultdict(PolicyStats)
    buckets: dict[float, float] = defaultdict(float)
    lat_count = lat_sum = 0.0
    errors: dict[str, float] = defaultdict(float)
    calls: dict[str, float] = defaultdict(float)
    gauges: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            name, labels, value = s.name, s.labels, float(s.value)
            policy = labels.get("policy")
            if name == "ttc_requests_total":
                requests[labels["outcome"]] += value
                if labels["outcome"] == "ok":
                    policies[policy].requests += value
            elif name == "ttc_samples_drawn_total":
                policies[policy].samples += value
            elif name == "ttc_samples_saved_total":
                policies[policy].saved += value
            elif name == "ttc_tokens_total":
                kind = "prompt_tokens" if labels.get("kind") == "prompt" else "completion_tokens"
                setattr(policies[policy], kind, getattr(policies[policy], kind) + value)
            elif name == "ttc_stop_reasons_total":
                reasons = policies[policy].stop_reasons
                reasons[labels["reason"]] = reasons.get(labels["reason"], 0.0) + value
            elif name == "ttc_request_latency_seconds_bucket":
                buckets[float(labels["le"])] += value
            elif name == "ttc_request_latency_seconds_count":
                lat_count += value
            elif name == "ttc_request_latency_seconds_sum":
                lat_sum += value
            elif name == "ttc_backend_errors_total":
                errors[labels["backend"]] += value
            elif name == "ttc_backend_latency_seconds_count":
                calls[labels["backend"]] += value
            elif family.type == "gauge":
                gauges[name] = gauges.get(name, 0.0) + value
    bounds = sorted(buckets)
    mono = time.monotonic()
    return Stats(
        time=now, requests=dict(requests), policies=dict(policies),
        latency=LatencyHistogram(le=[min(b, 1e308) for b in bounds], counts=[buckets[b] for b in bounds],
                                 count=lat_count, sum=lat_sum),
        backends=[BackendStats(name=b.name, up=b.down_until <= mono, outstanding=b.outstanding,
                               errors=errors.get(b.name, 0.0), calls=calls.get(b.name, 0.0)) for b in backends],
        stream_samples_in_flight=gauges.get("ttc_stream_samples_in_flight", 0.0),
        sampling_width=gauges.get("ttc_sampling_width", 0.0),
        batches_running=gauges.get("ttc_batches_running", 0.0))


@router.get("/v1/ttc/stats")
async def stats(metrics: MetricsDep, source: SourceDep, _who: ReaderDep) -> Stats:
    """The service's metrics since start, as JSON (see the module docstring)."""
    return summarise(_registry(metrics), list(getattr(source, "backends", [])), time.time())


@router.get("/v1/ttc/whoami")
async def whoami(auth: AuthDep, who: UserDep) -> WhoAmI:
    """The caller as the service sees it (the console shows admin pages to admins only)."""
    return WhoAmI(role=who.role, name=who.name, key_id=who.key_id,
                  auth_enabled=bool(auth is not None and auth.enabled))
