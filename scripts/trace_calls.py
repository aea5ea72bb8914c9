#!/usr/bin/env python
"""How long is the way through the code? Files, distinct functions and calls of ``app/`` and
``allocators/`` for one request of each kind, traced with ``sys.setprofile`` after a warm-up.

The service runs in this process (its ASGI app driven by httpx); its backend is the fake OpenAI
server in a thread (real loopback HTTP, its code not counted). Kinds:

* ``chat``: a chat completion with no ``ttc`` block (the ``default`` policy), not streamed;
* ``stream-adaptive``: the same question streamed under the ``adaptive`` policy;
* ``batch4``: a synchronous batch of 4 prompts (``greedy``, mean 2 samples).

Counted: every ``def`` (and ``lambda``) entered, by file; a generator resumed counts as a call of it.
Comprehensions are left out of *functions* (Python 3.12 inlines them, PEP 709; here they are code
objects of their own) and shown apart.

Usage: ``.venv/bin/python scripts/trace_calls.py [--list KIND]`` (``--list`` prints the functions
of one kind, by file, with their call counts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TTC_STORE__URL", "sqlite+aiosqlite://")

import httpx  # noqa: E402

from app.config import BackendConfig, Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from ttc_tools.fakes.backend import FakeOpenAI  # noqa: E402
from ttc_tools.fakes.service import serve_in_thread  # noqa: E402

COUNTED = (str(ROOT / "app") + os.sep, str(ROOT / "allocators") + os.sep)
COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")
QUESTION = "What is 482 + 37 - 19?"


def request_of(kind: str) -> tuple[str, dict[str, Any]]:
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": QUESTION}]}
    if kind == "chat":
        return "/v1/chat/completions", chat
    if kind == "stream-adaptive":
        return "/v1/chat/completions", {**chat, "stream": True, "ttc": {"policy": "adaptive"}}
    if kind == "batch4":
        return "/v1/ttc/batches", {"model": "fake-model", "prompts": [f"What is {i} + 40?" for i in range(4)],
                                   "budget": {"mean_samples": 2}}
    raise SystemExit(f"unknown kind {kind}")


class Recorder:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, int, str]] = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(COUNTED):
            self.calls[(code.co_filename, code.co_firstlineno, code.co_qualname)] += 1


async def send(client: httpx.AsyncClient, kind: str) -> None:
    path, body = request_of(kind)
    if body.get("stream"):
        async with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200, await resp.aread()
            async for _ in resp.aiter_bytes():
                pass
    else:
        resp = await client.post(path, json=body)
        assert resp.status_code == 200, resp.text


async def trace(kind: str, url: str) -> Recorder:
    settings = Settings(backends=[BackendConfig(url=url, name="fake")], default_model="fake-model",
                        answers={"prestart": True}, pool={"health_interval_s": 3600.0})
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ttc", timeout=30) as client:
            for _ in range(3):  # warm-up: caches, first-use imports, connections
                await send(client, kind)
            rec = Recorder()
            threading_profile = sys.getprofile()
            sys.setprofile(rec)
            try:
                await send(client, kind)
            finally:
                sys.setprofile(threading_profile)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="chat,stream-adaptive,batch4")
    ap.add_argument("--list", default="", help="print the functions of this kind")
    args = ap.parse_args()
    with serve_in_thread(FakeOpenAI(p_correct=0.7)) as url:
        print(f"{'kind':<18} {'files':>5} {'functions':>9} {'calls':>6} {'comprehensions':>14}")
        for kind in args.kinds.split(","):
            rec = asyncio.run(trace(kind, url))
            files = {f for f, _, _ in rec.calls}
            comps = {k: n for k, n in rec.calls.items() if k[2].endswith(COMPREHENSIONS)}
            funcs = {k: n for k, n in rec.calls.items() if k not in comps}
            print(f"{kind:<18} {len(files):>5} {len(funcs):>9} {sum(funcs.values()):>6} {len(comps):>14}")
            if args.list == kind:
                for (f, line, name), n in sorted(rec.calls.items()):
                    print(f"    {Path(f).relative_to(ROOT)}:{line} {name} x{n}")


if __name__ == "__main__":
    main()
