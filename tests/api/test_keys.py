"""API keys: roles (401 / 403), hashed storage, per-key default policy and per-minute limits (429)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

ADMIN = {"Authorization": "Bearer admin-secret"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(**ttc: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}]}
    if ttc:
        body["ttc"] = ttc
    return body


@pytest.fixture
async def api(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("TEST_TTC_ADMIN", "admin-secret")
    from app.config import _resolve_env_refs

    auth = _resolve_env_refs({"enabled": True, "admin_keys": ["os.environ/TEST_TTC_ADMIN"]})
    async with service_client(fake_settings(["fake-a"], auth=auth), {"fake-a": fake}) as c:
        yield c


async def make_key(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await api.post("/v1/keys", json=body, headers=ADMIN)
    assert r.status_code == 201, r.text
    return r.json()


def assert_error(r: httpx.Response, status: int, type_: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == type_
    return err


async def test_missing_bad_and_wrong_role(api: httpx.AsyncClient) -> None:
    assert (await api.get("/health")).status_code == 200  # liveness needs no key
    err = assert_error(await api.post("/v1/chat/completions", json=chat()), 401, "authentication_error")
    assert err["code"] == "missing_api_key"
    assert_error(await api.post("/v1/chat/completions", json=chat(), headers=bearer("ttc-nope-nope")), 401,
                 "authentication_error")
    assert_error(await api.get("/v1/policies", headers=bearer("garbage")), 401, "authentication_error")
    user = await make_key(api, name="alice", role="user")
    assert user["key"].startswith(f"ttc-{user['id']}-")
    r = await api.post("/v1/chat/completions", json=chat(policy="single"), headers=bearer(user["key"]))
    assert r.status_code == 200, r.text
    err = assert_error(await api.get("/v1/policies", headers=bearer(user["key"])), 403, "permission_error")
    assert err["code"] == "admin_required"
    assert_error(await api.post("/v1/keys", json={}, headers=bearer(user["key"])), 403, "permission_error")
    # an admin key made through the API manages policies; keys are stored hashed only
    admin = await make_key(api, role="admin")
    r = await api.post("/v1/policies", json={"name": "p", "allocator": "fixed"}, headers=bearer(admin["key"]))
    assert r.status_code == 201
    listed = (await api.get("/v1/keys", headers=ADMIN)).json()["data"]
    assert {k["id"] for k in listed} == {user["id"], admin["id"]} and all("key" not in k for k in listed)
    state = api.app.state.ttc  # type: ignore[attr-defined]
    row = await state.store.get_key(user["id"])
    assert row.hash == hashlib.sha256(user["key"].encode()).hexdigest() and user["key"] not in row.hash
    # revocation is immediate
    r = await api.delete(f"/v1/keys/{user['id']}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["revoked"] is True
    assert_error(await api.post("/v1/chat/completions", json=chat(), headers=bearer(user["key"])), 401,
                 "authentication_error")
    assert (await api.delete("/v1/keys/nothere", headers=ADMIN)).status_code == 404


async def test_key_default_policy_and_binding(api: httpx.AsyncClient) -> None:
    await api.post("/v1/policies", json={"name": "three", "allocator": "fixed", "params": {"n": 3}}, headers=ADMIN)
    r = await api.post("/v1/keys", json={"default_policy": "ghost"}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["param"] == "default_policy"
    key = await make_key(api, default_policy="three")
    resp = (await api.post("/v1/chat/completions", json=chat(), headers=bearer(key["key"]))).json()
    assert resp["ttc"]["policy"]["name"] == "three" and resp["ttc"]["samples_drawn"] == 3
    resp = (await api.post("/v1/chat/completions", json=chat(policy="single"), headers=bearer(key["key"]))).json()
    assert resp["ttc"]["policy"]["name"] == "single"  # the request's choice wins over the key's
    r = await api.delete("/v1/policies/three", headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["code"] == "policy_in_use"
    r = await api.delete("/v1/policies/three", params={"force": "true"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["unbound_keys"] == [key["id"]]
    resp = (await api.post("/v1/chat/completions", json=chat(), headers=bearer(key["key"]))).json()
    assert resp["ttc"]["policy"]["name"] == "default"


async def test_request_and_sample_limits(api: httpx.AsyncClient) -> None:
    key = await make_key(api, requests_per_minute=3)
    codes = [(await api.post("/v1/chat/completions", json=chat(policy="single"), headers=bearer(key["key"])))
             for _ in range(4)]
    assert [r.status_code for r in codes] == [200, 200, 200, 429]
    err = assert_error(codes[-1], 429, "rate_limit_error")
    assert err["code"] == "rate_limit_exceeded"
    assert 1 <= int(codes[-1].headers["retry-after"]) <= 20
    other = await make_key(api, requests_per_minute=3)  # limits are per key
    assert (await api.post("/v1/chat/completions", json=chat(policy="single"),
                           headers=bearer(other["key"]))).status_code == 200

    samples = await make_key(api, samples_per_minute=5)
    four = {"allocator": "fixed", "params": {"n": 4}}
    got = [(await api.post("/v1/chat/completions", json=chat(policy=four), headers=bearer(samples["key"])))
           for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 429]  # 4 + 4 drawn > 5: the third waits
    assert int(got[-1].headers["retry-after"]) >= 30  # 3 samples of debt + 1 at 5/min
    # batches count against the same limits
    batch = {"prompts": ["What is 1 + 1?"], "budget": {"total_samples": 2}, "policy": "uniform"}
    assert (await api.post("/v1/ttc/batches", json=batch, headers=bearer(samples["key"]))).status_code == 429


RM_POLICY = {"allocator": "fixed", "params": {"n": 1}, "aggregator": "best_of_n",
             "verifier": {"name": "reward_model",
                          "params": {"url": "http://internal-admin:9000/v1/keys?", "model": "m"}}}


async def test_a_user_key_cannot_point_the_service_at_an_address(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    user = await make_key(api, role="user")
    resp = await api.post("/v1/chat/completions", json=chat(policy=RM_POLICY), headers=bearer(user["key"]))
    assert resp.status_code == 403
    err = resp.json()["error"]
    assert err["param"] == "ttc.policy.verifier.params.url" and err["code"] == "network_target_forbidden"
    assert fake.calls == 0  # refused before anything was drawn
    batch = {"model": "fake-model", "prompts": ["1 + 1"], "budget": {"mean_samples": 1}, "policy": RM_POLICY}
    resp = await api.post("/v1/ttc/batches", json=batch, headers=bearer(user["key"]))
    assert resp.status_code == 403 and resp.json()["error"]["param"] == "policy.verifier.params.url"


async def test_an_admin_may_and_a_target_body_is_never_reflected(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    resp = await api.post("/v1/chat/completions", json=chat(policy=RM_POLICY), headers=ADMIN)
    assert resp.status_code == 502  # no such host here: unreachable, said without any of its content
    assert resp.json()["error"]["code"] == "verifier_failed"


async def test_with_auth_on_only_health_is_open(api: httpx.AsyncClient) -> None:
    assert (await api.get("/health")).status_code == 200
    for path in ("/metrics", "/v1/models", "/v1/models/fake-model", "/ready", "/docs", "/openapi.json"):
        resp = await api.get(path)
        assert resp.status_code == 401, path
        assert resp.json()["error"]["type"] == "authentication_error"
        assert (await api.get(path, headers=ADMIN)).status_code == 200, path
    user = await make_key(api, role="user")
    assert (await api.get("/metrics", headers={"x-api-key": user["key"]})).status_code == 200


async def test_public_paths_are_configurable(fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = {"enabled": True, "admin_keys": ["k"], "public_paths": ["/health", "/metrics", "/ready"]}
    async with service_client(fake_settings(["fake-a"], auth=auth), {"fake-a": fake}) as c:
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/ready")).status_code == 200
        assert (await c.get("/v1/models")).status_code == 401


async def test_a_batch_belongs_to_the_key_that_made_it(api: httpx.AsyncClient) -> None:
    alice, bob = await make_key(api, role="user"), await make_key(api, role="user")
    body = {"model": "fake-model", "prompts": ["1 + 1"] * 40, "budget": {"mean_samples": 1}}
    created = await api.post("/v1/ttc/batches", json=body, headers=bearer(alice["key"]))
    assert created.status_code == 202
    batch_id = created.json()["id"]
    assert (await api.get(f"/v1/ttc/batches/{batch_id}", headers=bearer(alice["key"]))).status_code == 200
    other = await api.get(f"/v1/ttc/batches/{batch_id}", headers=bearer(bob["key"]))
    assert other.status_code == 404 and other.json()["error"]["code"] == "batch_not_found"  # as if it did not exist
    assert (await api.get(f"/v1/ttc/batches/{batch_id}", headers=ADMIN)).status_code == 200


async def test_revoking_a_key_cancels_its_running_batches(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    alice, bob = await make_key(api, role="user"), await make_key(api, role="user")
    fake.stall_after = 0  # every stream hangs after its first token: the batches keep running
    body = {"model": "fake-model", "prompts": [f"Q{i}: {i}" for i in range(4)], "budget": {"total_samples": 40},
            "background": True, "schedule": "stream"}
    mine = (await api.post("/v1/ttc/batches", json=body, headers=bearer(alice["key"]))).json()["id"]
    other = (await api.post("/v1/ttc/batches", json=body, headers=bearer(bob["key"]))).json()["id"]
    r = await api.delete(f"/v1/keys/{alice['id']}", headers=ADMIN)
    assert r.status_code == 200 and r.json()["revoked"] is True and r.json()["cancelled_batches"] == [mine]
    assert (await api.get(f"/v1/ttc/batches/{mine}", headers=ADMIN)).json()["status"] == "cancelled"
    assert (await api.get(f"/v1/ttc/batches/{other}", headers=ADMIN)).json()["status"] in ("queued", "in_progress")
    assert (await api.get("/v1/models", headers=bearer(alice["key"]))).status_code == 401
