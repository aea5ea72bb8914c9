"""Policies as managed resources through the API: CRUD, versions, validation, defaults, snapshots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.store import open_store
from tests.conftest import fake_settings, service_client
from tests.support.waiting import until
from ttc_tools.fakes.backend import FakeOpenAI

FIXED2 = {"allocator": "fixed", "params": {"n": 2}, "aggregator": "majority"}


@pytest.fixture
async def api(fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    async with service_client(fake_settings(["fake-a"]), {"fake-a": fake}) as c:
        yield c


def chat(policy: Any = None, **ttc: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}]}
    if policy is not None:
        ttc["policy"] = policy
    if ttc:
        body["ttc"] = ttc
    return body


async def test_create_read_update_versions(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/policies", json={"name": "fast", **FIXED2, "description": "two samples"})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["version"] == 1 and created["spec"]["params"] == {"n": 2}
    assert created["description"] == "two samples" and created["default"] is False

    r = await api.put("/v1/policies/fast", json={"allocator": "fixed", "params": {"n": 3}})
    assert r.status_code == 200 and r.json()["version"] == 2
    r = await api.patch("/v1/policies/fast", json={"params": {"n": 5}, "budget": {"max_samples": 8}})
    assert r.status_code == 200, r.text
    v3 = r.json()
    assert v3["version"] == 3 and v3["spec"]["params"] == {"n": 5} and v3["spec"]["budget"]["max_samples"] == 8
    assert v3["spec"]["aggregator"] == "majority"

    latest = (await api.get("/v1/policies/fast")).json()
    assert latest["version"] == 3 and latest["latest_version"] == 3
    old = (await api.get("/v1/policies/fast", params={"version": 1})).json()
    assert old["version"] == 1 and old["spec"]["params"] == {"n": 2} and old["latest_version"] == 3
    versions = (await api.get("/v1/policies/fast/versions")).json()["data"]
    assert [v["version"] for v in versions] == [1, 2, 3]

    listing = (await api.get("/v1/policies")).json()
    names = {p["name"]: p for p in listing["data"]}
    assert names["fast"]["version"] == 3
    assert listing["default"] == "default" and names["default"]["default"] is True  # built-ins are stored
    assert (await api.get("/v1/policies/fast", params={"version": 9})).status_code == 404

    # conditional update: stale expected_version is a 409
    r = await api.put("/v1/policies/fast", json={**FIXED2, "expected_version": 2})
    assert r.status_code == 409 and r.json()["error"]["code"] == "version_conflict"
    r = await api.put("/v1/policies/fast", json={**FIXED2, "expected_version": 3})
    assert r.status_code == 200 and r.json()["version"] == 4


async def test_validation_errors_name_the_field(api: httpx.AsyncClient) -> None:
    cases = [
        ({"name": "x", "allocator": "nope"}, "allocator", "unknown_allocator"),
        ({"name": "x", "allocator": "fixed", "params": {"n": 0}}, "params.n", "invalid_value"),
        ({"name": "x", "allocator": "fixed", "params": {"bogus": 1}}, "params.bogus", "unknown_field"),
        ({"name": "x", "allocator": "fixed", "aggregator": "nope"}, "aggregator", "unknown_aggregator"),
        ({"name": "x", "allocator": "fixed", "verifier": "nope"}, "verifier.name", "unknown_verifier"),
        ({"name": "x", "allocator": "fixed", "budget": {"max_samples": 0}}, "budget.max_samples", "invalid_value"),
        ({"name": "x", "allocator": "fixed", "colour": "red"}, "colour", "unknown_field"),
        ({"name": "bad name!", "allocator": "fixed"}, "name", "invalid_value"),
        ({"allocator": "fixed"}, "name", "invalid_value"),
    ]
    for body, param, code in cases:
        r = await api.post("/v1/policies", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == code, (body, err)
        assert err["type"] == "invalid_request_error"
    await api.post("/v1/policies", json={"name": "x", **FIXED2})
    r = await api.patch("/v1/policies/x", json={"params": {"n": -1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "params.n"
    assert (await api.get("/v1/policies/x")).json()["version"] == 1  # nothing written
    r = await api.post("/v1/policies", json={"name": "x", **FIXED2})
    assert r.status_code == 409 and r.json()["error"]["code"] == "policy_exists"
    assert (await api.put("/v1/policies/ghost", json=FIXED2)).status_code == 404
    assert (await api.patch("/v1/policies/ghost", json=FIXED2)).status_code == 404


async def test_default_policy_and_delete_rules(api: httpx.AsyncClient) -> None:
    await api.post("/v1/policies", json={"name": "mine", **FIXED2})
    r = await api.put("/v1/settings/default_policy", json={"policy": "mine"})
    assert r.status_code == 200 and r.json()["policy"] == "mine"
    assert (await api.put("/v1/settings/default_policy", json={"policy": "ghost"})).json()["error"]["param"] == "policy"
    resp = (await api.post("/v1/chat/completions", json=chat())).json()
    assert resp["ttc"]["policy"]["name"] == "mine" and resp["ttc"]["policy"]["version"] == 1
    assert resp["ttc"]["samples_drawn"] == 2

    r = await api.delete("/v1/policies/mine")
    assert r.status_code == 409 and r.json()["error"]["code"] == "policy_is_default"
    r = await api.delete("/v1/policies/mine", params={"force": True})
    assert r.status_code == 200 and r.json()["default_policy"] == "default"
    assert (await api.get("/v1/policies/mine")).status_code == 404
    assert (await api.get("/v1/settings/default_policy")).json()["policy"] == "default"
    r = await api.post("/v1/chat/completions", json=chat("mine"))
    assert r.status_code == 404 and r.json()["error"]["param"] == "ttc.policy"
    # a deleted name can be created again: its history continues
    r = await api.post("/v1/policies", json={"name": "mine", **FIXED2})
    assert r.status_code == 201 and r.json()["version"] == 2
    r = await api.delete("/v1/policies/default", params={"force": True})
    assert r.status_code == 409  # the configured default cannot replace itself


async def test_snapshot_isolation_while_a_slow_request_runs(api: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    await api.post("/v1/policies", json={"name": "snap", **FIXED2})
    fake.latency_s = 0.4
    slow = asyncio.create_task(api.post("/v1/chat/completions", json=chat("snap")))
    await until(lambda: fake.in_flight == 1, what="the slow request to be drawing")  # its policy is resolved
    r = await api.patch("/v1/policies/snap", json={"params": {"n": 4}})
    assert r.json()["version"] == 2
    fake.latency_s = 0.0
    new = (await api.post("/v1/chat/completions", json=chat("snap"))).json()
    old = (await slow).json()
    assert old["ttc"]["policy"]["version"] == 1 and old["ttc"]["samples_drawn"] == 2
    assert new["ttc"]["policy"]["version"] == 2 and new["ttc"]["samples_drawn"] == 4
    pinned = (await api.post("/v1/chat/completions", json=chat("snap"))).json()
    assert pinned["ttc"]["policy"]["name"] == "snap"


async def test_config_policies_loaded_and_conflicts(tmp_path: Path, fake: FakeOpenAI) -> None:
    store = {"url": f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"}
    declared = {"cfg": {**FIXED2, "description": "from config"}}
    settings = fake_settings(["fake-a"], store=store, policies=declared, default_policy="cfg")
    async with service_client(settings, {"fake-a": fake}) as api:
        got = (await api.get("/v1/policies/cfg")).json()
        assert got["version"] == 1 and got["source"] == "config" and got["description"] == "from config"
        assert got["default"] is True
        await api.patch("/v1/policies/cfg", json={"params": {"n": 3}})  # an operator's edit
    changed = {"cfg": {"allocator": "fixed", "params": {"n": 6}}}
    async with service_client(fake_settings(["fake-a"], store=store, policies=changed), {"fake-a": fake}) as api:
        got = (await api.get("/v1/policies/cfg")).json()
        assert got["version"] == 2 and got["spec"]["params"] == {"n": 3}  # the store wins
        assert (await api.get("/v1/settings/default_policy")).json()["policy"] == "cfg"
    settings = fake_settings(["fake-a"], store=store, policies=changed, policies_override=True,
                             default_policy="single")
    async with service_client(settings, {"fake-a": fake}) as api:
        got = (await api.get("/v1/policies/cfg")).json()
        assert got["version"] == 3 and got["spec"]["params"] == {"n": 6}  # config wins when asked
        assert (await api.get("/v1/policies/cfg", params={"version": 2})).json()["spec"]["params"] == {"n": 3}
        assert (await api.get("/v1/settings/default_policy")).json()["policy"] == "single"


async def test_a_builtin_changed_by_a_release_is_upgraded_unless_an_operator_edited_it(
        tmp_path: Path, fake: FakeOpenAI) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"
    settings = fake_settings(["fake-a"], store={"url": url})
    async with service_client(settings, {"fake-a": fake}) as api:
        release = (await api.get("/v1/policies/adaptive")).json()["spec"]
        await api.patch("/v1/policies/esc", json={"params": {"window": 2}})  # an operator's edit
    store = await open_store(url)
    try:  # what an older release stored: its built-in, written by the built-in itself
        older = {**release, "params": {"max_samples": 40}}
        await store.put_policy("adaptive", older, created_by="builtin")
    finally:
        await store.db.close()
    async with service_client(settings, {"fake-a": fake}) as api:
        got = (await api.get("/v1/policies/adaptive")).json()
        assert got["version"] == 3 and got["spec"] == release and got["created_by"] == "builtin"
        assert (await api.get("/v1/policies/adaptive", params={"version": 2})).json()["spec"] == older
        edited = (await api.get("/v1/policies/esc")).json()
        assert edited["version"] == 2 and edited["spec"]["params"]["window"] == 2  # the operator's stays


async def test_policies_persist_across_restarts(tmp_path: Path, fake: FakeOpenAI) -> None:
    store = {"url": f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"}
    async with service_client(fake_settings(["fake-a"], store=store), {"fake-a": fake}) as api:
        await api.post("/v1/policies", json={"name": "kept", **FIXED2})
        await api.put("/v1/settings/default_policy", json={"policy": "kept"})
    async with service_client(fake_settings(["fake-a"], store=store), {"fake-a": fake}) as api:
        assert (await api.get("/v1/policies/kept")).json()["version"] == 1
        resp = (await api.post("/v1/chat/completions", json=chat())).json()
        assert resp["ttc"]["policy"]["name"] == "kept"


async def test_the_step_search_builtins_are_listed_with_their_search(api: httpx.AsyncClient) -> None:
    names = {p["name"]: p for p in (await api.get("/v1/policies")).json()["data"]}
    for method in ("beam", "dvts", "particles"):
        spec = names[method]["spec"]
        assert spec["search"] == {"method": method, "width": 8, "expand": 4, "max_steps": 12, "step_tokens": 48,
                                  "step_delimiter": "\n"}
        assert spec["verifier"]["name"] == "prm" and spec["aggregator"] == "best_of_n"
    by_likelihood = names["beam-likelihood"]["spec"]
    assert by_likelihood["search"] == names["beam"]["spec"]["search"]
    assert by_likelihood["verifier"] == {"name": "likelihood", "params": {"aggregate": "min"}}
    optimal = names["compute-optimal-likelihood"]["spec"]
    assert optimal["verifier"] == by_likelihood["verifier"] and optimal["search"]["method"] == "beam"
    assert optimal["optimal"]["probe"] == 2 and optimal["optimal"]["bins"] == [0.99]


def test_every_builtin_policy_is_named_in_the_request_schema() -> None:
    """``ttc.policy``'s description and examples list the built-ins (app.protocol cannot import app.policy)."""
    from app.policy import BUILTIN_POLICIES
    from app.protocol.requests import BUILTIN_POLICY_NAMES

    assert sorted(BUILTIN_POLICY_NAMES) == sorted(BUILTIN_POLICIES)


@pytest.mark.parametrize("route", ["/v1/policies/default", "/v1/policies/default/state"])
async def test_a_version_beyond_the_store_s_integers_is_a_400_not_a_500(api: httpx.AsyncClient, route: str) -> None:
    """Found by the stateful fuzz run: a 20-digit version reached SQLite and overflowed (a 500)."""
    resp = await api.get(route, params={"version": str(2**63)})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "version"
    assert (await api.get(route, params={"version": str(2**63 - 1)})).status_code == 404  # no such version


@pytest.mark.parametrize("route", ["/v1/policies/gone", "/v1/policies/gone/state"])
async def test_a_deleted_policy_s_versions_are_gone_too(api: httpx.AsyncClient, route: str) -> None:
    """Found by the stateful fuzz run: a version read before the delete stayed in the resolver's cache
    and was still served (200) after it."""
    await api.post("/v1/policies", json={"name": "gone", **FIXED2})
    assert (await api.get(route, params={"version": 1})).status_code == 200
    assert (await api.delete("/v1/policies/gone")).status_code == 200
    resp = await api.get(route, params={"version": 1})
    assert resp.status_code == 404, resp.text
