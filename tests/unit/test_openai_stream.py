"""The OpenAI backend's streamed calls share the event loop fairly, however fast the backend sends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping

import orjson
import pytest

from app.backends.base import Progress, SamplingRequest
from app.backends.openai import OpenAIBackend, StreamAccumulator

TOTAL = 200_000


class HotStream:
    """A streamed answer whose lines are all buffered already: reading it never waits on I/O."""

    status = 200

    def __init__(self) -> None:
        self.sent = 0
        self.closed = False

    async def lines(self) -> AsyncIterator[bytes]:
        chunk = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})
        while self.sent < TOTAL:
            self.sent += 1
            yield chunk

    async def read(self) -> bytes:
        return b""

    def abort(self) -> None:
        self.closed = True


class HotHTTP:
    def __init__(self) -> None:
        self.stream_ = HotStream()

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        raise AssertionError("not used")

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        raise AssertionError("not used")

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float,
                     read_timeout_s: float) -> AsyncIterator[HotStream]:
        try:
            yield self.stream_
        finally:
            self.stream_.closed = True


async def test_a_stream_with_everything_buffered_lets_timers_and_cancels_through() -> None:
    """Without yielding between lines, the callback below could only run once all 200,000 lines were
    read: a deadline would pass unnoticed for as long as the backend kept the buffer full."""
    http = HotHTTP()
    backend = OpenAIBackend("http://hot", http)
    request = SamplingRequest(kind="chat", model="m", messages=[{"role": "user", "content": "hi"}])

    async def consume() -> None:
        async for _ in backend.stream(request, 1, Progress()):
            pass

    task = asyncio.create_task(consume())
    woken = asyncio.Event()
    asyncio.get_running_loop().call_soon(woken.set)  # any other callback (a deadline's timer, a cancel)
    await woken.wait()
    read_when_woken = http.stream_.sent
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert 0 < read_when_woken < TOTAL
    assert http.stream_.closed  # the cancel closed the stream (vLLM then aborts the request)


def test_a_cancelled_interval_stream_bills_what_its_siblings_show_it_generated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks every 16 tokens, one token a second: after choice 0's chunks at tokens 1, 16 and 25 (its
    end), choice 1, last seen at token 16, has decoded 9 more tokens beside it (not yet reported)."""
    clock = iter([0.0, 0.0, 15.0, 15.0, 24.0])
    monkeypatch.setattr("app.backends.openai.time.monotonic", lambda: next(clock))
    acc = StreamAccumulator("chat", 2)

    def chunk(i: int, tokens: int, finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": i, "delta": {"content": "x"}, "finish_reason": finish}],
                                       "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}).encode()

    for i, tokens in ((0, 1), (1, 1), (0, 16), (1, 16)):
        acc.feed(chunk(i, tokens))
    assert acc.unseen(16) == 0  # nothing seen past the latest chunk
    acc.feed(chunk(0, 25, "stop"))
    assert acc.pending_tokens == 16 and acc.unseen(16) == 9
    assert acc.unseen(4) == 3  # never more than a chunk's worth
