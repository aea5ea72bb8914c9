"""The OpenAI surface: every field is honoured (the backend receives it, its effect shows) or refused
with a 400 naming it; errors come before a stream starts; typed OpenAPI; request ids; models."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from app.protocol import ChatCompletionResponse, CompletionResponse
from ttc_tools.fakes.backend import FakeOpenAI

MSG = [{"role": "user", "content": "What is 2 + 40?"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": MSG, "ttc": {"policy": "single"}, **fields}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0.3), ("top_p", 0.9), ("max_tokens", 17), ("stop", ["\n\n"]), ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5), ("logit_bias", {"50256": -100.0}), ("user", "u-1"), ("top_k", 5),
        ("min_p", 0.1), ("repetition_penalty", 1.1), ("min_tokens", 2), ("ignore_eos", False),
        ("response_format", {"type": "json_object"}), ("parallel_tool_calls", False),
        ("logprobs", True), ("top_logprobs", 3),
    ],
)
async def test_honoured_chat_fields_reach_the_backend(client: httpx.AsyncClient, fake: FakeOpenAI, field: str,
                                                      value: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(**{field: value}))
    assert resp.status_code == 200, resp.text
    assert fake.bodies[-1][field] == value


async def test_seed_and_tools_reach_the_backend(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    resp = await client.post("/v1/chat/completions", json=chat(seed=7, tools=tools, tool_choice="required"))
    assert resp.status_code == 200, resp.text
    body = fake.bodies[-1]
    assert body["tools"] == tools and body["tool_choice"] == "required"
    assert isinstance(body["seed"], int)  # a seed derived per call from the request's


async def test_completion_logprobs_count_is_forwarded_and_returned(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "2 + 40 =", "logprobs": 2,
                                                      "ttc": {"policy": "single"}})
    assert resp.status_code == 200, resp.text
    assert fake.bodies[-1]["logprobs"] == 2
    data = resp.json()
    CompletionResponse.model_validate(data)
    assert data["choices"][0]["logprobs"]["token_logprobs"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("best_of", 2), ("functions", [{"name": "f"}]), ("function_call", "auto"), ("audio", {"voice": "x"}),
        ("prediction", {"type": "content", "content": "x"}), ("web_search_options", {}), ("store", True),
        ("metadata", {"a": "b"}), ("service_tier", "flex"), ("reasoning_effort", "extreme"), ("modalities", ["audio"]),
        ("suffix", "x"), ("n", 3),
    ],
)
async def test_refused_fields_are_400s_naming_them(client: httpx.AsyncClient, fake: FakeOpenAI, field: str,
                                                   value: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(**{field: value}))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == field and err["type"] == "invalid_request_error"
    assert fake.calls == 0


async def test_neutral_values_of_refused_fields_are_accepted(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(best_of=1, store=False, modalities=["text"], n=1))
    assert resp.status_code == 200, resp.text


async def test_completion_echo_and_unknown_fields(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "echo": True})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "echo"
    resp = await client.post("/v1/chat/completions", json=chat(colour="red"))
    assert resp.status_code == 400
    assert resp.json()["error"] == {"message": "Unknown field 'colour': this service does not support it.",
                                    "type": "invalid_request_error", "param": "colour", "code": "unknown_field"}


async def test_logprobs_of_the_selected_sample_are_returned(client: httpx.AsyncClient) -> None:
    data = (await client.post("/v1/chat/completions", json=chat(logprobs=True))).json()
    content = data["choices"][0]["logprobs"]["content"]
    assert len(content) == 9 and all("logprob" in t for t in content)
    plain = (await client.post("/v1/chat/completions", json=chat())).json()
    assert plain["choices"][0]["logprobs"] is None


async def test_confident_policy_does_not_leak_logprobs_the_client_did_not_ask_for(client: httpx.AsyncClient,
                                                                                 fake: FakeOpenAI) -> None:
    data = (await client.post("/v1/chat/completions", json={**chat(), "ttc": {"policy": "confident"}})).json()
    assert fake.bodies[-1]["logprobs"] is True  # the verifier needs them
    assert data["choices"][0]["logprobs"] is None


async def test_json_response_format_votes_on_canonical_json(client: httpx.AsyncClient) -> None:
    body = {**chat(response_format={"type": "json_object"}),
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 8}}}}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    ttc = data["ttc"]
    assert ttc["answer_kind"] == "json"
    assert all(json.loads(k).keys() == {"answer", "unit"} for k in ttc["votes"])
    assert all(k == json.dumps(json.loads(k), sort_keys=True, separators=(",", ":")) for k in ttc["votes"])
    assert sum(ttc["votes"].values()) == 8  # key order and spacing do not split votes
    assert json.loads(data["choices"][0]["message"]["content"])["answer"] == json.loads(ttc["answer"])["answer"]


async def test_tool_calls_vote_and_come_back(client: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    body = {**chat(tools=tools, tool_choice="required"), "ttc": {"policy": {"allocator": "fixed", "params": {"n": 6}}}}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    ChatCompletionResponse.model_validate(data)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "add"
    assert data["ttc"]["answer_kind"] == "tool_call"
    key = json.loads(data["ttc"]["answer"].removeprefix("tool_calls:"))
    assert key == [{"name": "add", "arguments": json.dumps(json.loads(call["function"]["arguments"]),
                                                           sort_keys=True, separators=(",", ":"))}]


async def test_a_truncated_sample_does_not_outvote_a_complete_one(client: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "truncate=3 p_correct=1 What is 500?"}],
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 4}}, "return_samples": True}}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    ttc = data["ttc"]
    assert ttc["answer"] == "500" and ttc["votes"] == {"500": 1}
    assert ttc["truncated"] == 3
    assert ttc["confidence"] == pytest.approx(0.25)  # 1 complete vote against 3 held back
    assert data["choices"][0]["finish_reason"] == "stop"
    assert [s["truncated"] for s in ttc["samples"]] == [True, True, True, False]


async def test_only_truncated_samples_still_answer(client: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "truncate=9 What is 500?"}],
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 2}}}}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert data["ttc"]["answer"] == "519" and data["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "nope"}, 404, "model"),
        ({"ttc": {"policy": "ghost"}}, 404, "ttc.policy"),
        ({"ttc": {"budget": {"max_samples": 100000}}}, 400, "ttc.budget.max_samples"),
        ({"temperature": 9}, 400, "temperature"),
    ],
)
async def test_streaming_errors_come_before_the_stream(client: httpx.AsyncClient, body: dict[str, Any],
                                                       status: int, param: str) -> None:
    req = {"model": "fake-model", "messages": MSG, "stream": True, **body}
    async with client.stream("POST", "/v1/chat/completions", json=req) as resp:
        assert resp.status_code == status
        assert resp.headers["content-type"].startswith("application/json")
        err = json.loads(await resp.aread())["error"]
    assert err["param"] == param


async def test_a_backend_failure_before_the_first_round_is_a_status_not_a_stream(client: httpx.AsyncClient,
                                                                                 fake: FakeOpenAI) -> None:
    fake.fail_status = 400
    async with client.stream("POST", "/v1/chat/completions", json={**chat(), "stream": True}) as resp:
        assert resp.status_code == 400
        assert "injected failure" in json.loads(await resp.aread())["error"]["message"]


async def test_models_list_and_retrieve(client: httpx.AsyncClient) -> None:
    listing = (await client.get("/v1/models")).json()
    assert [m["id"] for m in listing["data"]] == ["fake-model"]
    one = await client.get("/v1/models/fake-model")
    assert one.status_code == 200 and one.json()["id"] == "fake-model" and one.json()["object"] == "model"
    missing = await client.get("/v1/models/other")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_request_id_round_trip(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "trace-42.a:b"})
    assert resp.headers["x-request-id"] == "trace-42.a:b"
    assert resp.json()["ttc"]["request_id"] == "trace-42.a:b"
    generated = await client.post("/v1/chat/completions", json=chat())
    assert generated.headers["x-request-id"].startswith("req-")
    assert generated.json()["ttc"]["request_id"] == generated.headers["x-request-id"]
    for bad in (b"x" * 129, b"has space", "ünï".encode()):
        resp = await client.get("/health", headers={"x-request-id": bad})
        assert resp.headers["x-request-id"].startswith("req-")
    err = await client.post("/v1/chat/completions", json=chat(model="nope"), headers={"x-request-id": "e-1"})
    assert err.status_code == 404 and err.headers["x-request-id"] == "e-1"


async def test_one_structured_log_line_per_request(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ttc.request"):
        await client.post("/v1/chat/completions", json=chat(), headers={"x-request-id": "log-1"})
    lines = [r for r in caplog.records if r.name == "ttc.request"]
    assert len(lines) == 1
    fields = lines[0].ttc  # type: ignore[attr-defined]
    assert fields["request_id"] == "log-1" and fields["policy"] == "single" and fields["samples"] == 1
    assert fields["rounds"] == 1 and fields["stop_reason"] in ("policy", "cap") and fields["outcome"] == "ok"
    assert fields["completion_tokens"] == 9 and fields["latency_ms"] > 0


async def test_openapi_is_typed_and_has_no_422(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert "422" not in json.dumps(doc["paths"])
    chat_op = doc["paths"]["/v1/chat/completions"]["post"]
    body = chat_op["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/ChatCompletionRequest")
    ok = chat_op["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/ChatCompletionResponse")
    assert chat_op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorEnvelope")
    schemas = doc["components"]["schemas"]
    for name in ("TTCOptions", "BudgetSpec", "TTCBlock"):
        undocumented = [f for f, spec in schemas[name]["properties"].items() if "description" not in spec]
        assert not undocumented, (name, undocumented)
    assert "confident" in schemas["TTCOptions"]["properties"]["policy"]["description"]
    assert doc["paths"]["/v1/models/{model_id}"]["get"]["responses"]["200"]


async def test_docs_load_their_assets_from_the_service(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200
    assert "/docs/assets/swagger-ui-bundle.js" in page.text and "cdn" not in page.text.lower()
    js = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000
    assert (await client.get("/docs/assets/swagger-ui.css")).status_code == 200


async def test_a_greedy_request_draws_one_sample(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    body = {**chat(temperature=0), "ttc": {"policy": "self-consistency-8"}}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    assert data["ttc"]["samples_drawn"] == 1 and data["ttc"]["max_samples"] == 1
    assert [b["n"] for b in fake.bodies] == [1]
    resp = await client.post("/v1/ttc/batches", json={"model": "fake-model", "prompts": ["1 + 1", "2 + 2"],
                                                       "temperature": 0, "budget": {"mean_samples": 4}})
    assert [r["samples"] for r in resp.json()["results"]] == [1, 1]


async def test_every_backend_down_is_a_503_before_any_stream(client: httpx.AsyncClient, fake: FakeOpenAI) -> None:
    fake.fail_status = 500
    async with client.stream("POST", "/v1/chat/completions", json={**chat(), "stream": True}) as resp:
        assert resp.status_code == 503
        assert json.loads(await resp.aread())["error"]["code"] == "no_backend_available"
