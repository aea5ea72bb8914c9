"""Server-sent events in the OpenAI chunk format for a ttc request.

A stream starts only once its run has shown it can go: :meth:`RunStream.start` runs the request until
its first round completes, so an error before that (a backend refusing the request, a deadline)
becomes an ordinary status code and error envelope, not a 200 followed by an error event.

Order of events: a first chunk with the assistant role, one progress chunk per round, or in the
stream schedule per finished or cancelled sample (empty delta, ``ttc`` = round, samples drawn and
cancelled, current votes); for a one-sample request (``Prepared.passthrough``) instead the sample's
text chunk by chunk as the backend sends it (real time to first token); then the selected answer as
one content chunk (with its tool calls and, when asked, log-probs; not repeated when passed
through), a final chunk with ``finish_reason`` and the full ``ttc``
block, an optional usage chunk (``stream_options.include_usage``), then ``[DONE]``. An error after the
first round is sent as an ``{"error": ...}`` event before ``[DONE]``. If the client goes away, the
generator is closed and the run is cancelled with its in-flight backend calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from app.engine import RoundEvent, RunResult
from app.errors import TTCError
from app.runner import Runner
from app.serving import Prepared, finish_reason, selected, ttc_block

Item = RoundEvent | RunResult | BaseException | str
"""What the run puts in the queue; a ``str`` is a piece of a passed-through sample's text."""


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


def _chunk(prep: Prepared, delta: dict[str, Any] | None, finish: str | None = None,
           text: str | None = None, logprobs: Any = None, **extra: Any) -> dict[str, Any]:
    if prep.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    return {"id": prep.response_id, "object": obj, "created": prep.created, "model": prep.run.model,
            "choices": [choice], **extra}


class RunStream:
    """One streamed run: :meth:`start` (raises the run's error if it fails before its first round),
    then :meth:`events` for the response body."""

    def __init__(self, runner: Runner, prep: Prepared, include_usage: bool) -> None:
        self.runner = runner
        self.prep = prep
        self.include_usage = include_usage
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.first: Item | None = None

    async def _run(self) -> None:
        async def on_round(event: RoundEvent) -> None:
            await self.queue.put(event)

        on_text = self.queue.put_nowait if self.prep.passthrough else None
        try:
            await self.queue.put(await self.runner.run(self.prep.run, on_round, on_text))
        except Exception as exc:
            await self.queue.put(exc)

    async def start(self) -> None:
        self.task = asyncio.create_task(self._run())
        try:
            first = await self.queue.get()
        except BaseException:
            await self.close()
            raise
        if isinstance(first, BaseException):
            await self.close()
            raise first
        self.first = first

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task

    async def events(self) -> AsyncIterator[bytes]:
        prep = self.prep
        try:
            yield _sse(_chunk(prep, {"role": "assistant", "content": ""}))
            item = self.first
            while True:
                if item is None:
                    item = await self.queue.get()
                if isinstance(item, str):
                    yield _sse(_chunk(prep, {"content": item}, text=item))
                    item = None
                    continue
                if isinstance(item, RoundEvent):
                    run = item.runs[0]
                    progress = {"round": item.round, "samples_drawn": item.samples_drawn,
                                "samples_cancelled": item.samples_cancelled, "votes": dict(run.state.votes())}
                    yield _sse(_chunk(prep, {}, ttc=progress))
                    item = None
                    continue
                if isinstance(item, BaseException):
                    err = item if isinstance(item, TTCError) else TTCError("Internal server error.")
                    yield _sse(err.body())
                    break
                for chunk in self._answer(item):
                    yield _sse(chunk)
                break
            yield _sse("[DONE]")
        finally:
            await self.close()

    def _answer(self, result: RunResult) -> list[dict[str, Any]]:
        prep = self.prep
        run, draw = selected(result)
        text = draw.text if draw else ""
        logprobs = draw.logprobs if draw is not None and prep.wants_logprobs else None
        delta: dict[str, Any] = {"content": text}
        if draw is not None and draw.tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(draw.tool_calls)]
        out = [] if prep.passthrough else [_chunk(prep, delta, text=text, logprobs=logprobs)]
        out.append(_chunk(prep, {}, finish=finish_reason(draw), ttc=ttc_block(prep, result, run)))
        if self.include_usage:
            out.append({"id": prep.response_id, "object": out[0]["object"], "created": prep.created,
                        "model": prep.run.model, "choices": [], "usage": result.usage.as_dict()})
        return out
