"""Which of the service's own files and functions one request executes (``ttc trace-path``).

A newcomer follows a request by reading the code it runs, so the count of that code is a number worth
watching. :func:`trace_request` builds the service in-process on the fake backend
(:class:`ttc_tools.fakes.backend.FakeOpenAI`, every sample right, so that a policy's decisions and
the path do not vary from run to run), sends one warm-up request and then the traced one
through httpx's ASGI transport, and records, with :func:`sys.setprofile` on the event loop's thread,
every Python function called while the traced request runs whose file is part of the service
(``app/`` and ``allocators/``). Comprehensions, generator expressions and lambdas are not counted as
functions (their enclosing function is). Work that runs in other threads (answer parsing pools) is not
seen; the service's background loops (health checks, load polls) are set to intervals longer than
the trace.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "allocators")

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}]}
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", CHAT),  # the default policy, not streamed
    "stream-adaptive": ("/v1/chat/completions", {**CHAT, "stream": True, "ttc": {"policy": "adaptive"}}),
    "batch4": ("/v1/ttc/batches", {"model": "fake-model", "prompts": [f"What is {i} + 40?" for i in range(4)],
                                   "budget": {"mean_samples": 2}}),
}


@dataclass
class PathTrace:
    """The service's functions a request ran: ``{relative file: {qualified name: calls}}``."""

    status: int = 0
    calls: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def files(self) -> int:
        return len(self.calls)

    @property
    def functions(self) -> int:
        return sum(len(names) for names in self.calls.values())

    @property
    def total_calls(self) -> int:
        return sum(sum(names.values()) for names in self.calls.values())

    def lines(self) -> list[str]:
        """One line per file (functions in call-count order), for people to read."""
        out = []
        for path in sorted(self.calls):
            names = sorted(self.calls[path].items(), key=lambda kv: (-kv[1], kv[0]))
            out.append(f"{path} ({len(names)}): " + ", ".join(name for name, _ in names))
        return out


@contextmanager
def profiling(trace: PathTrace) -> Iterator[None]:
    """Record the calls into ``trace`` while the block runs (this thread only)."""
    prefixes = tuple(str(ROOT / p) + "/" for p in PACKAGES)
    root = len(str(ROOT)) + 1
    seen: dict[Any, tuple[str, str] | None] = {}

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code in seen:
            where = seen[code]
        else:
            keep = code.co_filename.startswith(prefixes) and not code.co_name.startswith("<")
            where = seen[code] = (code.co_filename[root:], code.co_qualname) if keep else None
        if where is not None:
            names = trace.calls.setdefault(where[0], {})
            names[where[1]] = names.get(where[1], 0) + 1

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)


async def trace_request(body: dict[str, Any] | None = None, path: str = "/v1/chat/completions") -> PathTrace:
    """Trace one warm request (``body`` to ``path``; default: a plain chat request with the default
    policy). A streamed response is read to its end inside the trace."""
    from app.config import BackendConfig, Settings
    from app.main import create_app
    from ttc_tools.fakes.backend import FakeOpenAI

    settings = Settings(backends=[BackendConfig(url="http://fake:8000", name="fake")], default_model="fake-model",
                        store={"url": "sqlite+aiosqlite://"}, answers={"prestart": False},
                        pool={"health_interval_s": 3600.0, "load_interval_s": 3600.0})
    app = create_app(settings, transport=httpx.ASGITransport(app=FakeOpenAI(p_correct=1.0)))
    body = CHAT if body is None else body
    trace = PathTrace()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=30)
    async with app.router.lifespan_context(app), client:
        await client.post(path, json=body)  # warm: lazy caches filled
        with profiling(trace):
            resp = await client.post(path, json=body)
    trace.status = resp.status_code
    return trace


def trace(body: dict[str, Any] | None = None) -> PathTrace:
    """:func:`trace_request` from synchronous code."""
    return asyncio.run(trace_request(body))
