"""A fixed-latency fake OpenAI server (ASGI) for benchmarks, load-test tests and API tests.

For each call it sleeps ``latency_s`` then returns ``n`` choices. Each choice ends with
"The answer is X." where X is the prompt's *true* answer (the last integer in the prompt, or 42)
with probability ``p_correct``, else a wrong neighbour. ``style`` changes what a choice says around
its number X (for load tests of answer handling): ``number`` (the default above), ``math``
(``\boxed{\frac{x}{X}}``), ``code`` (a one-line Python function that uses X) or ``prose`` ("Final
answer: " and 30 words that depend on X). Asked for ``response_format`` JSON it answers
``{"answer": X, "unit": "none"}`` (key order and spacing vary); given ``tools`` (and no
``tool_choice: "none"``) it calls the first tool with ``{"x": X}``. A prompt containing
``truncate=K`` makes the first K choices of each call stop at their length limit
(``finish_reason: length``) on a wrong number. Draws are deterministic for a request
``seed``. Asked for ``logprobs``, each of a choice's 9 tokens reports log-prob -0.01 when the answer
is right and -0.2 when it is wrong (a model that is surer of its right answers; with
``logprobs=False`` it never reports them). It counts calls and can be told to fail calls
(``fail_status``) or health checks (``healthy``).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

_INT = re.compile(r"-?\d+")


@dataclass
class FakeOpenAI:
    latency_s: float = 0.0
    p_correct: float = 0.7
    model: str = "fake-model"
    fail_status: int | None = None
    healthy: bool = True
    calls: int = 0
    samples: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    keep_bodies: bool = False
    logprobs: bool = True
    style: str = "number"

    def _prompt_text(self, body: dict[str, Any]) -> str:
        if "messages" in body:
            return " ".join(str(m.get("content", "")) for m in body["messages"])
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))

    def completion(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        n = int(body.get("n") or 1)
        text = self._prompt_text(body)
        ints = _INT.findall(text)
        truth = int(ints[-1]) if ints else 42
        rng = random.Random(body["seed"]) if body.get("seed") is not None else random.Random()
        p = self.p_correct
        m = re.search(r"p_correct=([0-9.]+)", text)
        if m:
            p = float(m.group(1))
        t = re.search(r"truncate=(\d+)", text)
        truncate = int(t.group(1)) if t else 0
        fmt = (body.get("response_format") or {}).get("type")
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        choices = []
        per = 9
        for i in range(n):
            ans = truth if rng.random() < p else truth + rng.choice([-2, -1, 1, 2, 10])
            finish = "stop"
            if i < truncate:  # cut mid-way: "... The answer is 51" of a wrong, unfinished line
                ans, finish = truth + 19, "length"
            content: str | None = styled(self.style, ans)
            calls = None
            if fmt in ("json_object", "json_schema"):
                content = json.dumps({"answer": ans, "unit": "none"} if rng.random() < 0.5 else
                                     {"unit": "none", "answer": ans}, indent=rng.choice([None, 2]))
            if tools:
                name = tools[0].get("function", {}).get("name", "f")
                calls = [{"id": f"call_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps({"x": ans})}}]
                content, finish = None, "tool_calls"
            logprobs = None
            if body.get("logprobs") and self.logprobs:
                logprobs = _logprobs(-0.01 if ans == truth else -0.2, per, chat)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": logprobs})
            else:
                choices.append({"index": i, "text": content, "finish_reason": finish, "logprobs": logprobs})
        return {
            "id": f"fake-{self.calls}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model", self.model), "choices": choices,
            "usage": {"prompt_tokens": max(1, len(text) // 4), "completion_tokens": per * n,
                      "total_tokens": max(1, len(text) // 4) + per * n},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path, method = scope["path"], scope["method"]
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        status: int = 404
        payload: dict[str, Any] = {"error": {"message": "not found"}}
        if method == "GET" and path == "/health":
            status, payload = (200, {}) if self.healthy else (503, {})
        elif method == "GET" and path == "/v1/models":
            status, payload = 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            body = json.loads(b"".join(chunks) or b"{}")
            self.calls += 1
            if self.keep_bodies:
                self.bodies.append(body)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
            finally:
                self.in_flight -= 1
            if self.fail_status is not None:
                status, payload = self.fail_status, {"error": {"message": "injected failure"}}
            else:
                self.samples += int(body.get("n") or 1)
                status, payload = 200, self.completion(body, chat=path.endswith("chat/completions"))
        data = json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


_PROSE = ("because the value follows from adding each part of the question carefully and then checking "
          "that nothing was left out of the sum so we can be sure")
_WORDS = tuple(_PROSE.split(" "))
STYLES = ("number", "math", "code", "prose")


def styled(style: str, answer: int) -> str:
    """A choice's text for ``answer`` in one of :data:`STYLES`."""
    if style == "math":
        return f"Simplifying gives \\boxed{{\\frac{{x}}{{{answer}}}}}."
    if style == "code":
        return f"The answer is `solve = lambda xs: sorted(xs, key=lambda v: (v % {answer}, -v))[:{answer}]`."
    if style == "prose":
        rng = random.Random(answer)
        return "Final answer: " + " ".join(rng.choice(_WORDS) for _ in range(30)) + f" {answer}."
    return f"Let me work it out. The answer is {answer}."


def _logprobs(lp: float, tokens: int, chat: bool) -> dict[str, Any]:
    """The ``logprobs`` of one choice of ``tokens`` tokens, each with log-prob ``lp``."""
    if chat:
        return {"content": [{"token": "t", "logprob": lp}] * tokens}
    return {"tokens": ["t"] * tokens, "token_logprobs": [lp] * tokens}


def serve_fake(port: int, latency_s: float, host: str = "127.0.0.1", p_correct: float = 0.7,
               style: str = "number") -> None:
    """Run the fake server with uvicorn (blocking); used by benchmarks as a separate process."""
    import uvicorn

    uvicorn.run(FakeOpenAI(latency_s=latency_s, p_correct=p_correct, style=style), host=host, port=port,
                log_level="warning", access_log=False)
