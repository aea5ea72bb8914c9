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

from app.errors import TTCError
from app.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChunk,
    CompletionChunkChoice,
    TTCBlock,
    TTCProgress,
    Usage,
    sse,
)
from app.run import RoundEvent, RunResult
from app.serving import OpenAIServing, Prepared, finish_reason, selected, thought_fields, ttc_block, usage_of


class Thought(str):
    """A piece of a passed-through sample's thought (reasoning models)."""


Item = TTCProgress | RunResult | BaseException | str
"""What the run puts in the queue; a ``str`` is a piece of a passed-through sample's text (a
:class:`Thought`: of its thought)."""
Chunk = ChatCompletionChunk | CompletionChunk


def chunk(prep: Prepared, delta: ChatDelta | None = None, *, text: str = "", finish: str | None = None,
          logprobs: Any = None, ttc: TTCBlock | TTCProgress | None = None, usage: Usage | None = None,
          last: bool = False) -> Chunk:
    """One event of the stream (``last``: the usage event, with no choice)."""
    if prep.kind == "chat":
        choices = [] if last else [ChatChunkChoice(delta=delta or ChatDelta(), finish_reason=finish,
                                                   logprobs=logprobs)]
        return ChatCompletionChunk(id=prep.response_id, created=prep.created, model=prep.spec.model,
                                   choices=choices, ttc=ttc, usage=usage)
    completion = [] if last else [CompletionChunkChoice(text=text, finish_reason=finish, logprobs=logprobs)]
    return CompletionChunk(id=prep.response_id, created=prep.created, model=prep.spec.model, choices=completion,
                           ttc=ttc, usage=usage)


class RunStream:
    """One streamed run: :meth:`start` (raises the run's error if it fails before its first round),
    then :meth:`events` for the response body."""

    def __init__(self, serving: OpenAIServing, prep: Prepared, include_usage: bool) -> None:
        self.serving = serving
        self.prep = prep
        self.include_usage = include_usage
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.first: Item | None = None

    async def _run(self) -> None:
        async def on_round(event: RoundEvent) -> None:  # read now: the run's state moves on
            await self.queue.put(TTCProgress(round=event.round, samples_drawn=event.samples_drawn,
                                             samples_cancelled=event.samples_cancelled,
                                             votes=dict(event.runs[0].state.votes())))

        def on_text(piece: str, thought: bool) -> None:
            self.queue.put_nowait(Thought(piece) if thought else piece)

        try:
            relay = on_text if self.prep.passthrough else None
            await self.queue.put(await self.serving.run(self.prep, on_round, relay))
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
            yield sse(chunk(prep, ChatDelta(role="assistant", content="")))
            item = self.first
            while True:
                if item is None:
                    item = await self.queue.get()
                if isinstance(item, Thought):
                    yield sse(chunk(prep, ChatDelta(reasoning=str(item))))
                elif isinstance(item, str):
                    yield sse(chunk(prep, ChatDelta(content=item), text=item))
                elif isinstance(item, TTCProgress):
                    yield sse(chunk(prep, ttc=item))
                elif isinstance(item, BaseException):
                    err = item if isinstance(item, TTCError) else TTCError("Internal server error.")
                    yield sse(err.body())
                    break
                else:
                    for event in self._answer(item):
                        yield sse(event)
                    break
                item = None
            yield sse("[DONE]")
        finally:
            await self.close()

    def _answer(self, result: RunResult) -> list[Chunk]:
        prep = self.prep
        run, draw = selected(result)
        text = draw.text if draw else ""
        logprobs = draw.logprobs if draw is not None and prep.wants_logprobs else None
        calls = [{"index": i, **call} for i, call in enumerate(draw.tool_calls)] if draw and draw.tool_calls else None
        out: list[Chunk] = []
        if not prep.passthrough:  # as vLLM streams it: the thought first, then the answer
            thought = thought_fields(draw)
            if thought and prep.kind == "chat":
                out.append(chunk(prep, ChatDelta(**thought)))
            out.append(chunk(prep, ChatDelta(content=text, tool_calls=calls), text=text, logprobs=logprobs))
        out.append(chunk(prep, finish=finish_reason(draw), ttc=ttc_block(prep, result, run)))
        if self.include_usage:
            out.append(chunk(prep, usage=usage_of(result), last=True))
        return out
