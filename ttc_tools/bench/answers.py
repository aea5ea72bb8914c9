"""Answer-handling benchmark: does the text a backend returns decide whether the service stalls?

``clients`` closed-loop clients send chat requests (``policy``, default ``self-consistency-8``: one
8-sample call each) through the service to a fake backend whose samples are numbers, math, code or
prose (``ttc fake-backend --style``), for ``duration_s``; meanwhile a prober sends ``GET /health``
every ``probe_interval_s`` and records its latency. A service whose event loop blocks on answer
normalisation shows it in ``/health``'s p99 and in its request rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from hdrh.histogram import HdrHistogram


@dataclass
class AnswerLoad:
    style: str
    served: int
    errors: int
    timeouts: int
    duration_s: float
    health: HdrHistogram

    def row(self) -> dict[str, Any]:
        def ms(q: float) -> float:
            return self.health.get_value_at_percentile(q) / 1000.0

        return {"style": self.style, "served": self.served, "req_per_s": self.served / self.duration_s,
                "errors": self.errors, "timeouts": self.timeouts, "health_probes": self.health.get_total_count(),
                "health_p50_ms": ms(50), "health_p99_ms": ms(99), "health_max_ms": self.health.get_max_value() / 1000}


async def run_answer_load(service_url: str, style: str, *, clients: int = 16, duration_s: float = 20.0,
                          policy: str = "self-consistency-8", probe_interval_s: float = 0.05,
                          client_timeout_s: float = 30.0, seed: int = 0) -> AnswerLoad:
    """Closed-loop load plus a ``/health`` prober against a running service (see the module doc)."""
    health = HdrHistogram(1, 600_000_000, 3)  # microseconds
    served = errors = timeouts = 0
    rng = random.Random(seed)
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=service_url, timeout=client_timeout_s, limits=limits) as http:

        async def client() -> None:
            nonlocal served, errors, timeouts
            while time.monotonic() < stop_at:
                a, b = rng.randint(100, 999), rng.randint(10, 99)
                body = {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "temperature": 1.0,
                        "ttc": {"policy": policy}}
                try:
                    resp = await http.post("/v1/chat/completions", json=body)
                    if resp.status_code == 200:
                        served += 1
                    else:
                        errors += 1
                except httpx.TimeoutException:
                    timeouts += 1
                except httpx.HTTPError:
                    errors += 1

        async def prober() -> None:
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    await http.get("/health", timeout=client_timeout_s)
                health.record_value(max(1, int((time.perf_counter() - start) * 1e6)))
                await asyncio.sleep(probe_interval_s)

        started = time.monotonic()
        await asyncio.gather(prober(), *(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    return AnswerLoad(style, served, errors, timeouts, elapsed, health)
