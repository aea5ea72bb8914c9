"""Batches in the store: checkpoints slot by slot, a second replica resuming a batch from them,
cancelling (backend streams closed), listing with key isolation. The fake backend runs under
uvicorn on loopback (streams can hang, and it counts what it started, finished and saw cancelled)."""

from __future__ import annotations

from typing import Any

import httpx

from app.batches import BatchManager
from tests.api.test_keys import ADMIN, api, bearer, make_key  # noqa: F401  (api: a fixture)
from tests.api.test_stream_schedule import service, until
from tests.support.metrics import sample
from tests.support.waiting import until_true
from ttc_tools.fakes.backend import FakeOpenAI


def batch(n: int, total: int, **kw: Any) -> dict[str, Any]:
    prompts = [f"Question {i}: p_correct=0.6 {10 + i}" for i in range(n)]
    return {"model": "fake-model", "prompts": prompts, "budget": {"total_samples": total}, "background": True,
            "schedule": "stream", "seed": 7, **kw}


def manager(c: httpx.AsyncClient) -> BatchManager:
    return c._transport.app.state.ttc.batches  # type: ignore[attr-defined,no-any-return]


async def test_a_second_replica_resumes_from_the_checkpoint_without_redrawing() -> None:
    fake = FakeOpenAI(p_correct=0.6, stall_after=10)  # ten samples finish, then every stream hangs
    async with service(fake) as c:
        a = manager(c)
        resp = await c.post("/v1/ttc/batches", json=batch(6, 30, policy={"allocator": "uniform"}))
        assert resp.status_code == 202, resp.text
        job = resp.json()["id"]
        store = a.store
        await until(lambda: fake.streams["samples_finished"] == 10, "ten finished samples")
        checkpointed: dict[str, Any] = {}

        async def saved() -> bool:  # the replica writes them as they come
            checkpointed.update(await store.samples(job))
            return sum(map(len, checkpointed.values())) == 10

        await until_true(saved, what="ten checkpointed samples", timeout_s=10)
        await a.shutdown()  # replica A stops: its lease is given up, its hanging streams closed
        await until(lambda: fake.streams["open"] == 0, "A's streams closed")
        lost = fake.streams["samples_cancelled"]
        assert (await c.get(f"/v1/ttc/batches/{job}")).json()["status"] == "in_progress"

        fake.stall_after = None
        b = BatchManager(a.runner, a.preparer, store, a.config)  # replica B on the same store
        await b.tend()
        assert list(b.running) == [job]
        assert sample((await c.get("/metrics")).text, "ttc_batch_takeovers_total") == 1.0
        await b.running[job]
        view = (await c.get(f"/v1/ttc/batches/{job}")).json()
        assert view["status"] == "completed" and view["takeovers"] == 1, view
        drawn = view["summary"]["samples_drawn"]
        assert view["progress"]["samples_drawn"] == drawn <= 30
        after = await store.samples(job)
        for qid, rows in checkpointed.items():  # what A paid for is kept as it was, not drawn again
            assert after[qid][: len(rows)] == rows
        assert sum(map(len, after.values())) == drawn
        assert sum(r["samples"] for r in view["results"]) == drawn
        assert all(sum(r["allocation"]) == r["samples"] for r in view["results"])
        # every sample the backend finished is in the batch: none paid for twice, none lost
        assert fake.streams["samples_finished"] == drawn
        assert lost > 0  # A's in-flight samples were cancelled, never delivered, and not billed


async def test_cancel_stops_the_backend_calls() -> None:
    fake = FakeOpenAI(p_correct=0.6, stall_after=3)
    async with service(fake) as c:
        resp = await c.post("/v1/ttc/batches", json=batch(8, 40))
        job = resp.json()["id"]
        await until(lambda: fake.streams["open"] > 0 and fake.streams["samples_finished"] == 3, "hanging streams")
        r = await c.post(f"/v1/ttc/batches/{job}/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled" and r.json()["cancel_requested"] is True
        await until(lambda: fake.streams["open"] == 0, "the streams closed")
        started = fake.streams["samples_started"]
        assert job not in manager(c).running
        again = await c.post(f"/v1/ttc/batches/{job}/cancel")  # a finished batch stays as it is
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        assert fake.streams["samples_started"] == started
        assert (await c.delete("/v1/ttc/batches/batch_nope")).status_code == 404


async def test_a_deleted_batch_is_gone() -> None:
    fake = FakeOpenAI(p_correct=0.6)
    async with service(fake) as c:
        done = (await c.post("/v1/ttc/batches", json=batch(2, 4, background=False))).json()["id"]
        fake.stall_after = fake.streams["samples_started"] + 3
        job = (await c.post("/v1/ttc/batches", json=batch(8, 40))).json()["id"]
        await until(lambda: fake.streams["samples_finished"] == 7, "three more finished samples")
        for running_or_not in (job, done):
            r = await c.delete(f"/v1/ttc/batches/{running_or_not}")
            assert r.status_code == 200 and r.json() == {"id": running_or_not, "object": "ttc.batch.deleted",
                                                         "deleted": True}, r.text
            assert (await c.get(f"/v1/ttc/batches/{running_or_not}")).status_code == 404
            assert await manager(c).store.samples(running_or_not) == {}
        await until(lambda: fake.streams["open"] == 0, "the running batch's streams closed")
        assert (await c.get("/v1/ttc/batches")).json()["data"] == []
        assert (await c.delete(f"/v1/ttc/batches/{job}")).status_code == 404


async def test_batches_past_max_running_wait_queued_for_a_free_replica() -> None:
    fake = FakeOpenAI(p_correct=0.6, stall_after=2)
    async with service(fake, batches={"max_running": 1}) as c:
        m = manager(c)
        first = (await c.post("/v1/ttc/batches", json=batch(4, 8))).json()["id"]
        second = (await c.post("/v1/ttc/batches", json=batch(4, 8))).json()
        assert second["status"] == "queued" and list(m.running) == [first]
        await m.tend()  # no free slot: it stays queued
        assert list(m.running) == [first]
        await c.delete(f"/v1/ttc/batches/{first}")
        fake.stall_after = None
        await m.tend()
        assert list(m.running) == [second["id"]]
        await m.running[second["id"]]
        view = (await c.get(f"/v1/ttc/batches/{second['id']}")).json()
        assert view["status"] == "completed" and view["takeovers"] == 0  # started, not taken from anyone
        assert sample((await c.get("/metrics")).text, "ttc_batch_takeovers_total") == 0.0


async def test_listing_shows_a_key_only_its_own_batches(api: httpx.AsyncClient) -> None:  # noqa: F811
    alice, bob = await make_key(api, role="user"), await make_key(api, role="user")
    small = {"model": "fake-model", "prompts": ["What is 1 + 1?", "What is 2 + 2?"], "budget": {"total_samples": 4}}
    ids = {}
    for who in (alice, bob, alice):
        r = await api.post("/v1/ttc/batches", json=small, headers=bearer(who["key"]))
        assert r.status_code == 200, r.text
        ids.setdefault(who["id"], []).append(r.json()["id"])
    page = (await api.get("/v1/ttc/batches", headers=bearer(alice["key"]))).json()
    assert [b["id"] for b in page["data"]] == ids[alice["id"]][::-1] and page["has_more"] is False
    assert "results" not in page["data"][0] and page["data"][0]["summary"]["samples_drawn"] <= 4
    first = (await api.get("/v1/ttc/batches?limit=1", headers=bearer(alice["key"]))).json()
    assert first["has_more"] is True
    rest = (await api.get(f"/v1/ttc/batches?limit=1&after={first['data'][0]['id']}",
                          headers=bearer(alice["key"]))).json()
    assert [b["id"] for b in rest["data"]] == [ids[alice["id"]][0]] and rest["has_more"] is False
    everyone = (await api.get("/v1/ttc/batches", headers=ADMIN)).json()
    assert len(everyone["data"]) == 3
    bobs = ids[bob["id"]][0]
    for method, path, param in (("GET", f"/v1/ttc/batches/{bobs}", "batch_id"),
                                ("DELETE", f"/v1/ttc/batches/{bobs}", "batch_id"),
                                ("GET", f"/v1/ttc/batches?after={bobs}", "after")):
        r = await api.request(method, path, headers=bearer(alice["key"]))
        assert r.status_code == 404 and r.json()["error"]["param"] == param, r.text
    assert (await api.get(f"/v1/ttc/batches/{bobs}", headers=bearer(bob["key"]))).status_code == 200
    r = await api.get("/v1/ttc/batches?limit=0", headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
