"""OpenAI-compatible inference routes: thin wrappers over :mod:`app.serving`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Receive

from app.auth import Principal
from app.ratelimit import CallerDep
from app.serving import Kind, execute, prepare, response_json
from app.state import StateDep
from app.streaming import stream_events
from app.wire import ChatCompletionRequest, CompletionRequest

router = APIRouter(tags=["inference"])


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the body has already been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _serve(state: Any, body: ChatCompletionRequest | CompletionRequest, kind: Kind,
                 request: Request, caller: Principal) -> Any:
    start = time.perf_counter()
    prep = await prepare(state, body, kind, caller)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream_events(state, prep, include_usage), media_type="text/event-stream")
    work = asyncio.ensure_future(execute(state, prep))
    watcher = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():  # the client went away: stop drawing, close backend connections
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
        watcher.cancel()
    if work.cancelled():
        return JSONResponse({"error": {"message": "client disconnected", "type": "cancelled",
                                       "param": None, "code": "client_closed_request"}}, status_code=499)
    result = work.result()
    state.metrics.request_latency.labels(kind).observe(time.perf_counter() - start)
    return JSONResponse(response_json(prep, result))


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request, state: StateDep,
                           caller: CallerDep) -> Any:
    return await _serve(state, body, "chat", request, caller)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: StateDep, caller: CallerDep) -> Any:
    return await _serve(state, body, "completion", request, caller)
