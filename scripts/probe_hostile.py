#!/usr/bin/env python
"""Hostile inputs against a live service, with ``/health`` probed throughout: does anything stall the loop?

Starts fake backends (``ttc fake-backend``) and ``ttc serve`` in front of them on loopback ports, then
for each attack probes ``/health`` every 20 ms on a connection of its own while the attack runs, and
prints the attack's statuses and time next to ``/health``'s p50 / p99 / max and failures:

* ``regex``: the catastrophic pattern ``((?:[a-z]?){1000}[a-z]{1000})`` as a request's answer kind, 8 at once;
* ``messages``: 100,000 one-letter messages in one chat request, 4 at once;
* ``judge``: an ``llm_judge`` verifier with ``max_tokens`` 10^12 and a 3.5 MB rubric, 4 at once;
* ``idle``: 3,000 connections opened and left idle, then ``/health`` on new connections;
* ``hung``: a service whose only backend is stopped (SIGSTOP): the time to the first error of a plain
  request, and of the next one (the backend's circuit is open by then).

Also the service's resident memory before and after. Usage (the service's venv)::

    .venv/bin/python scripts/probe_hostile.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TTC = str(Path(sys.executable).parent / "ttc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([TTC, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})


def wait_up(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not up after {timeout}s")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def probe_health(url: str, stop: asyncio.Event) -> tuple[list[float], int]:
    """``/health`` every 20 ms until ``stop``: latencies (ms) and failures (errors or non-200)."""
    times, failed = [], 0
    async with httpx.AsyncClient(timeout=10) as client:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                ok = (await client.get(url + "/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            times.append((time.perf_counter() - t) * 1000)
            failed += not ok
            await asyncio.sleep(0.02)
    return times, failed


async def under_probe(url: str, name: str, attack: Callable[[], Awaitable[str]]) -> None:
    stop = asyncio.Event()
    probe = asyncio.create_task(probe_health(url, stop))
    await asyncio.sleep(0.3)
    t = time.perf_counter()
    what = await attack()
    took = time.perf_counter() - t
    await asyncio.sleep(0.3)
    stop.set()
    times, failed = await probe
    q = statistics.quantiles(times, n=100, method="inclusive")
    print(f"{name:9} {what:48} {took:6.2f} s | /health p50 {q[49]:6.1f} ms  p99 {q[98]:7.1f} ms  "
          f"max {max(times):7.1f} ms  failed {failed}/{len(times)}", flush=True)


async def posts(url: str, body: dict[str, Any], k: int) -> str:
    async with httpx.AsyncClient(timeout=120) as client:
        got = await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=body) for _ in range(k)))
    codes = sorted({f"{r.status_code} {r.json().get('error', {}).get('code', '')}".strip() for r in got})
    return f"{k} x -> {', '.join(codes)}"


async def idle_connections(url: str, n: int) -> str:
    port = int(url.rsplit(":", 1)[1])
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        held.append(s)
    await asyncio.sleep(1.0)
    ok = 0
    for _ in range(50):  # a new connection each time
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                ok += (await client.get(url + "/health")).status_code == 200
        except httpx.HTTPError:
            pass
    for s in held:
        s.close()
    return f"{n} idle; /health on a new connection {ok}/50"


async def main() -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fake_port, hung_port, port, hung_svc = free_port(), free_port(), free_port(), free_port()
        procs.append(start(["fake-backend", "--port", str(fake_port), "--latency-ms", "5"]))
        hung_backend = start(["fake-backend", "--port", str(hung_port), "--latency-ms", "5"])
        procs.append(hung_backend)
        wait_up(f"http://127.0.0.1:{fake_port}/health")
        wait_up(f"http://127.0.0.1:{hung_port}/health")
        service = start(["serve", "--port", str(port), "--backend", f"http://127.0.0.1:{fake_port}"])
        procs.append(service)
        url = f"http://127.0.0.1:{port}"
        wait_up(url + "/ready")
        before = rss_mb(service.pid)
        plain = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
        print(f"service RSS at start {before:.0f} MB")
        await under_probe(url, "baseline", lambda: posts(url, plain, 8))
        regex = {**plain, "ttc": {"policy": {"allocator": "fixed", "params": {"n": 8}},
                                  "answer": {"kind": "regex", "params": {"pattern": "((?:[a-z]?){1000}[a-z]{1000})"}}}}
        await under_probe(url, "regex", lambda: posts(url, regex, 8))
        many = {"model": "fake-model", "messages": [{"role": "user", "content": "a"}] * 100_000}
        await under_probe(url, "messages", lambda: posts(url, many, 4))
        judge = {**plain, "ttc": {"policy": {
            "allocator": "fixed", "params": {"n": 8}, "aggregator": "best_of_n",
            "verifier": {"name": "llm_judge", "params": {"max_tokens": 10**12, "rubric": "x" * 3_500_000}}}}}
        await under_probe(url, "judge", lambda: posts(url, judge, 4))
        await under_probe(url, "idle", lambda: idle_connections(url, 3000))
        print(f"service RSS after the attacks {rss_mb(service.pid):.0f} MB (at start {before:.0f} MB)")

        hung = start(["serve", "--port", str(hung_svc), "--backend", f"http://127.0.0.1:{hung_port}"])
        procs.append(hung)
        hung_url = f"http://127.0.0.1:{hung_svc}"
        wait_up(hung_url + "/ready")
        os.kill(hung_backend.pid, signal.SIGSTOP)
        async with httpx.AsyncClient(timeout=600) as client:
            for which in ("first", "next"):
                t = time.perf_counter()
                r = await client.post(hung_url + "/v1/chat/completions", json=plain)
                print(f"hung      {which} request: {r.status_code} after {time.perf_counter() - t:.1f} s: "
                      f"{r.json()['error']['message'][:140]}", flush=True)
        os.kill(hung_backend.pid, signal.SIGCONT)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
