"""Redis-shared state: two service processes behind one redis-server enforce one set of per-key
limits, and shared allocators' learning is replicated between replicas."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest

from allocators import QueryState, Sample
from allocators.registry import create as create_allocator
from app.auth import Principal
from app.errors import RateLimited
from app.policy import PolicySnapshot
from app.ratelimit import RateLimiter, RedisBuckets
from app.shared_stats import SharedLearning
from app.wire import PolicySpec

pytestmark = pytest.mark.services

ADMIN = {"Authorization": "Bearer shared-admin-secret"}


def chat(**ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}], "ttc": ttc}


def test_limits_hold_across_two_replicas(tmp_path: Path, services: Any, redis_url: str, fake_backend: str) -> None:
    config: dict[str, Any] = {
        "backends": [{"url": fake_backend}], "default_model": "fake-model",
        "store": {"url": f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"},
        "auth": {"enabled": True, "admin_keys": ["os.environ/TTC_TEST_ADMIN_KEY"]},
        "redis": {"url": redis_url, "prefix": f"t{tmp_path.name[-6:]}"},
    }
    env = {"TTC_TEST_ADMIN_KEY": "shared-admin-secret"}
    a, b = services(config, env).start(), services(config, env).start()
    a.wait_ready()
    b.wait_ready()
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
        r = ca.post("/v1/keys", json={"requests_per_minute": 6}, headers=ADMIN)
        assert r.status_code == 201, r.text
        user = {"Authorization": f"Bearer {r.json()['key']}"}
        assert cb.get("/v1/policies", headers=user).status_code == 403  # replica B knows the key too
        got = [(ca if i % 2 == 0 else cb).post("/v1/chat/completions", json=chat(policy="single"), headers=user)
               for i in range(12)]
        assert [r.status_code for r in got].count(200) == 6, [r.status_code for r in got]
        assert {r.status_code for r in got[6:]} == {429}
        assert all(int(r.headers["retry-after"]) >= 1 for r in got[6:])
        assert got[-1].json()["error"]["type"] == "rate_limit_error"

        r = cb.post("/v1/keys", json={"samples_per_minute": 10}, headers=ADMIN)
        samples = {"Authorization": f"Bearer {r.json()['key']}"}
        four = {"allocator": "fixed", "params": {"n": 4}}
        got = [(ca if i % 2 == 0 else cb).post("/v1/chat/completions", json=chat(policy=four), headers=samples)
               for i in range(4)]
        assert [r.status_code for r in got] == [200, 200, 200, 429]  # 10 -> 6 -> 2 -> -2 (debt): refused

        # shared allocator: both replicas publish what they learn to one stream
        ca.post("/v1/policies", json={"name": "diff", "allocator": "difficulty"}, headers=ADMIN)
        for client in (ca, cb, ca, cb):
            r = client.post("/v1/chat/completions", json=chat(policy="diff"), headers=ADMIN)
            assert r.status_code == 200, r.text
    import redis as sync_redis

    with sync_redis.Redis.from_url(redis_url) as rc:
        streams = list(rc.scan_iter(f"{config['redis']['prefix']}:learn:diff:1:*"))
        assert len(streams) == 1
        entries: Any = rc.xrange(streams[0])
        assert len(entries) == 4 and len({fields[b"r"] for _, fields in entries}) == 2


async def test_shared_learning_replicates_between_replicas(redis_url: str) -> None:
    import redis.asyncio as aioredis

    redis = aioredis.from_url(redis_url)
    try:
        prefix = f"learn{random.getrandbits(32)}"
        a, b = SharedLearning(redis, prefix), SharedLearning(redis, prefix)
        snap = PolicySnapshot("diff", 1, PolicySpec(allocator="difficulty"))
        alloc_a = create_allocator("difficulty", {}, random.Random(0))
        alloc_b = create_allocator("difficulty", {}, random.Random(0))
        states = [QueryState(id=f"q{i}", cap=8, features={"chars": 10.0 + i, "digits": 2.0},
                             samples=[Sample("4"), Sample("4"), Sample("5")]) for i in range(3)]
        alloc_a.learn(states)  # what the engine does on replica A ...
        await a.publish(snap, states)  # ... and then shares
        assert await a.pull(snap, alloc_a) == 0  # its own examples are not applied twice
        assert await b.pull(snap, alloc_b) == 3
        assert alloc_b.model.seen == alloc_a.model.seen == 3  # type: ignore[attr-defined]
        assert alloc_b.model.bias == pytest.approx(alloc_a.model.bias)  # type: ignore[attr-defined]
        assert await b.pull(snap, alloc_b) == 0  # nothing new
        fresh = SharedLearning(redis, prefix)  # a replica started later replays the history
        assert await fresh.pull(snap, create_allocator("difficulty", {}, random.Random(0))) == 3
    finally:
        await redis.aclose()


async def test_redis_buckets_are_one_limit_for_many_limiters(redis_url: str) -> None:
    import redis.asyncio as aioredis

    redis = aioredis.from_url(redis_url)
    try:
        prefix = f"rl{random.getrandbits(32)}"
        one, two = RateLimiter(RedisBuckets(redis, prefix)), RateLimiter(RedisBuckets(redis, prefix))
        who = Principal(role="user", key_id="k1", requests_per_minute=3)
        await one.admit(who)
        await two.admit(who)
        await one.admit(who)
        with pytest.raises(RateLimited) as err:
            await two.admit(who)
        assert err.value.headers is not None and int(err.value.headers["Retry-After"]) in range(1, 22)
    finally:
        await redis.aclose()
