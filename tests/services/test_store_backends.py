"""The store against real SQLite (file, WAL) and a real PostgreSQL server: migrations, versions under
concurrent writers, settings, keys, recordings; and the service running on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from app.auth import new_api_key
from app.errors import Conflict, NotFound
from app.store import Store, open_store
from app.store.migrate import current_revision, head_revision
from tests.conftest import fake_settings, service_client
from tests.services.conftest import Postgres
from ttc_tools.fakes.backend import FakeOpenAI

pytestmark = pytest.mark.services


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"
    else:
        url = request.getfixturevalue("postgres").create_db()
    st = await open_store(url)
    try:
        yield st
    finally:
        await st.db.close()


async def test_migrations_are_idempotent(store: Store) -> None:
    assert await current_revision(store.db) == head_revision()
    again = await open_store(store.db.url)  # a second replica starting: no-op
    await again.db.close()
    if store.db.is_sqlite:
        async with store.db.read() as conn:
            assert (await conn.execute(text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 2  # FULL


async def test_versions_under_concurrent_writers(store: Store) -> None:
    await store.put_policy("p", {"allocator": "fixed", "params": {"n": 1}}, create_only=True)
    with pytest.raises(Conflict):
        await store.put_policy("p", {"allocator": "fixed"}, create_only=True)
    with pytest.raises(NotFound):
        await store.put_policy("q", {"allocator": "fixed"}, update_only=True)

    async def write(i: int) -> int:
        return (await store.put_policy("p", {"allocator": "fixed", "params": {"n": i}})).version

    versions = await asyncio.gather(*(write(i) for i in range(2, 22)))
    assert sorted(versions) == list(range(2, 22))  # every write got its own version, none lost
    assert (await store.get_policy("p")).version == 21
    for v in (1, 7, 21):
        assert (await store.get_policy("p", v)).version == v
    assert len(await store.list_versions("p")) == 21
    await store.delete_policy("p")
    with pytest.raises(NotFound):
        await store.get_policy("p")
    revived = await store.put_policy("p", {"allocator": "fixed"}, create_only=True)
    assert revived.version == 22
    # many first writers of a new name at once (PostgreSQL: the unique-key losers retry)
    firsts = await asyncio.gather(*(store.put_policy("fresh", {"allocator": "fixed", "params": {"n": i}})
                                    for i in range(1, 11)))
    assert sorted(v.version for v in firsts) == list(range(1, 11))


async def test_settings_keys_recordings(store: Store) -> None:
    assert await store.get_setting("default_policy") is None
    await store.set_setting("default_policy", "a")
    await store.set_setting("default_policy", "b")
    assert await store.get_setting("default_policy") == "b"
    await store.put_policy("a", {"allocator": "fixed"})
    plain, key = new_api_key("user", name="k", default_policy="a", requests_per_minute=5)
    await store.add_key(key)
    got = await store.get_key(key.id)
    assert got is not None and got.hash == key.hash and got.default_policy == "a" and plain not in got.hash
    assert await store.keys_bound_to("a") == [key.id]
    await store.delete_policy("a")
    got = await store.get_key(key.id)
    assert got is not None and got.default_policy is None  # unbound with the deleted policy
    assert (await store.revoke_key(key.id)).revoked_at is not None
    assert await store.list_keys() == [] and len(await store.list_keys(include_revoked=True)) == 1
    row: dict[str, Any] = {
        "created_at": 100.0, "request_id": "r1", "query_id": "q0", "policy_name": "a", "policy_version": 1,
        "model": "m", "key_id": None, "question": "1+1?", "reference": "2", "answers": ["2", None],
        "scores": [None, None], "tokens": [3, 4], "logprobs": [None, None], "texts": None, "selected": 0,
        "latency_ms": 1.5, "meta": {"x": 1},
    }
    await store.add_recordings([row, {**row, "request_id": "r2", "created_at": 200.0, "policy_name": "b"}])
    rows = await store.recordings(since=150)
    assert [r["request_id"] for r in rows] == ["r2"] and rows[0]["answers"] == ["2", None]
    assert len(await store.recordings(policy="a")) == 1


async def test_service_on_postgres(postgres: Postgres, fake: FakeOpenAI) -> None:
    url = postgres.create_db()
    settings = fake_settings(["fake-a"], store={"url": url})
    async with service_client(settings, {"fake-a": fake}) as api:
        r = await api.post("/v1/policies", json={"name": "pg", "allocator": "fixed", "params": {"n": 3}})
        assert r.status_code == 201, r.text
        await api.patch("/v1/policies/pg", json={"params": {"n": 2}})
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 1 + 1?"}],
                "ttc": {"policy": "pg"}}
        resp = (await api.post("/v1/chat/completions", json=body)).json()
        assert resp["ttc"]["policy"]["version"] == 2 and resp["ttc"]["samples_drawn"] == 2
    async with service_client(settings, {"fake-a": fake}) as api:  # restart: still there
        assert (await api.get("/v1/policies/pg", params={"version": 1})).json()["spec"]["params"] == {"n": 3}
