"""A generator whose solutions follow a known tree of steps, and a process reward model that scores them:
for tests of step-level search (ASGI apps, in-process or under uvicorn).

:class:`FakeTree` answers ``POST /v1/chat/completions`` (and ``/v1/completions``) like vLLM: the partial
solution is the assistant's last turn with ``continue_final_message`` (or the end of the prompt); it
draws ``n`` next steps from ``tree[partial]`` (``(step, probability)`` pairs; seeded by the request's
``seed``), each returned without the delimiter (the request's ``stop``) and with vLLM's ``stop_reason``:
the delimiter, or ``None`` for a step that ends the solution (a final step: one that starts with
``The answer is``). Usage: a quarter of the prompt's characters, one token per character of a step.
Asked for ``logprobs``, it returns one per character (vLLM's chat or completions shape): the first
character of each step (line) ``surprise.get(step, -0.1)``, every other -0.01 -- so a step listed in
``surprise`` holds a token the "model" found unlikely.

:class:`FakePRM` answers ``POST /pooling`` like vLLM's pooling runner serving a PRM: the steps are the
assistant turn (``messages``) or the ``input`` texts cut at ``step_tag``; each step's pair is
``[1 - p, p]`` with ``p = scores.get(step, default)``.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

FINAL = "The answer is"


async def _body(receive: Receive) -> dict[str, Any]:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return json.loads(b"".join(chunks) or b"{}")


async def _send(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


@dataclass
class FakeTree:
    tree: dict[str, list[tuple[str, float]]]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    model: str = "fake-model"
    completion_tokens: int = 0
    """Every completion token it has reported."""
    latency_s: float = 0.0
    """How long each generation call takes."""
    surprise: dict[str, float] = field(default_factory=dict)
    """The log-prob of the first token of these steps (when log-probs are asked for)."""

    def logprobs(self, text: str, chat: bool) -> dict[str, Any]:
        """One log-prob per character of ``text`` (see the module doc), in the shape of ``chat`` or not."""
        values: list[float] = []
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line:
                values += [self.surprise.get(line, -0.1)] + [-0.01] * (len(line) - 1)
            if i < len(lines) - 1:
                values.append(-0.01)  # the newline
        if chat:
            return {"content": [{"token": c, "logprob": lp, "top_logprobs": []}
                                for c, lp in zip(text, values, strict=True)]}
        return {"tokens": list(text), "token_logprobs": values}

    def partial(self, body: dict[str, Any], chat: bool) -> tuple[str, str]:
        """The prompt and the partial solution a call continues."""
        if not chat:
            prompt = str(body.get("prompt", ""))
            cut = prompt.find("\nA:\n")
            return (prompt, "") if cut < 0 else (prompt[:cut], prompt[cut + 4:])
        messages = body.get("messages") or []
        if body.get("continue_final_message") and messages and messages[-1].get("role") == "assistant":
            return str(messages[0].get("content", "")), str(messages[-1].get("content", ""))
        return str(messages[0].get("content", "")) if messages else "", ""

    def rest(self, partial: str, step: str, rng: random.Random) -> str:
        """``step`` and every step after it to the end of the solution, joined by newlines."""
        steps = [step]
        while not steps[-1].startswith(FINAL):
            options = self.tree.get(partial + "".join(s + "\n" for s in steps)) or [(f"{FINAL} 0.", 1.0)]
            steps.append(rng.choices([s for s, _ in options], weights=[w for _, w in options])[0])
        return "\n".join(steps)

    def answer(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        self.bodies.append(body)
        prompt, partial = self.partial(body, chat)
        options = self.tree.get(partial) or [(f"{FINAL} 0.", 1.0)]
        rng = random.Random(body.get("seed"))
        stop = (body.get("stop") or [None])[0]
        limit = int(body.get("max_tokens") or 10**9)
        choices, completion = [], 0
        for i in range(int(body.get("n") or 1)):
            step = rng.choices([s for s, _ in options], weights=[w for _, w in options])[0]
            if stop is None:  # no step delimiter asked for: the whole rest of the solution, one step a line
                step = self.rest(partial, step, rng)
            final = step.startswith(FINAL) or stop is None
            finish, reason = ("stop", None if final else stop)
            if len(step) > limit:
                step, finish, reason = step[:limit], "length", None
            completion += len(step)
            choice: dict[str, Any] = {"index": i, "finish_reason": finish, "stop_reason": reason,
                                      "logprobs": self.logprobs(step, chat) if body.get("logprobs") else None}
            if chat:
                choice["message"] = {"role": "assistant", "content": step}
            else:
                choice["text"] = step
            choices.append(choice)
        self.completion_tokens += completion
        prompt_tokens = max(1, (len(prompt) + len(partial)) // 4)
        return {"id": "tree", "object": "chat.completion" if chat else "text_completion", "model": self.model,
                "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                              "total_tokens": prompt_tokens + completion}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path in ("/v1/chat/completions", "/v1/completions"):
            await asyncio.sleep(self.latency_s)
            await _send(send, 200, self.answer(await _body(receive), path.endswith("chat/completions")))
        elif path == "/v1/models":
            await _send(send, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            await _send(send, 200 if path == "/health" else 404, {})


@dataclass
class FakePRM:
    scores: dict[str, float] = field(default_factory=dict)
    default: float = 0.5
    step_tag: str = "<extra_0>"
    healthy: bool = True
    calls: int = 0

    def pairs(self, text: str) -> list[list[float]]:
        steps = text.split(self.step_tag)[:-1]
        return [[1 - p, p] for p in (self.scores.get(s.strip(), self.default) for s in steps)]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        if scope["path"] != "/pooling" or not self.healthy:
            await _send(send, 404 if self.healthy else 503, {"error": {"message": "no"}})
            return
        self.calls += 1
        texts = [body["messages"][-1]["content"]] if "messages" in body else list(body.get("input") or [])
        data = [{"index": i, "object": "pooling", "data": self.pairs(t)} for i, t in enumerate(texts)]
        await _send(send, 200, {"object": "list", "data": data,
                                "usage": {"prompt_tokens": sum(len(t) // 4 for t in texts), "total_tokens": 0}})
