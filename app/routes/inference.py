"""OpenAI-compatible inference routes: thin wrappers over :mod:`app.serving` and the run service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive

from app.deps import Inference, InferenceDep
from app.errors import ClientClosed
from app.protocol import (
    INFERENCE_RESPONSES,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelJSON,
    request_body,
)
from app.serving import Kind
from app.streaming import RunStream

router = APIRouter(tags=["inference"])
T = TypeVar("T")
B = TypeVar("B", bound=BaseModel)


async def _wait_disconnect(receive: Receive) -> None:
    """Return when the client disconnects (the body has already been read by then)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """``await work``, cancelling it (and its backend calls) if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        watcher.cancel()
    if task.cancelled():
        raise ClientClosed("client disconnected")
    return task.result()


async def _serve(ctx: Inference, body: ChatCompletionRequest | CompletionRequest, kind: Kind, request: Request,
                 started: float) -> Any:
    serving = ctx.serving
    prep = await serving.prepare(body, kind, ctx.caller, ctx.request_id, started)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = RunStream(serving, prep, include_usage)
        await until_disconnect(stream.start(), request.receive)
        return StreamingResponse(stream.events(), media_type="text/event-stream")
    result = await until_disconnect(serving.run(prep), request.receive)
    return ModelJSON(serving.response(prep, result))


@router.post("/v1/chat/completions", response_model=None, responses=INFERENCE_RESPONSES(ChatCompletionResponse),
             openapi_extra=request_body(ChatCompletionRequest))
async def chat_completions(request: Request, ctx: InferenceDep) -> Any:
    """An OpenAI chat completion answered by a test-time compute policy (``ttc``): the service draws
    samples, stops when the policy says, and returns the selected one with a ``ttc`` block. With
    ``stream: true``, server-sent events (round progress, then the answer)."""
    started = time.perf_counter()
    return await _serve(ctx, ctx.serving.parse(await request.body(), "chat"), "chat", request, started)


@router.post("/v1/completions", response_model=None, responses=INFERENCE_RESPONSES(CompletionResponse),
             openapi_extra=request_body(CompletionRequest))
async def completions(request: Request, ctx: InferenceDep) -> Any:
    """An OpenAI text completion answered by a test-time compute policy (see chat completions)."""
    started = time.perf_counter()
    return await _serve(ctx, ctx.serving.parse(await request.body(), "completion"), "completion", request, started)
