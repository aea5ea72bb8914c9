"""A client's regex answer kind through the service: a pattern whose RE2 program is too large is refused
when it arrives (a 400 naming the pattern, before anything is drawn), and an allowed pattern is matched
in an answer worker, so the event loop keeps serving while it runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

import app.answers.structured as structured
from tests.conftest import fake_settings, service_client
from tests.support import held_regex
from tests.unit.test_answer_pool import started_pid
from ttc_tools.fakes.backend import FakeOpenAI

HOSTILE = r"((?:[a-z]?){1000}[a-z]{1000})"  # 3,006 RE2 instructions: 0.2-2.3 s per 16 KiB sample
LARGE = r"(?:[a-z ]{0,300})answer is (\d+)"  # 918 instructions: allowed (the limit is 1,000)


def chat(**ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "Name a number."}],
            "ttc": {"policy": "single", **ttc}}


@pytest.fixture
def hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TTC_TEST_HOLD_DIR", str(tmp_path))  # spawned workers inherit it
    monkeypatch.setenv("TTC_TEST_LOOP_PID", str(os.getpid()))
    monkeypatch.setattr(structured, "regex_answers", held_regex.held_regex_answers)
    return tmp_path


@pytest.mark.parametrize(("ttc", "param"), [
    ({"answer": {"kind": "regex", "params": {"pattern": HOSTILE}}}, "ttc.answer.params.pattern"),
    ({"policy": {"allocator": "fixed", "params": {"n": 8},
                 "answer": {"kind": "regex", "params": {"pattern": HOSTILE}}}}, "ttc.policy.answer.params.pattern"),
    ({"answer": {"kind": "regex", "params": {"pattern": r"(\pL{1000})", "ignore_case": True}}},
     "ttc.answer.params.pattern"),
])
async def test_a_pattern_too_large_is_refused_when_it_arrives(client: httpx.AsyncClient, fake: FakeOpenAI,
                                                              ttc: dict[str, Any], param: str) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(**ttc))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param
    assert "too large" in err["message"] and "1000 RE2 instructions" in err["message"]
    assert fake.calls == 0


async def test_a_large_allowed_pattern_is_matched_off_the_event_loop(hold: Path) -> None:
    fake = FakeOpenAI(style="number", p_correct=1.0)
    async with service_client(fake_settings(["fake-a"]), {"fake-a": fake}) as client:
        answer = {"kind": "regex", "params": {"pattern": LARGE}}
        chat_task = asyncio.create_task(client.post("/v1/chat/completions", json=chat(answer=answer)))
        started = asyncio.create_task(started_pid(hold))  # a worker is matching (and holds until released)
        await asyncio.wait({chat_task, started}, return_when=asyncio.FIRST_COMPLETED)
        assert started.done(), f"answered without an answer worker ({chat_task.result().text[:200]})"
        health = await client.get("/health")
        assert health.status_code == 200
        assert not chat_task.done()  # the request waits for its worker; the loop does not
        (hold / "release").write_text("go")
        resp = await chat_task
        assert resp.status_code == 200, resp.text
        assert resp.json()["ttc"]["answer"] == "42"
        assert resp.json()["ttc"]["answer_kind"] == "regex"
