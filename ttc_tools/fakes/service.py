"""A tiny stand-in for the ttc service, for testing the load tester over real loopback HTTP.

:class:`FakeTTCService` answers ``POST /v1/chat/completions`` like the service: it draws
``n`` samples from :class:`ttc_tools.fakes.backend.FakeOpenAI` (``n`` from ``ttc.policy`` =
``self-consistency-N`` / ``single``, else 4), votes, and returns the OpenAI shape plus a ``ttc``
block; ``stream: true`` gets SSE chunks ending with the ``ttc`` block and ``[DONE]``. A request whose
``ttc.budget.deadline_ms`` is below ``latency_s`` gets a 504 error object. It keeps every request's
arrival time (``arrivals``, ``time.monotonic()``) and its method, path and JSON body (``received``).
:func:`serve_in_thread` runs any ASGI app with
uvicorn on a free loopback port in a daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ttc_tools.fakes.backend import FakeOpenAI


@dataclass
class FakeTTCService:
    latency_s: float = 0.0
    p_correct: float = 1.0
    arrivals: list[float] = field(default_factory=list)
    received: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def _n(self, ttc: dict[str, Any]) -> int:
        policy = ttc.get("policy")
        if policy == "single":
            return 1
        if isinstance(policy, str) and policy.startswith("self-consistency-"):
            return int(policy.rsplit("-", 1)[1])
        return 4

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        ttc = body.get("ttc") or {}
        deadline = (ttc.get("budget") or {}).get("deadline_ms")
        if deadline is not None and deadline / 1000 < self.latency_s:
            return 504, {"error": {"message": "deadline exceeded", "type": "timeout_error",
                                   "param": None, "code": "deadline_exceeded"}}
        n = self._n(ttc)
        raw = FakeOpenAI(p_correct=self.p_correct).completion({**body, "n": n, "seed": None}, chat=True)
        answers = [c["message"]["content"].rsplit(" ", 1)[1].rstrip(".") for c in raw["choices"]]
        answer, count = Counter(answers).most_common(1)[0]
        idx = answers.index(answer)
        return 200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": raw["created"],
            "model": raw["model"], "choices": [{**raw["choices"][idx], "index": 0}], "usage": raw["usage"],
            "ttc": {"samples_drawn": n, "rounds": 1, "stop_reason": "policy", "votes": dict(Counter(answers)),
                    "answer": answer, "confidence": count / n, "selected_index": idx, "max_samples": n,
                    "policy": {"name": ttc.get("policy")}, "partial": False},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.arrivals.append(time.monotonic())
        chunks = []
        while True:
            msg = await receive()
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = json.loads(b"".join(chunks) or b"{}")
        self.received.append((scope["method"], scope["path"], body))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        status, payload = self.respond(body)
        stream = bool(body.get("stream")) and status == 200
        if stream:
            ttc = payload.pop("ttc")
            text = payload["choices"][0]["message"]["content"]
            events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                      {"choices": [{"index": 0, "delta": {"content": text}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "ttc": ttc},
                      {"choices": [], "usage": payload["usage"]}]
            data = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
            ctype = b"text/event-stream"
        else:
            data, ctype = json.dumps(payload).encode(), b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


@contextlib.contextmanager
def serve_in_thread(app: ASGIApp, timeout_s: float = 15.0) -> Iterator[str]:
    """Serve ``app`` on ``127.0.0.1:<free port>`` in a daemon thread; yield its base URL."""
    import uvicorn

    from app.backends.launcher import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("fake server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
