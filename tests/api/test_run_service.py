"""Both adapters go through the one run service: batches are metered like requests, a failing
synchronous batch is an error status, and client-sent inline specs leave nothing behind."""

from __future__ import annotations

import gc
import os
from typing import Any

import httpx

from app.protocol import BatchView
from tests.support.metrics import sample
from ttc_tools.fakes.backend import FakeOpenAI


def batch(n: int = 3, **kw: Any) -> dict[str, Any]:
    return {"model": "fake-model", "prompts": [f"Q{i}: {10 + i}" for i in range(n)], "budget": {"mean_samples": 2},
            **kw}


async def test_a_batch_is_metered_like_a_request(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/ttc/batches", json=batch(policy="uniform"), headers={"x-request-id": "b-1"})
    assert resp.status_code == 200, resp.text
    BatchView.model_validate(resp.json())
    drawn = resp.json()["summary"]["samples_drawn"]
    text = (await client.get("/metrics")).text
    assert sample(text, "ttc_requests_total", policy="uniform", outcome="ok") == 1.0
    assert sample(text, "ttc_samples_drawn_total", policy="uniform") == drawn
    assert sample(text, "ttc_request_latency_seconds_count", route="batch") == 1.0
    assert sample(text, "ttc_rounds_count", policy="uniform") == 1.0
    assert sample(text, "ttc_tokens_total", policy="uniform", kind="completion") == 9 * drawn


async def test_a_failing_synchronous_batch_is_an_error_status(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.fail_status = 500
    resp = await client.post("/v1/ttc/batches", json=batch())
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "no_backend_available"
    text = (await client.get("/metrics")).text
    assert sample(text, "ttc_requests_total", policy="greedy", outcome="no_backend_available") == 1.0


async def test_a_failing_background_batch_says_failed(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.fail_status = 500
    resp = await client.post("/v1/ttc/batches", json=batch(background=True))
    assert resp.status_code == 202
    job_id = resp.json()["id"]
    await client.app.state.ttc.batches.running[job_id]  # type: ignore[attr-defined]  # the job's own task
    view = (await client.get(f"/v1/ttc/batches/{job_id}")).json()
    assert view["status"] == "failed" and view["error"]["code"] == "no_backend_available"


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_distinct_inline_specs_do_not_grow_memory(client: httpx.AsyncClient) -> None:
    preparer = client.app.state.ttc.preparer  # type: ignore[attr-defined]

    def body(i: int) -> dict[str, Any]:
        spec = {"allocator": "difficulty" if i % 2 else "fixed", "params": {"tokens_per_sample": 1 + i}}
        return {"model": "fake-model", "messages": [{"role": "user", "content": "1 + 1"}],
                "ttc": {"policy": spec, "budget": {"max_samples": 1}}}

    for i in range(200):  # warm up every code path first
        assert (await client.post("/v1/chat/completions", json=body(i))).status_code == 200
    gc.collect()
    before = rss_bytes()
    for i in range(200, 5200):
        resp = await client.post("/v1/chat/completions", json=body(i))
        assert resp.status_code == 200, resp.text
    gc.collect()
    grown = rss_bytes() - before
    assert len(preparer.parts) == 0  # nothing built for an inline spec is kept
    assert grown < 20 * 2**20, f"5,000 inline specs grew the process by {grown / 2**20:.1f} MiB"


async def test_stored_policies_share_a_bounded_cache(client: httpx.AsyncClient) -> None:
    preparer = client.app.state.ttc.preparer  # type: ignore[attr-defined]
    for name in ("single", "adaptive", "single"):
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "1 + 1"}], "ttc": {"policy": name}}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert len(preparer.parts) == 2
