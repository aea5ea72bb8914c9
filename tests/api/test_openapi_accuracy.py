"""The OpenAPI document says what the service accepts: a body the document calls valid is not refused for
its shape, one it calls invalid is refused, and the configured limits and registry names are in it.

(The schema fuzzer, ``tests/fuzz``, checks the same with schemathesis against a running service; these
are the named cases, run in-process.)"""

from __future__ import annotations

from typing import Any

import httpx
import jsonschema_rs
import pytest

from app.protocol import REFUSED
from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

MSG = [{"role": "user", "content": "What is 2 + 40?"}]
CHAT = {"model": "fake-model", "messages": MSG, "ttc": {"policy": "single"}}
TEXT = {"model": "fake-model", "prompt": "What is 2 + 40?", "ttc": {"policy": "single"}}
BATCH = {"model": "fake-model", "prompts": ["1 + 1"], "budget": {"total_samples": 1}, "policy": "single"}


async def document(client: httpx.AsyncClient) -> dict[str, Any]:
    doc: dict[str, Any] = (await client.get("/openapi.json")).json()
    return doc


def body_validator(doc: dict[str, Any], path: str, method: str = "post") -> jsonschema_rs.Draft202012Validator:
    schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema_rs.Draft202012Validator({**schema, "components": doc["components"]})


@pytest.mark.parametrize(("path", "body", "valid"), [
    # integers written as JSON numbers without a fraction are integers (JSON says 1.0 == 1)
    ("/v1/chat/completions", {**CHAT, "max_tokens": 5.0, "n": 1.0, "seed": 7.0}, True),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 5.5}, False),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "5"}, False),
    ("/v1/chat/completions", {**CHAT, "max_tokens": True}, False),
    ("/v1/ttc/batches", {**BATCH, "budget": {"total_samples": 2.0}}, True),
    # refused OpenAI fields: their neutral values only
    ("/v1/completions", {**TEXT, "best_of": 1, "echo": False, "store": False, "suffix": None}, True),
    ("/v1/completions", {**TEXT, "best_of": 2}, False),
    ("/v1/completions", {**TEXT, "echo": True}, False),
    ("/v1/chat/completions", {**CHAT, "modalities": ["text"], "metadata": None, "service_tier": None}, True),
    ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"]}, False),
    ("/v1/chat/completions", {**CHAT, "store": True}, False),
    ("/v1/chat/completions", {**CHAT, "functions": []}, False),
    ("/v1/chat/completions", {**CHAT, "service_tier": "auto"}, False),
    # n: the service draws the samples itself
    ("/v1/chat/completions", {**CHAT, "n": 2}, False),
    # a completion's prompt list holds one prompt
    ("/v1/completions", {**TEXT, "prompt": ["What is 2 + 40?"]}, True),
    ("/v1/completions", {**TEXT, "prompt": []}, False),
    ("/v1/completions", {**TEXT, "prompt": ["a", "b"]}, False),
    # stop: at most 16 sequences (a single string: at most 16 characters)
    ("/v1/chat/completions", {**CHAT, "stop": ["x"] * 16}, True),
    ("/v1/chat/completions", {**CHAT, "stop": ["x"] * 17}, False),
    ("/v1/chat/completions", {**CHAT, "stop": "x" * 17}, False),
    # free-form values are forwarded: their integers fit in 64 bits
    ("/v1/chat/completions", {**CHAT, "messages": [{**MSG[0], "name": "u", "extra": [2**40, 1.5, None]}]}, True),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "n": 2**65}}]},
     False),
    # a batch: exactly one of prompts/messages, exactly one of total_samples/mean_samples
    ("/v1/ttc/batches", {**BATCH, "prompts": None, "messages": [MSG]}, True),
    ("/v1/ttc/batches", {**BATCH, "messages": [MSG]}, False),
    ("/v1/ttc/batches", {k: v for k, v in BATCH.items() if k != "prompts"}, False),
    ("/v1/ttc/batches", {**BATCH, "budget": {"mean_samples": 1.5}}, True),
    ("/v1/ttc/batches", {**BATCH, "budget": {"total_samples": 1, "mean_samples": 1.0}}, False),
    ("/v1/ttc/batches", {**BATCH, "budget": {"total_tokens": 100}}, False),
    # the configured limits (see fake_settings below)
    ("/v1/chat/completions", {**CHAT, "messages": MSG * 4}, True),
    ("/v1/chat/completions", {**CHAT, "messages": MSG * 5}, False),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 100, "max_completion_tokens": 100}, True),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 101}, False),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 101}, False),
    ("/v1/chat/completions", {**CHAT, "ttc": {"policy": "single", "budget": {"max_samples": 9}}}, True),
    ("/v1/chat/completions", {**CHAT, "ttc": {"policy": "single", "budget": {"max_samples": 10}}}, False),
    ("/v1/completions", {**TEXT, "prompt": "x" * 60}, True),
    ("/v1/completions", {**TEXT, "prompt": "x" * 61}, False),
    ("/v1/ttc/batches", {**BATCH, "prompts": ["x"] * 3, "budget": {"total_samples": 3}}, True),
    ("/v1/ttc/batches", {**BATCH, "prompts": ["x"] * 4, "budget": {"total_samples": 4}}, False),
    ("/v1/ttc/batches", {**BATCH, "prompts": None, "messages": [MSG * 5]}, False),
])
async def test_the_document_and_the_service_agree(fake: FakeOpenAI, path: str, body: dict[str, Any],
                                                  valid: bool) -> None:
    limits = {"max_messages": 4, "max_samples": 9, "max_tokens": 100, "max_prompt_chars": 60, "max_batch_prompts": 3}
    async with service_client(fake_settings(["fake-a"], limits=limits), {"fake-a": fake}) as client:
        assert body_validator(await document(client), path).is_valid(body) == valid
        resp = await client.post(path, json=body)
    if valid:
        assert resp.status_code == 200, resp.text
    else:
        assert resp.status_code == 400, resp.text


async def test_a_refused_field_still_says_why(client: httpx.AsyncClient) -> None:
    doc = await document(client)
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["best_of"]["enum"] == [None, 1] and REFUSED["best_of"] in props["best_of"]["description"]
    assert props["n"]["enum"] == [None, 1]
    resp = await client.post("/v1/completions", json={**TEXT, "best_of": 3})
    assert resp.status_code == 400
    assert resp.json()["error"] == {"message": REFUSED["best_of"], "type": "invalid_request_error",
                                    "param": "best_of", "code": "unsupported_parameter"}
    resp = await client.post("/v1/completions", json={**TEXT, "best_of": 2.5})
    assert resp.json()["error"]["param"] == "best_of" and "valid integer" in resp.json()["error"]["message"]
    resp = await client.post("/v1/chat/completions", json={**CHAT, "n": 4})
    assert resp.json()["error"]["param"] == "n" and "n > 1 is not supported" in resp.json()["error"]["message"]


async def test_the_document_says_the_configured_limits(fake: FakeOpenAI) -> None:
    limits = {"max_messages": 7, "max_samples": 9, "max_tokens": 1000, "max_prompt_chars": 5000,
              "max_batch_prompts": 11}
    async with service_client(fake_settings(["fake-a"], limits=limits), {"fake-a": fake}) as client:
        schemas = (await document(client))["components"]["schemas"]

    def branch(model: str, field: str, kind: str) -> dict[str, Any]:
        spec = schemas[model]["properties"][field]
        return next(b for b in spec.get("anyOf", [spec]) if b.get("type") == kind)

    assert branch("ChatCompletionRequest", "messages", "array")["maxItems"] == 7
    assert branch("ChatMessage", "content", "string")["maxLength"] == 5000
    assert branch("BudgetSpec", "max_samples", "integer")["maximum"] == 9
    for model in ("ChatCompletionRequest", "CompletionRequest", "BatchRequest"):
        assert branch(model, "max_tokens", "integer")["maximum"] == 1000
    assert branch("ChatCompletionRequest", "max_completion_tokens", "integer")["maximum"] == 1000
    assert branch("CompletionRequest", "prompt", "string")["maxLength"] == 5000
    assert branch("CompletionRequest", "prompt", "array")["items"]["maxLength"] == 5000
    prompts, messages = branch("BatchRequest", "prompts", "array"), branch("BatchRequest", "messages", "array")
    assert prompts["maxItems"] == messages["maxItems"] == 11
    assert prompts["items"]["maxLength"] == 5000 and messages["items"]["maxItems"] == 7
    assert "5000 characters" in schemas["ChatMessage"]["description"]


async def test_policy_bodies_are_documented(client: httpx.AsyncClient) -> None:
    doc = await document(client)
    paths = doc["paths"]

    def ref(path: str, method: str) -> str:
        body: str = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        return body.rsplit("/", 1)[1]

    assert ref("/v1/policies", "post") == "PolicyCreate"
    assert ref("/v1/policies/{name}", "put") == "PolicyReplace"
    assert ref("/v1/policies/{name}", "patch") == "PolicyPatch"
    assert ref("/v1/settings/default_policy", "put") == "DefaultPolicy"
    schemas = doc["components"]["schemas"]
    assert {"fixed", "adaptive_consistency"} <= set(schemas["PolicyCreate"]["properties"]["allocator"]["enum"])
    assert "majority" in schemas["PolicySpec"]["properties"]["aggregator"]["enum"]
    assert "reference" in schemas["VerifierSpec"]["properties"]["name"]["enum"]
    assert schemas["PolicyCreate"]["required"] == ["allocator", "name"]

    create = body_validator(doc, "/v1/policies")
    good = {"name": "p1", "allocator": "fixed", "params": {"n": 3}, "description": "three"}
    for bad in ({**good, "name": "inline"}, {**good, "name": "-x"}, {**good, "allocator": "nope"},
                {**good, "aggregator": "nope"}, {k: v for k, v in good.items() if k != "name"}):
        assert not create.is_valid(bad), bad
        assert (await client.post("/v1/policies", json=bad)).status_code == 400, bad
    assert create.is_valid(good)
    resp = await client.post("/v1/policies", json=good)
    assert resp.status_code == 201, resp.text
    replace = {"allocator": "fixed", "params": {"n": 4}, "expected_version": 1.0}  # JSON says 1.0 == 1
    assert body_validator(doc, "/v1/policies/{name}", "put").is_valid(replace)
    resp = await client.put("/v1/policies/p1", json=replace)
    assert resp.status_code == 200 and resp.json()["version"] == 2, resp.text
    resp = await client.put("/v1/policies/p1", json={**replace, "expected_version": 1.5})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "expected_version"
    patch = body_validator(doc, "/v1/policies/{name}", "patch")
    assert patch.is_valid({"params": None, "description": None}) and not patch.is_valid({"allocator": None})
    assert (await client.patch("/v1/policies/p1", json={"params": None})).status_code == 200
    setting = body_validator(doc, "/v1/settings/default_policy", "put")
    assert setting.is_valid({"policy": "p1"}) and not setting.is_valid({})
    assert (await client.put("/v1/settings/default_policy", json={"policy": "p1"})).status_code == 200
