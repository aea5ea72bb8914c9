"""Reasoning models: the thought comes back in vLLM's field (and in the old one where the backend used
it), answers are read from the final content only, a sample cut inside its thought does not vote,
thought tokens are counted in ``usage.completion_tokens_details.reasoning_tokens``, and a one-sample
stream relays the thought, then the answer, as vLLM streams them.

The fake backend's thoughts mention a wrong number (``maybe {truth + 3}``): were answers read from the
thought, that number would vote."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.api.test_stream_schedule import service
from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import THOUGHT_TOKENS, FakeOpenAI, thought_of


def chat(policy: Any, prompt: str = "What is 2 + 40?", **extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": prompt}], "ttc": {"policy": policy},
            **extra}


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_the_thought_comes_back_and_never_votes(field: str) -> None:
    fake = FakeOpenAI(p_correct=1.0, reasoning_field=field)
    async with service_client(fake_settings(["a"]), {"a": fake}) as c:
        body = chat("self-consistency-8")
        body["ttc"]["return_samples"] = True
        resp = await c.post("/v1/chat/completions", json=body)
        body = resp.json()
        assert resp.status_code == 200, resp.text
        message, ttc = body["choices"][0]["message"], body["ttc"]
        assert message["content"] == "Let me work it out. The answer is 40."
        assert message["reasoning"] == thought_of(40)  # "... maybe 43, ..."
        assert ("reasoning_content" in message) == (field == "reasoning_content")
        assert ttc["votes"] == {"40": 8}
        assert all(s["reasoning"] == thought_of(40) for s in ttc["samples"])
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8 * THOUGHT_TOKENS}
        assert sum(s["reasoning_tokens"] for s in ttc["samples"]) == 8 * THOUGHT_TOKENS


async def test_a_sample_cut_inside_its_thought_has_no_answer() -> None:
    fake = FakeOpenAI(p_correct=1.0, reasoning_field="reasoning")
    async with service_client(fake_settings(["a"]), {"a": fake}) as c:
        resp = await c.post("/v1/chat/completions", json=chat("self-consistency-8", "truncate=3 What is 2 + 40?"))
        ttc = resp.json()["ttc"]
        assert ttc["truncated"] == 3 and ttc["votes"] == {"40": 5}


async def test_streams_carry_the_thought_before_the_answer() -> None:
    fake = FakeOpenAI(p_correct=1.0, reasoning_field="reasoning", token_latency_s=0.001)
    async with service(fake) as c:
        for policy in ("single", "self-consistency-8"):
            async with c.stream("POST", "/v1/chat/completions", json=chat(policy, stream=True,
                                                                         stream_options={"include_usage": True})) as r:
                events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: {")]
            deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
            kinds = [k for d in deltas for k in ("reasoning", "content") if d.get(k)]
            first_content = kinds.index("content")
            assert "reasoning" in kinds[:first_content] and "reasoning" not in kinds[first_content:], (policy, kinds)
            thought = "".join(d.get("reasoning") or "" for d in deltas)
            assert thought.strip() == thought_of(40), policy
            if policy == "single":  # relayed as the backend sent it: one token a chunk
                assert kinds.count("reasoning") == THOUGHT_TOKENS
            assert events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


async def test_a_backend_without_thoughts_answers_as_before(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json=chat("single"))).json()
    assert "reasoning" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]


@pytest.mark.parametrize(("extra", "ttc_budget", "sent"), [
    ({"reasoning_effort": "low"}, None, 512),
    ({"reasoning_effort": "none"}, None, 0),
    ({"reasoning_effort": "high"}, None, None),
    ({"reasoning_effort": "low"}, {"max_thinking_tokens": 100}, 100),
    ({}, {"max_thinking_tokens": 7}, 7),
])
async def test_thinking_budgets_reach_vllm(fake: FakeOpenAI, extra: dict[str, Any], ttc_budget: Any,
                                           sent: int | None) -> None:
    async with service_client(fake_settings(["a"]), {"a": fake}) as c:
        body = {**chat("single"), **extra}
        if ttc_budget:
            body["ttc"]["budget"] = ttc_budget
        resp = await c.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        assert fake.bodies[-1].get("thinking_token_budget") == sent
        assert fake.bodies[-1].get("reasoning_effort") == extra.get("reasoning_effort")
        assert resp.json()["ttc"].get("thinking_budget") == sent
