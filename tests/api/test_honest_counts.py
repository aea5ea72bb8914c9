"""Figures a client or operator reads are what happened: ``usage.prompt_tokens`` counts the prompt of
every backend call (streamed calls cancelled once their query was decided included), and the
streamed in-flight gauge returns to zero whatever ended a stream (a backend error, a cancel, a
deadline, a client that left, a retry on another backend).

The fake backend is served by uvicorn on loopback (aiohttp on the service side, as in production); it
counts the prompt tokens of the calls it worked on, as vLLM's ``prompt_tokens_total`` does."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.api.test_stream_schedule import service
from tests.support.metrics import sample
from tests.support.waiting import until
from ttc_tools.fakes.backend import FakeOpenAI


def chat(policy: Any, prompt: str = "What is 2 + 40?", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": prompt}], **extra}
    if policy is not None:
        body["ttc"] = {"policy": policy}
    return body


@pytest.mark.parametrize("policy", [None, "default", "adaptive", "confident", "deepconf", "single",
                                    "self-consistency-8"])
async def test_usage_counts_the_prompt_of_every_call(policy: str | None) -> None:
    fake = FakeOpenAI(p_correct=0.6, token_latency_s=0.002)
    async with service(fake) as c:
        for i in range(4):
            before = fake.streams["prompt_tokens"]
            resp = await c.post("/v1/chat/completions", json=chat(policy, f"spread=6 Question {i}: what is 2 + 40?"))
            assert resp.status_code == 200, resp.text
            await until(lambda: fake.streams["open"] == 0, what="the calls to end")
            billed, counted = resp.json()["usage"]["prompt_tokens"], fake.streams["prompt_tokens"] - before
            assert billed >= counted > 0  # never less than the backend counted (it was 0 or too low)
            # a call cancelled while on its way is billed though the backend may not have counted it yet
            per_call = max(1, len(f"spread=6 Question {i}: what is 2 + 40?") // 4)
            assert billed - counted <= per_call * resp.json()["ttc"]["samples_cancelled"], (billed, counted)


async def test_a_streamed_one_sample_request_counts_its_prompt() -> None:
    fake = FakeOpenAI(p_correct=1.0, token_latency_s=0.002)
    async with service(fake) as c:
        body = chat("single", stream=True, stream_options={"include_usage": True})
        async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            lines = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
        usage = httpx.Response(200, content=lines[-1][6:]).json()["usage"]
        assert usage["prompt_tokens"] == fake.streams["prompt_tokens"] > 0


async def gauge(c: httpx.AsyncClient) -> float:
    return sample((await c.get("/metrics")).text, "ttc_stream_samples_in_flight")


async def settled(c: httpx.AsyncClient) -> None:
    """The gauge reads 0 and the engine holds nothing (what the load-aware width reads)."""
    assert await gauge(c) == 0
    assert c._transport.app.state.ttc.engine.streaming == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["default", "adaptive", "deepconf"])
async def test_the_gauge_returns_to_zero_after_a_backend_error(policy: str) -> None:
    fake = FakeOpenAI(fail_status=400)
    async with service(fake) as c:
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=chat(policy))).status_code == 400
        await settled(c)


async def test_the_gauge_returns_to_zero_after_cancels_and_deadlines() -> None:
    fake = FakeOpenAI(p_correct=1.0, token_latency_s=0.01)
    eager = {"allocator": "adaptive_consistency", "params": {"per_round": 8, "lookahead": False},
             "schedule": {"mode": "stream", "width": 8}}
    async with service(fake) as c:
        resp = await c.post("/v1/chat/completions", json=chat(eager, "spread=40 What is 2 + 40?"))
        assert resp.status_code == 200 and resp.json()["ttc"]["samples_cancelled"] >= 1
        late = chat("adaptive", "spread=40 What is 2 + 40?")
        late["ttc"]["budget"] = {"deadline_ms": 50}
        assert (await c.post("/v1/chat/completions", json=late)).status_code == 504
        await settled(c)


async def test_the_gauge_returns_to_zero_when_the_client_leaves() -> None:
    fake = FakeOpenAI(p_correct=0.5, stall_after=0)  # every stream hangs after its first token
    async with service(fake) as c:
        task = asyncio.create_task(c.post("/v1/chat/completions", json=chat("adaptive")))
        await until(lambda: fake.streams["open"] > 0, what="the streams to open")
        assert await gauge(c) > 0
        task.cancel()  # the ASGI transport sends http.disconnect
        with pytest.raises(asyncio.CancelledError):
            await task
        await until(lambda: fake.streams["open"] == 0, what="the streams to close")
        await settled(c)


async def test_the_gauge_returns_to_zero_after_a_retry_elsewhere() -> None:
    broken, healthy = FakeOpenAI(break_after=2), FakeOpenAI(p_correct=1.0)
    async with service(broken, healthy) as c:
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=chat("adaptive"))).status_code == 200
        assert broken.streams["broken"] >= 1
        await settled(c)


async def test_progress_events_agree_with_themselves() -> None:
    """Each progress event is read when it happens: its votes never count more samples than it says
    were drawn (events are sent later than they are made, while the run moves on)."""
    fake = FakeOpenAI(p_correct=0.5, token_latency_s=0.001)
    async with service(fake) as c:
        for _ in range(3):
            async with c.stream("POST", "/v1/chat/completions", json=chat("adaptive", stream=True)) as resp:
                events = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
            progress = [e["ttc"] for e in (httpx.Response(200, content=x[6:]).json() for x in events)
                        if e.get("ttc") and "round" in e["ttc"]]
            assert progress
            for p in progress:
                assert sum(p["votes"].values()) <= p["samples_drawn"], p
