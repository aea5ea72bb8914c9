"""Code through the service: programs vote by behaviour (run sandboxed on the prompt's doctest
inputs) and the code_tests verifier scores candidates by the request's tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Receive, Scope, Send

from tests.conftest import fake_settings, service_client

pytestmark = pytest.mark.sandbox

PROMPT = ('Write add.\n\ndef add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n'
          '    >>> add(5, -5)\n    0\n    """\n')
PROGRAMS = [
    "```python\ndef add(a, b):\n    return a + b\n```",
    "Here you go:\n```python\ndef add(a, b):\n    # commutative\n    return b + a\n```",
    "```python\ndef add(a, b):\n    return a - b\n```",
    "```python\ndef add(a, b):\n    total = 0\n    for x in (a, b):\n        total += x\n    return total\n```",
]


class Scripted:
    """An OpenAI backend that answers every call with ``texts`` in order (one per sample)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (msg := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if scope["path"] == "/v1/models":
            payload: dict[str, Any] = {"data": [{"id": "fake-model"}]}
        elif scope["path"] == "/health":
            payload = {}
        else:
            n = int(json.loads(body).get("n", 1))
            texts = [self.texts[i % len(self.texts)] for i in range(n)]
            payload = {"choices": [{"index": i, "message": {"role": "assistant", "content": t},
                                    "finish_reason": "stop"} for i, t in enumerate(texts)],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 10 * n}}
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})


def request(**ttc: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT}],
            "ttc": {"policy": {"allocator": "fixed", "params": {"n": 4}}, "return_samples": True, **ttc}}


async def test_programs_vote_by_behaviour() -> None:
    async with service_client(fake_settings(["fake-a"]), {"fake-a": Scripted(PROGRAMS)}) as client:
        data = (await client.post("/v1/chat/completions", json=request(answer={"kind": "code"}))).json()
    ttc = data["ttc"]
    keys = [s["answer"] for s in ttc["samples"]]
    assert keys[0] == keys[1] == keys[3] != keys[2]  # three texts, one behaviour; a - b differs
    assert sorted(ttc["votes"].values()) == [1, 3]
    assert ttc["answer"] == keys[0] and ttc["answer_kind"] == "code"


async def test_without_inputs_programs_key_by_normalised_text() -> None:
    prompt = "def add(a, b): add them"
    body = request(answer={"kind": "code"})
    body["messages"][0]["content"] = prompt
    async with service_client(fake_settings(["fake-a"]), {"fake-a": Scripted(PROGRAMS)}) as client:
        data = (await client.post("/v1/chat/completions", json=body)).json()
    assert len(data["ttc"]["votes"]) == 4  # four different texts, no inputs to tell them apart


async def test_code_tests_verifier_picks_a_passing_program() -> None:
    policy = {"allocator": "fixed", "params": {"n": 4}, "aggregator": "best_of_n", "verifier": "code_tests",
              "answer": {"kind": "code"}}
    tests = {"asserts": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(0, 0) == 0"}
    async with service_client(fake_settings(["fake-a"]), {"fake-a": Scripted(PROGRAMS[2:] + PROGRAMS[:2])}) as client:
        data = (await client.post("/v1/chat/completions", json=request(policy=policy, tests=tests))).json()
        missing = await client.post("/v1/chat/completions", json=request(policy=policy))
    scores = [s["score"] for s in data["ttc"]["samples"]]
    assert scores[0] == pytest.approx(1 / 3)  # a - b passes only add(0, 0) == 0
    assert scores[1:] == [1.0, 1.0, 1.0]
    assert data["ttc"]["selected_index"] == 1
    assert "return" in data["choices"][0]["message"]["content"]
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "ttc.tests"


async def test_bad_tests_are_a_400_naming_the_field(client: Any) -> None:
    resp = await client.post("/v1/chat/completions", json={**request(tests={"asserts": "assert f(1) =="})})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"].startswith("ttc.tests")
