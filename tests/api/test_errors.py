"""Every client mistake is a 4xx in the OpenAI error shape naming the field; backends down is 503."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI


def assert_error(resp: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == param
    assert "Traceback" not in resp.text
    return body["error"]


CASES = [
    ({"n": 3}, 400, "n"),
    ({"ttc": {"policy": "no-such-policy"}}, 404, "ttc.policy"),
    ({"ttc": {"policy": {"allocator": "nope"}}}, 400, "ttc.policy.allocator"),
    ({"ttc": {"policy": {"allocator": "fixed", "params": {"n": 0}}}}, 400, "ttc.policy.params.n"),
    ({"ttc": {"policy": {"allocator": "fixed", "params": {"bogus": 1}}}}, 400, "ttc.policy.params.bogus"),
    ({"ttc": {"policy": {"allocator": "fixed", "aggregator": "nope"}}}, 400, "ttc.policy.aggregator"),
    ({"ttc": {"policy": {"allocator": "fixed", "aggregator": "best_of_n"}}}, 400, "ttc.policy.verifier"),
    ({"ttc": {"policy": {"allocator": "fixed", "verifier": {"name": "nope"}}}}, 400, "ttc.policy.verifier.name"),
    ({"ttc": {"policy": {"allocator": "fixed", "verifier": "reference"}}}, 400, "ttc.reference"),
    ({"ttc": {"budget": {"max_samples": 0}}}, 400, "ttc.budget.max_samples"),
    ({"ttc": {"budget": {"max_samples": 100000}}}, 400, "ttc.budget.max_samples"),
    ({"ttc": {"budget": {"deadline_ms": -5}}}, 400, "ttc.budget.deadline_ms"),
    ({"ttc": {"budget": {"max_tokens": "lots"}}}, 400, "ttc.budget.max_tokens"),
    ({"ttc": {"surprise": True}}, 400, "ttc.surprise"),
    ({"temperature": 9}, 400, "temperature"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),
]


@pytest.mark.parametrize(("patch", "status", "param"), CASES)
async def test_client_mistakes(client: httpx.AsyncClient, fake: FakeOpenAI, chat: Any,
                               patch: dict[str, Any], status: int, param: str) -> None:
    body = {**chat(), **patch}
    resp = await client.post("/v1/chat/completions", json=body)
    assert_error(resp, status, param)
    assert fake.calls == 0  # nothing drawn for a rejected request


async def test_missing_prompt_on_completions(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/completions", json={"model": "m"}), 400, "prompt")


async def test_several_prompts_point_to_batches(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": ["a", "b"]})
    err = assert_error(resp, 400, "prompt")
    assert "batches" in err["message"]


async def test_invalid_json(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", content=b"{not json",
                             headers={"content-type": "application/json"})
    assert_error(resp, 400, None)


async def test_unknown_route_is_enveloped(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing-here"), 404, None)


async def test_n_error_says_why(client: httpx.AsyncClient, chat: Any) -> None:
    err = assert_error(await client.post("/v1/chat/completions", json={**chat(), "n": 2}), 400, "n")
    assert "max_samples" in err["message"]


async def test_all_backends_down_is_503(chat: Any) -> None:
    a, b = FakeOpenAI(fail_status=500), FakeOpenAI(fail_status=503)
    async with service_client(fake_settings(["a", "b"]), {"a": a, "b": b}) as c:
        resp = await c.post("/v1/chat/completions", json=chat())
        assert_error(resp, 503, None)
        assert a.calls >= 1 and b.calls >= 1  # each backend tried, then retried while both cool off
        assert a.calls + b.calls == 3  # max_retries = 2
        assert_error(await c.post("/v1/chat/completions", json=chat()), 503, None)
        assert a.calls + b.calls == 6  # cooling off is not refusing: still tried
        a.healthy = b.healthy = False
        assert (await c.get("/ready")).status_code == 503


async def test_one_transient_error_does_not_take_a_single_backend_out(chat: Any) -> None:
    only = FakeOpenAI(fail_status=502)
    async with service_client(fake_settings(["only"], pool={"max_retries": 0}), {"only": only}) as c:
        assert_error(await c.post("/v1/chat/completions", json=chat()), 503, None)
        only.fail_status = None  # recovered well within the 30 s cool-down
        resp = await c.post("/v1/chat/completions", json=chat())
        assert resp.status_code == 200, resp.text


async def test_unreachable_backend_is_503(chat: Any) -> None:
    async with service_client(fake_settings(["nowhere"]), {}) as c:
        assert_error(await c.post("/v1/chat/completions", json=chat()), 503, None)


async def test_backend_rejection_is_400(chat: Any) -> None:
    bad = FakeOpenAI(fail_status=400)
    async with service_client(fake_settings(["a"]), {"a": bad}) as c:
        assert_error(await c.post("/v1/chat/completions", json=chat()), 400, None)
        assert bad.calls == 1  # a client mistake is not retried


async def test_deadline_is_504(chat: Any) -> None:
    slow = FakeOpenAI(latency_s=1.0)
    async with service_client(fake_settings(["a"]), {"a": slow}) as c:
        resp = await c.post("/v1/chat/completions", json=chat(budget={"deadline_ms": 100}))
        assert_error(resp, 504, "ttc.budget.deadline_ms")


async def test_partial_on_deadline_returns_best_so_far(chat: Any) -> None:
    slow = FakeOpenAI(latency_s=0.15, p_correct=0.5)
    async with service_client(fake_settings(["a"]), {"a": slow}) as c:
        policy = {"allocator": "fixed", "params": {"n": 40, "per_round": 1}}
        resp = await c.post("/v1/chat/completions", json=chat(
            policy=policy, budget={"deadline_ms": 500}, partial_on_deadline=True))
        assert resp.status_code == 200, resp.text
        ttc = resp.json()["ttc"]
        assert ttc["partial"] is True and ttc["stop_reason"] == "deadline"
        assert 1 <= ttc["samples_drawn"] < 40


async def test_a_405_names_every_method_of_the_path(client: Any) -> None:
    resp = await client.put("/v1/ttc/batches/batch_x")
    assert resp.status_code == 405
    assert set(resp.headers["allow"].split(", ")) == {"GET", "DELETE"}
    assert resp.json()["error"]["code"] == "method_not_allowed"
