"""Batch API against the fake backend: shared budget, sync vs background, validation."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.test_errors import assert_error
from ttc_tools.fakes.backend import FakeOpenAI


def batch(n: int = 4, **kw: Any) -> dict[str, Any]:
    prompts = [f"Question {i}: p_correct={0.3 + 0.2 * (i % 4):.1f} {10 + i}" for i in range(n)]
    return {"model": "fake-model", "prompts": prompts, "budget": {"mean_samples": 4}, **kw}


async def test_small_batch_answers_synchronously(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    refs = [str(10 + i) for i in range(6)]
    resp = await client.post("/v1/ttc/batches", json=batch(6, references=refs, seed=3))
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert data["status"] == "completed"
    assert len(data["results"]) == 6
    assert data["summary"]["samples_drawn"] <= 24
    assert fake.samples == data["summary"]["samples_drawn"]
    for row in data["results"]:
        assert row["samples"] >= 1  # everyone answered
        assert sum(row["allocation"]) == row["samples"]
        assert "correct" in row
    assert data["summary"]["accuracy"] == sum(r["correct"] for r in data["results"]) / 6


async def test_batch_with_the_confident_policy(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    # p_correct 0.3 / 0.5 / 0.7 / 0.9 (see batch()); a right sample weighs 0.91 and settles its prompt
    resp = await client.post("/v1/ttc/batches", json=batch(8, policy="confident", seed=4,
                                                           budget={"mean_samples": 6}))
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert fake.bodies[0]["logprobs"] == 1  # completions ask for the sampled token's log-prob only
    assert data["summary"]["samples_drawn"] <= 48
    assert all(1 <= row["samples"] <= 12 for row in data["results"])
    assert any(row["samples"] == 1 for row in data["results"]) and any(row["samples"] > 1 for row in data["results"])


async def test_large_batch_runs_in_background(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/ttc/batches", json=batch(40, budget={"total_samples": 80}))
    assert resp.status_code == 202
    job_id = resp.json()["id"]
    await client.app.state.ttc.batches.running[job_id]  # type: ignore[attr-defined]  # the job's own task
    view = (await client.get(f"/v1/ttc/batches/{job_id}")).json()
    assert view["status"] == "completed"
    assert view["progress"]["samples_drawn"] <= 80
    assert len(view["results"]) == 40


async def test_batch_validation(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    r = await client.post("/v1/ttc/batches", json=batch(5, budget={"total_samples": 4}))
    err = assert_error(r, 400, "budget.total_samples")
    assert "smaller than one sample per prompt" in err["message"]
    assert_error(await client.post("/v1/ttc/batches", json=batch(2, budget={})), 400, "budget")
    assert_error(await client.post("/v1/ttc/batches", json=batch(2, references=["1"])), 400, "references")
    assert_error(await client.post("/v1/ttc/batches", json=batch(2, policy="nope")), 404, "policy")
    assert_error(await client.post("/v1/ttc/batches", json={"budget": {"total_samples": 3}}), 400, None)
    assert_error(await client.get("/v1/ttc/batches/batch_unknown"), 404, "batch_id")
    assert fake.calls == 0
