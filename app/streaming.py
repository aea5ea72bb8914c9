"""Server-sent events in the OpenAI chunk format for a ttc request.

Order of events: a first chunk with the assistant role, one progress chunk per round (empty delta,
``ttc`` = round, samples drawn, current votes), the selected answer as one content chunk, a final
chunk with ``finish_reason`` and the full ``ttc`` block, an optional usage chunk
(``stream_options.include_usage``), then ``[DONE]``. An error after the stream started is sent as
an ``{"error": ...}`` event before ``[DONE]``. If the client goes away, the generator is cancelled
and so is the engine run with its in-flight backend calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from app.engine import RoundEvent, RunResult
from app.errors import TTCError
from app.serving import Prepared, execute, ttc_block, usage_json
from app.state import AppState


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def _chunk(prep: Prepared, delta: dict[str, Any] | None, finish: str | None = None,
           text: str | None = None, **extra: Any) -> dict[str, Any]:
    if prep.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": prep.id, "object": obj, "created": prep.created, "model": prep.model,
            "choices": [choice], **extra}


async def stream_events(state: AppState, prep: Prepared, include_usage: bool) -> AsyncIterator[bytes]:
    queue: asyncio.Queue[RoundEvent | RunResult | BaseException] = asyncio.Queue()

    async def on_round(event: RoundEvent) -> None:
        await queue.put(event)

    async def runner() -> None:
        try:
            await queue.put(await execute(state, prep, on_round))
        except Exception as exc:
            await queue.put(exc)

    task = asyncio.create_task(runner())
    try:
        yield _sse(_chunk(prep, {"role": "assistant", "content": ""}))
        while True:
            item = await queue.get()
            if isinstance(item, RoundEvent):
                run = item.runs[0]
                votes = dict(run.state.votes())
                progress = {"round": item.round, "samples_drawn": item.samples_drawn, "votes": votes}
                yield _sse(_chunk(prep, {}, ttc=progress))
                continue
            if isinstance(item, BaseException):
                err = item if isinstance(item, TTCError) else TTCError("Internal server error.")
                yield _sse(err.body())
                break
            result = item
            run = result.runs[0]
            sel = run.selection
            draw = run.draws[sel.index] if sel else None
            text = draw.text if draw else ""
            yield _sse(_chunk(prep, {"content": text}, text=text))
            finish = (draw.finish_reason if draw else None) or "stop"
            final = _chunk(prep, {}, finish=finish, ttc=ttc_block(prep, result, run))
            if prep.kind == "completion":
                final["choices"][0]["text"] = ""
            yield _sse(final)
            if include_usage:
                yield _sse({"id": prep.id, "object": _chunk(prep, None)["object"], "created": prep.created,
                            "model": prep.model, "choices": [], "usage": usage_json(result.usage)})
            break
        yield _sse("[DONE]")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
