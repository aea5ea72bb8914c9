"""Verifier params from a user key are bounded like the request's own fields (a 400 naming the param,
before anything is drawn), and an admin's reward-model template is checked when the policy is saved."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.config import _resolve_env_refs
from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

ADMIN = {"Authorization": "Bearer admin-secret"}


def judged(**params: Any) -> dict[str, Any]:
    policy = {"allocator": "fixed", "params": {"n": 4}, "aggregator": "best_of_n",
              "verifier": {"name": "llm_judge", "params": params}}
    return {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}],
            "ttc": {"policy": policy}}


@contextlib.asynccontextmanager
async def service(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> AsyncIterator[tuple[
        httpx.AsyncClient, dict[str, str]]]:
    monkeypatch.setenv("TEST_TTC_ADMIN", "admin-secret")
    auth = _resolve_env_refs({"enabled": True, "admin_keys": ["os.environ/TEST_TTC_ADMIN"]})
    async with service_client(fake_settings(["fake-a"], auth=auth, **settings), {"fake-a": fake}) as client:
        made = await client.post("/v1/keys", json={"name": "user", "role": "user"}, headers=ADMIN)
        assert made.status_code == 201, made.text
        yield client, {"Authorization": f"Bearer {made.json()['key']}"}


@pytest.fixture
async def api(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                          dict[str, str]]]:
    async with service(fake, monkeypatch) as pair:
        yield pair


@pytest.fixture
async def strict_api(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                                                                 dict[str, str]]]:
    async with service(fake, monkeypatch, limits={"max_tokens": 1000, "max_prompt_chars": 20_000}) as pair:
        yield pair


@pytest.mark.parametrize(("params", "field"), [
    ({"max_tokens": 10**12}, "max_tokens"),  # reached the backend
    ({"rubric": "grade it " * 400_000}, "rubric"),  # 3.6 MB, sent once per candidate
])
async def test_judge_params_beyond_any_limit_are_refused(api: tuple[httpx.AsyncClient, dict[str, str]],
                                                         fake: FakeOpenAI, params: dict[str, Any], field: str) -> None:
    client, user = api
    resp = await client.post("/v1/chat/completions", json=judged(**params), headers=user)
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["error"]["param"] == f"ttc.policy.verifier.params.{field}"
    assert fake.calls == 0


@pytest.mark.parametrize(("params", "field", "limit"), [
    ({"max_tokens": 1001}, "max_tokens", "1000"),  # limits.max_tokens, as a request's own max_tokens
    ({"rubric": "r" * 20_001}, "rubric", "20000"),  # limits.max_prompt_chars, as a request's prompt
])
async def test_judge_params_are_held_to_the_configured_limits(strict_api: tuple[httpx.AsyncClient, dict[str, str]],
                                                              fake: FakeOpenAI, params: dict[str, Any], field: str,
                                                              limit: str) -> None:
    client, user = strict_api
    resp = await client.post("/v1/chat/completions", json=judged(**params), headers=user)
    assert resp.status_code == 400, resp.text[:300]
    err = resp.json()["error"]
    assert err["param"] == f"ttc.policy.verifier.params.{field}" and f"limit of {limit}" in err["message"]
    batch = {"model": "fake-model", "prompts": ["What is 1 + 1?"], "budget": {"mean_samples": 2},
             "policy": judged(**params)["ttc"]["policy"]}
    resp = await client.post("/v1/ttc/batches", json=batch, headers=user)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == f"policy.verifier.params.{field}"
    assert fake.calls == 0
    ok = await client.post("/v1/chat/completions", json=judged(max_tokens=1000), headers=user)
    assert ok.status_code == 200, ok.text[:300]


@pytest.mark.parametrize("template", ["{0}", "{response!r:>99999999}", "{prompt.__class__.__name__}"])
async def test_a_reward_model_template_is_checked_when_the_policy_is_saved(
        api: tuple[httpx.AsyncClient, dict[str, str]], template: str) -> None:
    client, _ = api
    body = {"name": "rm", "allocator": "fixed", "params": {"n": 2}, "aggregator": "best_of_n",
            "verifier": {"name": "reward_model", "params": {"url": "http://rm:8000", "model": "rm",
                                                            "template": template}}}
    resp = await client.post("/v1/policies", json=body, headers=ADMIN)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == "verifier.params.template" and "{prompt} and {response}" in err["message"]
    assert (await client.get("/v1/policies/rm", headers=ADMIN)).status_code == 404
