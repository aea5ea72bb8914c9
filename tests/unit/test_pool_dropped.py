"""A connection the server drops (a kept-alive connection it had just closed, a reset under load) is
retried, on the same backend when it is the only one, without taking the backend out; a refused
connection still opens its circuit at once."""

from __future__ import annotations

from typing import Any

import pytest

from app.backends.base import Draw, DrawResult, SamplingRequest, Usage
from app.backends.openai import BackendCallError, OpenAIBackend
from app.backends.pool import BackendPool, BackendUnavailable
from app.config import BackendPoolConfig


class Flaky(OpenAIBackend):
    def __init__(self, failures: list[BackendCallError]) -> None:
        super().__init__("http://backend", None, name="only")  # type: ignore[arg-type]
        self.failures = failures
        self.calls = 0

    async def draw(self, request: SamplingRequest, n: int, **_: Any) -> DrawResult:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        draws = [Draw(text="The answer is 4.", finish_reason="stop", tokens=5)] * n
        return DrawResult(draws, Usage(3, 5 * n), latency_s=0.01)


REQUEST = SamplingRequest(kind="chat", model="m", messages=[{"role": "user", "content": "2 + 2?"}], params={})
CONFIG = BackendPoolConfig(retry_backoff_s=0.0, max_retries=2)


async def test_a_dropped_connection_is_retried_on_the_only_backend_which_stays_in() -> None:
    backend = Flaky([BackendCallError("only: ServerDisconnectedError", retryable=True, dropped=True)])
    pool = BackendPool([backend], CONFIG)
    result = await pool.draw(REQUEST, 2)
    assert len(result.draws) == 2 and backend.calls == 2
    assert not backend.down_reason


async def test_a_refused_connection_takes_the_backend_out_at_once() -> None:
    backend = Flaky([BackendCallError("only: ClientConnectorError", retryable=True)])
    pool = BackendPool([backend], CONFIG)
    with pytest.raises(BackendUnavailable):
        await pool.draw(REQUEST, 2)
    assert backend.down_reason and backend.calls == 1
