"""Overhead benchmark: the same requests sent directly to a backend and through the service.

Each of ``concurrency`` clients alternates direct and proxied requests (interleaved, so both see
the same machine load). Through the service the request uses the ``single`` policy (one sample,
one backend call) so the difference is the service's own cost: parsing, policy resolution, the
engine loop, answer extraction, the second HTTP hop. Latencies go into HdrHistograms; the report
gives p50/p99 of both paths and the added overhead.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx
from hdrh.histogram import HdrHistogram


@dataclass
class Result:
    target: str
    concurrency: int
    requests: int
    direct: HdrHistogram
    proxied: HdrHistogram
    errors: int

    def row(self) -> dict[str, Any]:
        def ms(h: HdrHistogram, q: float) -> float:
            return h.get_value_at_percentile(q) / 1000.0

        return {
            "target": self.target, "concurrency": self.concurrency, "requests": self.requests,
            "direct_p50_ms": ms(self.direct, 50), "direct_p99_ms": ms(self.direct, 99),
            "service_p50_ms": ms(self.proxied, 50), "service_p99_ms": ms(self.proxied, 99),
            "added_p50_ms": ms(self.proxied, 50) - ms(self.direct, 50),
            "added_p99_ms": ms(self.proxied, 99) - ms(self.direct, 99),
            "errors": self.errors,
        }


async def run_overhead(backend_url: str, service_url: str, body: dict[str, Any], *, target: str,
                       concurrency: int = 16, requests: int = 800, warmup: int = 32) -> Result:
    """Send ``requests`` pairs (direct + through the service), ``concurrency`` at a time."""
    direct = HdrHistogram(1, 600_000_000, 3)  # microseconds
    proxied = HdrHistogram(1, 600_000_000, 3)
    errors = 0
    proxied_body = {**body, "ttc": {"policy": "single"}}
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(url: str, payload: dict[str, Any], hist: HdrHistogram | None) -> None:
            nonlocal errors
            start = time.perf_counter()
            resp = await client.post(url + "/v1/chat/completions", json=payload)
            elapsed_us = int((time.perf_counter() - start) * 1e6)
            if resp.status_code != 200:
                errors += 1
            elif hist is not None:
                hist.record_value(max(1, elapsed_us))

        await asyncio.gather(*(one(u, p, None) for _ in range(warmup // 2)
                               for u, p in ((backend_url, body), (service_url, proxied_body))))
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        async def worker(w: int) -> None:
            while not queue.empty():
                i = queue.get_nowait()
                pair = [(backend_url, body, direct), (service_url, proxied_body, proxied)]
                if (i + w) % 2:
                    pair.reverse()
                for url, payload, hist in pair:
                    await one(url, payload, hist)

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return Result(target, concurrency, requests, direct, proxied, errors)
