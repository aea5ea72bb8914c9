"""Speculative width: while the backends say they are idle (vLLM's /metrics: nothing waiting, few
requests running), a streamed policy starts at once about as many samples as its queries usually
need, instead of one launch wave after another; saturated backends get exactly what the allocator
asks for; the surplus is cancelled (and billed for what it generated) once the query is decided; a
request that asks for ``priority: tokens`` never speculates.

Real HTTP: the fake backend is served by uvicorn on loopback and reports its load in vLLM's series."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.test_stream_schedule import service
from tests.support.waiting import until
from ttc_tools.fakes.backend import FakeOpenAI

POLL = {"load_interval_s": 0.02}


def ask(i: int, policy: str = "adaptive", **ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "seed": i, "ttc": {"policy": policy, **ttc},
            "messages": [{"role": "user", "content": f"spread=4 Question {i}: p_correct=0.6 what is 2 + 40?"}]}


async def run(c: httpx.AsyncClient, n: int, **ttc: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        resp = await c.post("/v1/chat/completions", json=ask(i, **ttc))
        assert resp.status_code == 200, resp.text
        out.append(resp.json()["ttc"])
    return out


def engine(c: httpx.AsyncClient) -> Any:
    return c._transport.app.state.ttc.engine  # type: ignore[attr-defined]


async def test_idle_backends_start_a_querys_usual_need_at_once() -> None:
    fake = FakeOpenAI(token_latency_s=0.002, keep_bodies=True)
    async with service(fake, pool=POLL) as c:
        learn = await run(c, 8)  # the first queries teach the policy's need
        assert learn[0]["samples_speculative"] == 0  # nothing known yet
        assert engine(c).speculation("unknown policy", 0) == 0
        need = engine(c).speculation(next(iter(engine(c)._needs)), 0)
        assert need > 4  # adaptive's queries here need ~10 samples (median); its own first wave asks for 4
        for priority, first_call, speculative in ((None, min(need, 8), True), ("tokens", 4, False)):
            since = len(fake.bodies)
            ttc = (await run(c, 1, **({"priority": priority} if priority else {})))[0]
            assert fake.bodies[since]["n"] == first_call, priority  # the request's first call
            assert (ttc["samples_speculative"] > 0) == speculative
        metrics = (await c.get("/metrics")).text.splitlines()
        line = [x for x in metrics if x.startswith('ttc_speculative_samples_total{policy="adaptive"}')]
        assert line and float(line[0].split()[-1]) > 0


async def test_saturated_backends_get_exactly_what_the_allocator_asks() -> None:
    fake = FakeOpenAI(token_latency_s=0.002)
    async with service(fake, pool=POLL) as c:
        await run(c, 8)
        fake.load_waiting = 3  # vLLM queues requests: no room for speculation
        pool = c._transport.app.state.ttc.source  # type: ignore[attr-defined]
        await until(lambda: pool.busy() == 1.0, what="the load poll to see the queue")
        assert all(t["samples_speculative"] == 0 for t in await run(c, 6))
        fake.load_waiting = 0
        await until(lambda: pool.busy() < 0.5, what="the queue to drain")
        assert sum(t["samples_speculative"] for t in await run(c, 6)) > 0


async def test_the_surplus_is_cancelled_and_billed_once_the_query_is_decided() -> None:
    fake = FakeOpenAI(p_correct=0.6, token_latency_s=0.005)
    async with service(fake, pool=POLL) as c:
        for i in range(12):  # confident: one sure sample decides; the ones started with it are surplus
            resp = await c.post("/v1/chat/completions", json=ask(i, "confident"))
            assert resp.status_code == 200
        ttcs = [(await c.post("/v1/chat/completions", json=ask(100 + i, "confident"))).json() for i in range(8)]
        spec = [b for b in ttcs if b["ttc"]["samples_speculative"]]
        assert spec, "no request speculated"
        assert any(b["ttc"]["samples_cancelled"] for b in spec)
        for b in spec:  # cancelled samples are billed what they had generated
            assert b["usage"]["completion_tokens"] >= b["ttc"]["tokens_cancelled"]
        await until(lambda: fake.streams["open"] == 0, what="every surplus stream to be closed")
