"""A backend that hangs (a SIGSTOPped process: connections accepted, nothing answered) fails its calls
within the stream and call timeouts, is taken out (its circuit opens: no request reaches it, and a
request that has nowhere else to go fails at once saying why), and comes back once a probe succeeds.

Real HTTP: the fakes are served by uvicorn on loopback, the service calls them through aiohttp."""

from __future__ import annotations

import time
from typing import Any

from tests.api.test_stream_schedule import service
from tests.support.waiting import until
from ttc_tools.fakes.backend import FakeOpenAI

FAST = {"first_token_timeout_s": 0.5, "token_timeout_s": 0.3, "request_timeout_s": 0.8, "cooldown_s": 30.0}


def chat(policy: str) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}],
            "ttc": {"policy": policy}}


async def test_a_stream_that_never_starts_fails_within_the_first_token_timeout() -> None:
    hung = FakeOpenAI(latency_s=3600)  # accepts the call, never answers
    async with service(hung, pool=FAST) as c:
        start = time.monotonic()
        resp = await c.post("/v1/chat/completions", json=chat("adaptive"))
        took = time.monotonic() - start
        assert resp.status_code == 503, resp.text
        message = resp.json()["error"]["message"]
        assert "fake0" in message and "down" in message, message
        assert took < 5  # the first-token timeout (0.5 s), not the call timeout (600 s)
        calls = hung.calls
        resp = await c.post("/v1/chat/completions", json=chat("adaptive"))  # the circuit is open
        assert resp.status_code == 503 and "down" in resp.json()["error"]["message"]
        assert hung.calls == calls  # nothing more was sent to it


async def test_a_stream_that_stops_midway_fails_within_the_token_timeout() -> None:
    stalled = FakeOpenAI(p_correct=1.0, stall_after=0)  # one token per sample, then silence
    async with service(stalled, pool=FAST) as c:
        resp = await c.post("/v1/chat/completions", json=chat("adaptive"))
        assert resp.status_code == 503, resp.text
        assert "no data for 0.3s" in resp.json()["error"]["message"]
        await until(lambda: stalled.streams["open"] == 0, what="the stalled stream to be closed")


async def test_a_non_streamed_call_fails_within_the_call_timeout_and_the_other_backend_serves() -> None:
    hung, good = FakeOpenAI(latency_s=3600), FakeOpenAI(p_correct=1.0)
    async with service(hung, good, pool=FAST) as c:
        for _ in range(6):  # rounds: plain n=k calls
            resp = await c.post("/v1/chat/completions", json=chat("self-consistency-8"))
            assert resp.status_code == 200, resp.text
        assert hung.calls == 1  # timed out once, then taken out
        assert good.calls >= 6


async def test_the_error_counts_the_attempts_it_made() -> None:
    a, b = FakeOpenAI(fail_status=500), FakeOpenAI(fail_status=503)
    async with service(a, b, pool={"max_retries": 2}) as c:
        resp = await c.post("/v1/chat/completions", json=chat("self-consistency-8"))
        assert resp.status_code == 503
        assert a.calls + b.calls == 3
        assert "after 3 attempt(s)" in resp.json()["error"]["message"]


async def test_a_backend_whose_circuit_opened_comes_back_after_a_probe() -> None:
    flaky = FakeOpenAI(p_correct=1.0, fail_status=502)
    async with service(flaky, pool={"errors_to_open": 1, "cooldown_s": 0.2, "max_retries": 0}) as c:
        assert (await c.post("/v1/chat/completions", json=chat("single"))).status_code == 503
        assert (await c.post("/v1/chat/completions", json=chat("single"))).status_code == 503  # open: refused
        assert flaky.calls == 1
        flaky.fail_status = None
        pool = c._transport.app.state.ttc.source  # type: ignore[attr-defined]
        await until(lambda: pool.backends[0].down_until <= time.monotonic(), what="the cool-down to pass")
        assert (await c.post("/v1/chat/completions", json=chat("single"))).status_code == 200  # the probe
        assert not pool.backends[0].down_reason


async def test_one_missed_health_check_does_not_take_a_backend_out_two_in_a_row_do() -> None:
    """A busy server can miss one health check's timeout while it serves: only
    ``health_failures_to_open`` (2) failures in a row take it out."""
    fake = FakeOpenAI(p_correct=1.0)
    async with service(fake, pool={"health_interval_s": 3600}) as c:
        pool = c._transport.app.state.ttc.source  # type: ignore[attr-defined]
        backend = pool.backends[0]
        fake.healthy = False
        await pool.check_all()
        assert not backend.down_reason and backend.health_failures == 1
        assert (await c.post("/v1/chat/completions", json=chat("single"))).status_code == 200
        fake.healthy = True
        await pool.check_all()  # a pass resets the count
        fake.healthy = False
        await pool.check_all()
        assert not backend.down_reason
        await pool.check_all()
        assert backend.down_reason == "2 health checks failed in a row"
        assert (await c.post("/v1/chat/completions", json=chat("single"))).status_code == 503
