"""Samples in flight: the engine launches backend calls here and waits for the next one to finish.

Two implementations of one small surface (:meth:`launch`, :meth:`wait`, :meth:`cancel`,
:meth:`cancel_all`, ``now``):

* :class:`LiveFlights`: each call is an ``asyncio`` task; :meth:`wait` returns as soon as one or more
  finish (or the deadline passes); :meth:`cancel` cancels the task, which closes its backend
  connection (a streamed vLLM request is then aborted). The tokens it had received stay in its
  :class:`~app.backends.base.Progress`.
* :class:`SimulatedFlights`: for sources that answer without I/O (replay). A call runs to completion
  at launch, but its result is held until its simulated finish time, ``start + duration`` with the
  duration of a call its largest sample's token count (one token per step, the samples of a call
  decoded side by side). ``now`` is that clock in token steps; a cancelled call has generated
  ``min(tokens, now - start)`` tokens. So replay reports what a stream or rounds schedule costs in
  latency (token steps) and tokens, with the same engine loop as live traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from app.backends.base import Progress

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Flight:
    """One backend call in flight: ``n`` samples of the query ``run_id``, ``reserved`` tokens held for
    it in the token budget, ``progress`` the tokens it has produced so far, started at ``started``."""

    run_id: str
    n: int
    reserved: int
    started: float
    progress: Progress = field(default_factory=Progress)


class LiveFlights(Generic[T]):
    """Calls as ``asyncio`` tasks on the running loop (``now``: the loop's clock, seconds)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._tasks: dict[asyncio.Task[T], Flight] = {}

    @property
    def now(self) -> float:
        return self.loop.time()

    def __len__(self) -> int:
        return len(self._tasks)

    def flights(self) -> list[Flight]:
        return list(self._tasks.values())

    async def launch(self, flight: Flight, call: Coroutine[Any, Any, T], duration: Any = None) -> None:
        self._tasks[asyncio.ensure_future(call)] = flight

    async def wait(self, deadline: float | None) -> list[tuple[Flight, T | BaseException]]:
        """The calls that finished (at least one, unless ``deadline`` passed first: then ``[]``)."""
        timeout = None if deadline is None else max(0.0, deadline - self.loop.time())
        done, _ = await asyncio.wait(self._tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        out: list[tuple[Flight, T | BaseException]] = []
        for task in done:
            flight = self._tasks.pop(task)
            exc = task.exception()
            out.append((flight, exc if exc is not None else task.result()))
        return out

    async def cancel(self, flights: list[Flight]) -> None:
        """Cancel these calls and wait until each has closed its connection."""
        doomed = {t for t, f in self._tasks.items() if f in flights}
        for task in doomed:
            task.cancel()
            del self._tasks[task]
        for task in doomed:
            with contextlib.suppress(BaseException):
                await task

    async def cancel_all(self) -> None:
        await self.cancel(self.flights())


class SimulatedFlights(Generic[T]):
    """Calls of an I/O-free source on a simulated clock of token steps (see the module doc)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Flight, T | BaseException]] = []
        self._order = itertools.count()
        self._live: set[int] = set()

    def __len__(self) -> int:
        return len(self._live)

    def flights(self) -> list[Flight]:
        return [f for _, i, f, _ in self._heap if i in self._live]

    async def launch(self, flight: Flight, call: Coroutine[Any, Any, T], duration: Any = None) -> None:
        """Run ``call`` now; ``duration(result)`` gives its length in token steps."""
        result: T | BaseException
        try:
            result = await call
            steps = float(duration(result)) if duration is not None else 1.0
        except Exception as exc:  # delivered at its time, as a live failure would be
            result, steps = exc, 0.0
        i = next(self._order)
        self._live.add(i)
        heapq.heappush(self._heap, (self.now + max(steps, 1.0), i, flight, result))

    async def wait(self, deadline: float | None) -> list[tuple[Flight, T | BaseException]]:
        """Advance the clock to the next finish time; every call finishing then (replay has no
        wall-clock deadline)."""
        out: list[tuple[Flight, T | BaseException]] = []
        while self._heap:
            at, i, flight, result = self._heap[0]
            if i not in self._live:
                heapq.heappop(self._heap)
                continue
            if out and at > self.now:
                break
            heapq.heappop(self._heap)
            self._live.discard(i)
            self.now = at
            out.append((flight, result))
        return out

    async def cancel(self, flights: list[Flight]) -> None:
        """Drop these calls; each has generated ``min(its tokens, now - start)`` tokens."""
        doomed = {id(f) for f in flights}
        for _, i, flight, _ in self._heap:
            if i in self._live and id(flight) in doomed:
                self._live.discard(i)
                total = flight.progress.tokens
                flight.progress.tokens = min(total, int(self.now - flight.started))

    async def cancel_all(self) -> None:
        await self.cancel(self.flights())
