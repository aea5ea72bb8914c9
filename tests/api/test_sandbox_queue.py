"""A full sandbox queue through the service: a key's program that would wait behind its key's whole share
is refused with a 429, one that would wait behind everyone's with a 503, each in the error envelope with
Retry-After; the operator's own requests (no key) wait instead."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.config import _resolve_env_refs
from tests.api.test_code_answers import PROGRAMS, PROMPT, Scripted
from tests.conftest import fake_settings, service_client

pytestmark = pytest.mark.sandbox

ADMIN = {"Authorization": "Bearer admin-secret"}
POLICY = {"allocator": "fixed", "params": {"n": 2}, "aggregator": "best_of_n", "verifier": "code_tests"}
TESTS = {"asserts": "assert add(2, 3) == 5"}


def request() -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT}],
            "ttc": {"policy": POLICY, "tests": TESTS}}


@pytest.fixture
def monkeyenv(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("TEST_TTC_ADMIN", "admin-secret")
    return _resolve_env_refs({"enabled": True, "admin_keys": ["os.environ/TEST_TTC_ADMIN"]})


@contextlib.asynccontextmanager
async def user_service(auth: dict[str, Any], sandbox: dict[str, Any]) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                            dict[str, str]]]:
    # two distinct programs per request, one slot: the second program has to wait for the first
    settings = fake_settings(["fake-a"], auth=auth, sandbox={"max_concurrent": 1, **sandbox})
    async with service_client(settings, {"fake-a": Scripted(PROGRAMS[:2])}) as client:
        made = await client.post("/v1/keys", json={"name": "user", "role": "user"}, headers=ADMIN)
        assert made.status_code == 201, made.text
        yield client, {"Authorization": f"Bearer {made.json()['key']}"}


@pytest.mark.parametrize(("sandbox", "status", "code", "type_"), [
    ({"max_queued_per_key": 0}, 429, "sandbox_queue_full", "rate_limit_error"),
    ({"max_queued": 0}, 503, "sandbox_overloaded", "service_unavailable"),
])
async def test_a_full_queue_is_a_clear_error(monkeyenv: dict[str, Any], sandbox: dict[str, Any], status: int,
                                             code: str, type_: str) -> None:
    async with user_service(monkeyenv, sandbox) as (client, user):
        resp = await client.post("/v1/chat/completions", json=request(), headers=user)
        assert resp.status_code == status, resp.text
        err = resp.json()["error"]
        assert (err["code"], err["type"]) == (code, type_) and "waiting for the sandbox" in err["message"]
        assert int(resp.headers["retry-after"]) >= 1
        admin = await client.post("/v1/chat/completions", json=request(), headers=ADMIN)  # no key id: waits
        assert admin.status_code == 200, admin.text
