"""Crash safety: a burst of policy writes, the service SIGKILLed mid-burst, restarted; every write
that was acknowledged (a 2xx reached the client) is present and reads back the same."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.services

WORKERS = 8
KILL_AFTER_ACKS = 120


async def burst(url: str, pid: int) -> tuple[list[tuple[str, int, int]], int]:
    """Writers until the service dies; kills it (SIGKILL) once ``KILL_AFTER_ACKS`` writes are acked.
    Returns the acknowledged (name, version, n) and how many writes were in flight or failed."""
    acked: list[tuple[str, int, int]] = []
    unacked = 0
    killed = asyncio.Event()

    async def worker(i: int, client: httpx.AsyncClient) -> None:
        nonlocal unacked
        name, n = f"w{i}", 1
        while True:
            body = {"allocator": "fixed", "params": {"n": n}}
            try:
                if n == 1:
                    r = await client.post("/v1/policies", json={"name": name, **body})
                else:
                    r = await client.put(f"/v1/policies/{name}", json=body)
            except httpx.HTTPError:
                unacked += 1
                return
            if r.status_code not in (200, 201):
                unacked += 1
                return
            acked.append((name, r.json()["version"], n))
            n += 1
            if len(acked) >= KILL_AFTER_ACKS and not killed.is_set():
                killed.set()
                os.kill(pid, signal.SIGKILL)  # other writers are mid-request right now

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.wait_for(asyncio.gather(*(worker(i, client) for i in range(WORKERS))), 120)
    return acked, unacked


def test_acknowledged_writes_survive_sigkill(tmp_path: Path, services: Any, postgres: Any) -> None:
    """SQLite (file, WAL) and PostgreSQL side by side (started together to save start-up time)."""
    urls = {"sqlite": f"sqlite+aiosqlite:///{tmp_path / 'data' / 'ttc.db'}", "postgres": postgres.create_db()}

    def config(url: str) -> dict[str, Any]:
        return {"store": {"url": url}, "backends": [{"url": "http://127.0.0.1:9"}], "default_model": "m",
                "pool": {"health_interval_s": 3600}}

    first = {b: services(config(u)).start() for b, u in urls.items()}
    for svc in first.values():
        svc.wait_ready()
    results: dict[str, tuple[list[tuple[str, int, int]], int, float]] = {}
    for backend, svc in first.items():
        assert svc.proc is not None
        t0 = time.monotonic()
        acked, unacked = asyncio.run(burst(svc.url, svc.proc.pid))
        results[backend] = (acked, unacked, time.monotonic() - t0)
        svc.proc.wait(10)
        assert svc.proc.returncode == -signal.SIGKILL
        assert len(acked) >= KILL_AFTER_ACKS

    second = {b: services(config(u)).start() for b, u in urls.items()}
    failures = {}
    for backend, svc in second.items():
        svc.wait_ready()
        acked, unacked, burst_s = results[backend]
        missing = []
        with httpx.Client(base_url=svc.url, timeout=30) as client:
            for name, version, n in acked:
                r = client.get(f"/v1/policies/{name}", params={"version": version})
                if r.status_code != 200 or r.json()["spec"]["params"] != {"n": n}:
                    missing.append((name, version, n, r.status_code))
            latest = {p["name"]: p["version"] for p in client.get("/v1/policies").json()["data"]}
        assert all(latest[name] >= version for name, version, _ in acked)
        report = (f"{backend}: {len(acked)} acknowledged, {len(acked) - len(missing)} found after SIGKILL, "
                  f"{unacked} in flight/unacknowledged, burst {burst_s:.2f} s")
        print(report)
        with contextlib.suppress(OSError):
            (Path(os.environ.get("TTC_CRASH_REPORT_DIR", tmp_path)) / f"crash-{backend}.txt").write_text(report)
        if missing:
            failures[backend] = missing[:10]
    assert not failures, failures
