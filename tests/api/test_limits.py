"""Hostile sizes and numbers: every field is bounded, nothing non-finite, strict types, limits with
the error envelope (413/400), and error details (405's Allow, invalid_json)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

MSG = [{"role": "user", "content": "What is 2 + 40?"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": MSG, "ttc": {"policy": "single"}, **fields}


async def test_body_size_is_limited(fake: FakeOpenAI) -> None:
    settings = fake_settings(["fake-a"], limits={"max_body_bytes": 64 * 1024})
    async with service_client(settings, {"fake-a": fake}) as client:
        big = chat(messages=[{"role": "user", "content": "x" * 100_000}])
        resp = await client.post("/v1/chat/completions", json=big)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "body_too_large"

        async def chunks() -> Any:  # no content-length: the limit is counted as the bytes arrive
            yield b'{"model": "fake-model", "messages": [{"role": "user", "content": "'
            for _ in range(100):
                yield b"x" * 1024
            yield b'"}]}'

        resp = await client.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"
        assert fake.calls == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(messages=MSG * 600), "messages"),
        (chat(messages=[{"role": "user", "content": "x" * 200_001}]), "messages"),
        (chat(max_tokens=10**8), "max_tokens"),
        (chat(max_completion_tokens=40_000), "max_completion_tokens"),
    ],
)
async def test_request_sizes_are_limited(client: httpx.AsyncClient, fake: FakeOpenAI, body: dict[str, Any],
                                         param: str) -> None:
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param and resp.json()["error"]["code"] == "too_large"
    assert fake.calls == 0


async def test_completion_prompt_length_is_limited(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "y" * 200_001})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/keys", {"requests_per_minute": 2**64}, "requests_per_minute"),
        ("/v1/keys", {"samples_per_minute": 10**13}, "samples_per_minute"),
        ("/v1/keys", {"samples_per_minute": True}, "samples_per_minute"),
        ("/v1/ttc/batches", {"prompts": ["a"], "budget": {"mean_samples": 1e308}}, "budget.mean_samples"),
        ("/v1/ttc/batches", {"prompts": ["a", "b"], "budget": {"total_samples": 10**10}}, "budget.total_samples"),
        ("/v1/ttc/batches", {"prompts": ["a"], "budget": {"mean_samples": 2}, "max_tokens": 10**9}, "max_tokens"),
        ("/v1/ttc/batches", {"prompts": ["z" * 200_001], "budget": {"mean_samples": 2}}, "prompts[0]"),
        ("/v1/chat/completions", chat(max_tokens=10**12), "max_tokens"),
        ("/v1/chat/completions", chat(min_tokens=2**70), "min_tokens"),
        ("/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f", "x": 2**70}}]), "tools"),
        ("/v1/chat/completions", chat(logprobs=0), "logprobs"),
        ("/v1/chat/completions", chat(temperature=True), "temperature"),
        ("/v1/completions", {"model": "fake-model", "prompt": "x", "echo": 0}, "echo"),
        ("/v1/chat/completions", chat(ttc={"budget": {"max_samples": "3"}}), "ttc.budget.max_samples"),
    ],
)
async def test_numbers_are_bounded_and_types_strict(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                                                    param: str) -> None:
    resp = await client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


@pytest.mark.parametrize("raw", [b'{"prompts": ["a"], "budget": {"mean_samples": Infinity}}',
                                 b'{"prompts": ["a"], "budget": {"mean_samples": NaN}}'])
async def test_non_finite_numbers_are_refused(client: httpx.AsyncClient, raw: bytes) -> None:
    resp = await client.post("/v1/ttc/batches", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "budget.mean_samples"


async def test_error_details(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v1/chat/completions")
    assert resp.status_code == 405 and "POST" in resp.headers["allow"]
    assert resp.json()["error"]["code"] == "method_not_allowed"
    for raw in (b"\xff\xfe{", b"[" * 100_000 + b"]" * 100_000, b"{not json"):
        for path in ("/v1/chat/completions", "/v1/ttc/batches"):
            resp = await client.post(path, content=raw, headers={"content-type": "application/json"})
            assert resp.status_code in (400, 413), (path, raw[:10], resp.text)
            assert resp.json()["error"]["code"] in ("invalid_json", "body_too_large"), (path, raw[:10], resp.text)


async def test_sizes_are_checked_before_any_model_is_built(client: httpx.AsyncClient) -> None:
    """100,000 tiny messages (a cheap body that is expensive to validate) are refused on their count:
    the message that would fail validation, at the very end, is never looked at."""
    bad = {"role": "nobody", "content": 1}
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": ""}] * 100_000 + [bad]}
    resp = await client.post("/v1/chat/completions", json=chat)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages", resp.text
    assert resp.json()["error"]["code"] == "too_large"
    many = {"model": "fake-model", "prompts": ["a"] * 20_000 + [7], "budget": {"mean_samples": 1}}
    resp = await client.post("/v1/ttc/batches", json=many)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompts", resp.text
    long_chat = {"model": "fake-model", "messages": [[{"role": "user", "content": ""}] * 600 + [bad]],
                 "budget": {"mean_samples": 1}}
    resp = await client.post("/v1/ttc/batches", json=long_chat)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages[0]", resp.text
