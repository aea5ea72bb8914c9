"""The stream schedule over real HTTP: streamed ``n=k`` calls to a fake backend served by uvicorn on
loopback (aiohttp on the service side, as in production); the fake counts the streams and samples
it has open, finished and seen cancelled, and the tokens it sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.config import BackendConfig, Settings
from app.main import create_app
from tests.support.metrics import sample
from tests.support.serving import serving
from ttc_tools.fakes.backend import FakeOpenAI


@contextlib.asynccontextmanager
async def service(*fakes: FakeOpenAI, **kw: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serving(f)) for f in fakes]
        backends = [BackendConfig(url=u, name=f"fake{i}", serialize_seeded=False) for i, u in enumerate(urls)]
        pool = {"cooldown_s": 30.0, "retry_backoff_s": 0.0, "health_interval_s": 3600.0, **kw.pop("pool", {})}
        settings = Settings(backends=backends, default_model="fake-model", store={"url": "sqlite+aiosqlite://"},
                            answers={"prestart": False}, pool=pool, **kw)
        app = create_app(settings)
        await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=30))
        yield client


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Poll ``condition`` (a counter the fake updates) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def ask(prompt: str, policy: dict[str, Any], **ttc: Any) -> dict[str, Any]:
    # seeded: every sample's length (spread=K) is then the same from run to run
    return {"model": "fake-model", "messages": [{"role": "user", "content": prompt}], "seed": 7,
            "ttc": {"policy": policy, "schedule": {"mode": "stream", "width": 8}, **ttc}}


EAGER = {"allocator": "adaptive_consistency", "params": {"per_round": 8, "lookahead": False, "threshold": 0.9}}
"""Keeps 8 samples in flight; unanimous samples decide it after 3, when the others are cancelled."""


async def test_a_decided_query_cancels_its_in_flight_streams() -> None:
    fake = FakeOpenAI(p_correct=1.0, token_latency_s=0.01)
    async with service(fake) as c:
        resp = await c.post("/v1/chat/completions", json=ask("spread=40 What is 2 + 40?", EAGER))
        assert resp.status_code == 200, resp.text
        ttc, usage = resp.json()["ttc"], resp.json()["usage"]
        assert ttc["schedule"] == "stream" and ttc["answer"] == "40"
        assert ttc["samples_drawn"] >= 3 and ttc["samples_cancelled"] >= 1
        await until(lambda: fake.streams["open"] == 0, "cancelled streams were left open")
        # one call of 8 at first, then one more sample each time one finished undecided (the last one may be
        # cancelled before it reached the backend: samples arrive as they finish, not token by token)
        started = ttc["samples_drawn"] + ttc["samples_cancelled"]
        assert started == 8 + ttc["samples_drawn"] - 1
        assert started - 1 <= fake.streams["samples_started"] <= started
        assert fake.streams["started"] == fake.streams["samples_started"] - 7
        assert fake.streams["cancelled"] >= 1 and fake.streams["samples_cancelled"] <= ttc["samples_cancelled"]
        # what the cancelled samples had sent is billed; what was still in the socket cannot be seen
        assert 0 < ttc["tokens_cancelled"] <= usage["completion_tokens"] <= fake.streams["tokens"]
        assert usage["completion_tokens"] - ttc["tokens_cancelled"] >= 3 * 9


async def test_stream_never_overspends_a_token_budget_counting_in_flight_samples() -> None:
    fake = FakeOpenAI(p_correct=0.5, token_latency_s=0.002)
    async with service(fake) as c:
        for budget in (40, 75, 160):
            body = ask("spread=20 What is 2 + 40?", {"allocator": "fixed", "params": {"n": 8}},
                       budget={"max_tokens": budget})
            resp = await c.post("/v1/chat/completions", json={**body, "max_tokens": 30})
            assert resp.status_code == 200, resp.text
            ttc = resp.json()["ttc"]
            assert resp.json()["usage"]["completion_tokens"] <= budget
            assert ttc["samples_drawn"] + ttc["samples_cancelled"] <= 8


async def test_client_disconnect_closes_every_stream() -> None:
    fake = FakeOpenAI(p_correct=0.5, token_latency_s=0.05)
    async with service(fake) as c:
        task = asyncio.create_task(c.post("/v1/chat/completions", json=ask(
            "spread=200 What is 2 + 40?", {"allocator": "fixed", "params": {"n": 6}})))
        await until(lambda: fake.streams["samples_started"] == 6, "the six samples never started")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await until(lambda: fake.streams["open"] == 0, "the stream was still open after the client left")
        assert fake.streams["cancelled"] == 1 and fake.streams["samples_cancelled"] == 6


async def test_deadline_cancels_everything_and_answers_with_what_finished() -> None:
    fake = FakeOpenAI(p_correct=1.0, stall_after=2)  # two samples finish, the other six hang
    async with service(fake, pool={"stream_interval": 1}) as c:  # every token reported: billed exactly
        resp = await c.post("/v1/chat/completions", json=ask(
            "What is 2 + 40?", {"allocator": "fixed", "params": {"n": 8}},
            budget={"deadline_ms": 1000}, partial_on_deadline=True))
        assert resp.status_code == 200, resp.text
        ttc = resp.json()["ttc"]
        assert ttc["partial"] is True and ttc["stop_reason"] == "deadline" and ttc["answer"] == "40"
        assert (ttc["samples_drawn"], ttc["samples_cancelled"]) == (2, 6)
        assert ttc["tokens_cancelled"] == 6  # one token each before they hung
        await until(lambda: fake.streams["open"] == 0, "the stream was still open after the deadline")
        assert fake.streams["cancelled"] == 1 and fake.streams["samples_cancelled"] == 6


async def test_a_backend_dying_mid_stream_is_retried_elsewhere_and_counted_once() -> None:
    dying = FakeOpenAI(p_correct=1.0, break_after=4)
    healthy = FakeOpenAI(p_correct=1.0)
    async with service(dying, healthy) as c:
        resp = await c.post("/v1/chat/completions", json=ask(
            "What is 2 + 40?", {"allocator": "fixed", "params": {"n": 1}}))
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["ttc"]["samples_drawn"] == 1 and body["ttc"]["answer"] == "40"
        # the first pick is the dying backend (both idle: the first listed); it broke after 4 tokens
        assert dying.streams["broken"] == 1 and dying.streams["samples_finished"] == 0
        assert healthy.streams["finished"] == 1
        # the sample is billed once, for the attempt that delivered it
        assert body["usage"]["completion_tokens"] == 9


@pytest.mark.parametrize("mode", ["rounds", "stream"])
async def test_both_schedules_answer_alike(mode: str) -> None:
    fake = FakeOpenAI(p_correct=1.0, keep_bodies=True)
    async with service(fake) as c:
        body = ask("What is 2 + 40?", {"allocator": "fixed", "params": {"n": 4}})
        body["ttc"]["schedule"] = mode
        resp = await c.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        ttc = resp.json()["ttc"]
        assert (ttc["schedule"], ttc["samples_drawn"], ttc["answer"]) == (mode, 4, "40")
        assert fake.calls == 1 and fake.bodies[0].get("stream", False) == (mode == "stream")




async def test_width_narrows_under_load_and_widens_when_idle() -> None:
    """With a capacity of 4 streamed samples, a request arriving while another holds all 4 gets width
    1 (its samples go one call at a time); once the load is gone the full width is granted again."""
    fake = FakeOpenAI(p_correct=1.0, token_latency_s=0.02)
    async with service(fake, limits={"stream_capacity": 4}) as c:
        async def gauge() -> float:
            return sample((await c.get("/metrics")).text, "ttc_sampling_width")

        hog = asyncio.create_task(c.post("/v1/chat/completions", json=ask(
            "spread=400 What is 2 + 40?", {"allocator": "fixed", "params": {"n": 4}})))
        await until(lambda: fake.streams["samples_started"] == 4, "the first request never held 4 samples")
        assert await gauge() == 8  # what ask() asks for
        resp = await c.post("/v1/chat/completions", json=ask(
            "What is 2 + 40?", {"allocator": "fixed", "params": {"n": 4}}))
        assert resp.status_code == 200 and resp.json()["ttc"]["samples_drawn"] == 4
        assert await gauge() == 1 and fake.streams["max_open"] == 2  # one call at a time beside the hog's
        assert fake.streams["started"] == 1 + 4
        hog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hog
        await until(lambda: fake.streams["open"] == 0, "the first request's streams stayed open")
        resp = await c.post("/v1/chat/completions", json=ask(
            "What is 2 + 40?", {"allocator": "fixed", "params": {"n": 4}}))
        assert resp.status_code == 200 and await gauge() == 8


async def test_deepconf_cuts_unsure_traces_mid_way_and_they_do_not_vote() -> None:
    """The fake is sure (top alternatives far below) of right answers and unsure of wrong ones: after
    4 warmup traces set the threshold, wrong traces are cut 4 tokens in by the engine (the fake cuts as
    vLLM with the monitor plugin does)."""
    fake = FakeOpenAI(p_correct=0.6, token_latency_s=0.002, keep_bodies=True)
    # keep 10 (DeepConf-low): the threshold is the 90th percentile of the warmup's confidences
    policy = {"allocator": "deepconf", "params": {"warmup": 4, "keep": 10, "window": 4, "max_samples": 16,
                                                  "consensus": 0.99},
              "schedule": {"mode": "stream", "width": 4}}
    async with service(fake) as c:
        resp = await c.post("/v1/chat/completions", json={
            "model": "fake-model", "seed": 11, "messages": [{"role": "user", "content": "spread=30 What is 2 + 40?"}],
            "ttc": {"policy": policy, "return_samples": True}})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        ttc = body["ttc"]
        cut = [s for s in ttc["samples"] if s["finish_reason"] == "cut"]
        assert ttc["samples_cut"] == len(cut) >= 1 and ttc["tokens_saved"] > 0
        assert all(s["answer"] is None and s["tokens"] <= 5 for s in cut)  # stopped right after the window
        assert "40" in ttc["votes"] and ttc["answer"] == "40"
        assert sum(ttc["votes"].values()) + ttc["truncated"] == ttc["samples_drawn"] and ttc["truncated"] >= len(cut)
        assert all(s["confidence"] is not None for s in ttc["samples"])
        await until(lambda: fake.streams["open"] == 0, "streams were left open")
        sent = body["usage"]["completion_tokens"]
        assert sent == sum(s["tokens"] for s in ttc["samples"]) + ttc["tokens_cancelled"]
        # the warmup is one call of 4 traces, run whole; the later calls ask the engine to cut theirs, several
        # traces a call (each cut on its own, inside the engine: no event per token, no call per trace)
        assert all(b.get("top_logprobs") == 5 for b in fake.bodies)
        assert fake.bodies[0]["n"] == 4 and "vllm_xargs" not in fake.bodies[0]
        later = fake.bodies[1:]
        assert later and all(b["vllm_xargs"]["ttc_monitor_window"] == 4 and 3 in b["stop_token_ids"] for b in later)
        assert len(fake.bodies) < ttc["samples_drawn"] + ttc["samples_cancelled"]


async def test_a_one_sample_stream_relays_the_backend_text_as_it_comes() -> None:
    fake = FakeOpenAI(p_correct=1.0, keep_bodies=True)
    async with service(fake) as c:
        body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "What is 2 + 40?"}],
                "ttc": {"policy": "single"}}
        async with c.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in [x async for x in resp.aiter_lines()] if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events if e != "[DONE]"]
        pieces = [ch["choices"][0]["delta"]["content"] for ch in chunks
                  if ch["choices"] and ch["choices"][0]["delta"].get("content")]
        assert len(pieces) == 9  # the fake's nine tokens, one chunk each, not one chunk at the end
        assert "".join(pieces) == "Let me work it out. The answer is 40."
        final = [ch for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
        assert final[-1]["ttc"]["answer"] == "40" and final[-1]["ttc"]["schedule"] == "stream"
        assert fake.bodies[0]["stream"] is True and fake.bodies[0]["n"] == 1
