"""Through the service: answers that need math-verify are keyed in worker processes, so the event loop
keeps serving, and a deadline abandons the work (the worker is stopped)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

import app.answers.canon as canon_module
from tests.conftest import fake_settings, service_client
from tests.support import slow_work
from tests.support.waiting import exited
from tests.unit.test_answer_pool import started_pid
from ttc_tools.fakes.backend import FakeOpenAI


@pytest.fixture
def hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TTC_TEST_HOLD_DIR", str(tmp_path))
    monkeypatch.setattr(canon_module, "math_key", slow_work.held_math_key)
    return tmp_path


def body(**ttc: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Simplify x over 7"}],
            "ttc": {"policy": "single", **ttc}}


async def test_health_answers_while_a_parse_runs(hold: Path) -> None:
    fake = FakeOpenAI(style="math", p_correct=1.0)
    async with service_client(fake_settings(["fake-a"]), {"fake-a": fake}) as client:
        chat = asyncio.create_task(client.post("/v1/chat/completions", json=body()))
        await started_pid(hold)
        health = await client.get("/health")
        assert health.status_code == 200
        assert not chat.done()  # the request is still waiting for its worker, the loop is not
        (hold / "release").write_text("go")
        resp = await chat
        assert resp.status_code == 200
        assert resp.json()["ttc"]["answer"] == r"\frac{x}{7}"


async def test_deadline_abandons_the_parse(hold: Path) -> None:
    fake = FakeOpenAI(style="math", p_correct=1.0)
    async with service_client(fake_settings(["fake-a"]), {"fake-a": fake}) as client:
        chat = asyncio.create_task(client.post("/v1/chat/completions", json=body(budget={"deadline_ms": 1500})))
        pid = await started_pid(hold)
        resp = await chat
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "deadline_exceeded"
        assert os.getpid() != pid
        assert await exited(pid), "the worker kept parsing for a request that had given up"


async def test_parse_timeout_falls_back_and_is_counted(hold: Path) -> None:
    fake = FakeOpenAI(style="math", p_correct=1.0)
    settings = fake_settings(["fake-a"], answers={"prestart": False, "timeout_s": 0.3})
    async with service_client(settings, {"fake-a": fake}) as client:
        resp = await client.post("/v1/chat/completions", json=body())
        assert resp.status_code == 200
        assert resp.json()["ttc"]["answer"] == r"\frac{x}{7}"  # the normalised text
        metrics = (await client.get("/metrics")).text
        assert 'ttc_answer_fallbacks_total{reason="timeout"} 1.0' in metrics


async def test_answer_kind_per_request_and_bad_params(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}],
        "ttc": {"policy": "single", "answer": {"kind": "regex", "params": {"pattern": r"answer is (\d+)"}}}})
    assert resp.status_code == 200
    assert resp.json()["ttc"]["answer"] in {"40", "41", "42", "38", "39", "50"}
    resp = await client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "ttc": {"answer": {"kind": "regex", "params": {"pattern": "no group"}}}})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "ttc.answer.params"
    resp = await client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "ttc": {"answer": {"kind": "poetry"}}})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "ttc.answer.kind"
