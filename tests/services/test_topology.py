"""The local scale-out topology: two ``ttc serve`` replicas behind HAProxy, sharing one PostgreSQL store
and one Redis, in front of one fake backend. Requests through the load balancer are spread over both
replicas, streamed answers pass through as they are made, and when a replica is SIGKILLed (also with
requests in flight on it) the load balancer fails over: every request still succeeds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ttc_tools.bench import procs, topology
from ttc_tools.bench.topology import MissingBinary, Topology

pytestmark = pytest.mark.services

TOKEN_LATENCY_MS = 60
STREAMED_N2 = {"allocator": "fixed", "params": {"n": 2}, "schedule": "stream"}
SLOW = "What is 2 + 40? spread=30"  # each sample 9 to 39 tokens: a request takes 0.54 to 2.3 s at the backend


@pytest.fixture(scope="module")
def topo() -> Iterator[Topology]:
    for check in (topology.postgres_bindir, topology.redis_exe, topology.haproxy_exe):
        try:
            check()
        except MissingBinary as exc:
            pytest.skip(str(exc))
    with Topology(replicas=2, backends=1, latency_ms=5, token_latency_ms=TOKEN_LATENCY_MS,
                  check_interval_ms=500) as topo:
        yield topo


def chat(policy: Any = "single", content: str = "What is 2 + 40?", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], "ttc": {"policy": policy},
            **extra}


def served_ok(url: str) -> float:
    """Requests this replica answered (its ``ttc_requests_total{outcome="ok"}`` over every policy)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) if fam.name == "ttc_requests"
               for s in fam.samples if s.name == "ttc_requests_total" and s.labels.get("outcome") == "ok")


def test_requests_through_the_balancer_reach_both_replicas_and_one_store(topo: Topology) -> None:
    before = [served_ok(r.url) for r in topo.replicas]
    with httpx.Client(base_url=topo.url, timeout=30) as client:
        got = [client.post("/v1/chat/completions", json=chat({"allocator": "fixed", "params": {"n": 2}}))
               for _ in range(12)]
        assert [r.status_code for r in got] == [200] * 12, [r.text for r in got if r.status_code != 200]
        assert all(r.json()["ttc"]["samples_drawn"] == 2 for r in got)
        r = client.post("/v1/policies", json={"name": "via-lb", "allocator": "fixed", "params": {"n": 3}})
        assert r.status_code == 201, r.text
    served = [served_ok(r.url) - b for r, b in zip(topo.replicas, before, strict=True)]
    assert sum(served) == 12 and min(served) >= 3, served  # round-robin: both replicas took a share
    rows = topo.lb.servers()
    assert {name: row["status"] for name, row in rows.items()} == {"r1": "UP", "r2": "UP"}
    for replica in topo.replicas:  # written through one replica, read from each: the shared PostgreSQL store
        r = httpx.get(replica.url + "/v1/policies/via-lb", timeout=10)
        assert r.status_code == 200 and r.json()["spec"]["params"] == {"n": 3}, r.text


def test_streamed_answers_pass_through_unbuffered(topo: Topology) -> None:
    """A one-sample stream relays the backend's tokens as they come (``TOKEN_LATENCY_MS`` apart): the
    content chunks must reach the client spread over time, not in one burst at the end."""
    arrivals = []
    body = chat(content="What is 2 + 40? spread=12", stream=True)
    with httpx.stream("POST", topo.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":' in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) >= 9
    spread_ms = (arrivals[-1] - arrivals[0]) * 1000
    assert spread_ms >= 0.5 * TOKEN_LATENCY_MS * (len(arrivals) - 2), (len(arrivals), spread_ms)


def test_sigkilled_replica_fails_over(topo: Topology) -> None:
    """Runs last in this module: it kills replica r1."""
    victim, survivor = topo.replicas
    survivor_before = served_ok(survivor.url)
    with ThreadPoolExecutor(6) as pool, httpx.Client(base_url=topo.url, timeout=30) as client:
        in_flight = [pool.submit(client.post, "/v1/chat/completions", json=chat(STREAMED_N2, SLOW)) for _ in range(6)]
        # kill r1 while the balancer has requests open on it (none can have started its answer yet)
        procs.wait_until(lambda: int(topo.lb.servers()["r1"]["scur"]) >= 1, 10, what="a request in flight on r1",
                         interval=0.01)
        victim.kill()
        first = [f.result() for f in in_flight]
        after = [client.post("/v1/chat/completions", json=chat()) for _ in range(10)]
    assert victim.proc is not None and victim.proc.returncode == -9
    assert [r.status_code for r in first + after] == [200] * 16, [r.text for r in first + after if r.status_code != 200]
    assert served_ok(survivor.url) - survivor_before >= 10
    rows = topo.lb.servers()
    assert int(rows["r1"]["wredis"]) + int(rows["r1"]["wretr"]) >= 1, rows["r1"]  # a request was retried
    topo.lb.wait_status("DOWN", ["r1"], timeout=15)  # and the health check takes r1 out of rotation
    assert topo.lb.servers()["r2"]["status"] == "UP"
