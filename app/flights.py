"""Calls in flight: the engine launches backend calls here and waits for what they deliver next.

A call is an async iterator of deliveries (the samples of a ``rounds`` call all at once; those of a
streamed call one by one as each finishes, see :meth:`~app.backends.base.SampleSource.stream`).
Two implementations of one small surface (:meth:`launch`, :meth:`wait`, :meth:`cancel`, ``now``):

* :class:`LiveFlights`: each call is consumed by an ``asyncio`` task that queues its deliveries;
  :meth:`wait` returns as soon as something is queued (or the deadline passes); :meth:`cancel`
  cancels the task, which closes its backend connection (vLLM then aborts the request).
* :class:`SimulatedFlights`: for sources that answer without I/O (replay). A call is consumed
  whole at launch, and each delivery is held until its simulated time, ``start + tokens`` of its
  longest sample (one token per step; the samples of a call decode side by side). ``now`` is that
  clock in token steps; the samples of a call cancelled at ``now`` had generated ``min(tokens,
  now - start)`` tokens each. Replay thus reports what a schedule costs in latency (token steps)
  and tokens, through the same engine loop as live traffic.

A delivery is ``(flight, item)``: an item the call yielded, :data:`DONE` when it ended, or the
exception it raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from app.backends.base import Progress

T = TypeVar("T")
DONE = object()
"""Delivered once a call has ended normally."""


@dataclass(eq=False, slots=True)
class Flight:
    """One backend call in flight: ``n`` samples of the query ``run_id``, ``reserve`` tokens held per
    undelivered sample in the token budget, ``delivered`` samples so far, started at ``started`` in
    the run's round (stream schedule: launch wave) ``round``; ``progress`` holds the tokens of its
    unfinished samples; ``streamed``: its samples count in the engine's streamed in-flight total."""

    run_id: str
    n: int
    reserve: int
    started: float
    round: int = 0
    streamed: bool = False
    delivered: int = 0
    progress: Progress = field(default_factory=Progress)

    @property
    def pending(self) -> int:
        return self.n - self.delivered


Delivery = tuple[Flight, object]


class LiveFlights(Generic[T]):
    """Calls consumed by ``asyncio`` tasks on the running loop (``now``: the loop's clock, seconds)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._tasks: dict[Flight, asyncio.Task[None]] = {}
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()

    @property
    def now(self) -> float:
        return self.loop.time()

    def __len__(self) -> int:
        return len(self._tasks)

    def flights(self) -> list[Flight]:
        return list(self._tasks)

    async def launch(self, flight: Flight, call: AsyncIterator[T], steps: Callable[[T], float]) -> None:
        self._tasks[flight] = asyncio.ensure_future(self._pump(flight, call))

    async def _pump(self, flight: Flight, call: AsyncIterator[T]) -> None:
        try:
            async for item in call:
                self._queue.put_nowait((flight, item))
        except Exception as exc:
            self._queue.put_nowait((flight, exc))
        else:
            self._queue.put_nowait((flight, DONE))

    async def wait(self, deadline: float | None) -> list[Delivery]:
        """What was delivered (at least one, unless ``deadline`` passed first: then ``[]``). A call is
        no longer in flight once its :data:`DONE` or exception is delivered."""
        if self._queue.empty():
            timeout = None if deadline is None else max(0.0, deadline - self.loop.time())
            try:
                async with asyncio.timeout(timeout):
                    first = await self._queue.get()
            except TimeoutError:
                return []
            out = [first]
        else:
            out = []
        while not self._queue.empty():
            out.append(self._queue.get_nowait())
        live = [(f, item) for f, item in out if f in self._tasks]
        for f, item in live:
            if item is DONE or isinstance(item, BaseException):
                del self._tasks[f]
        return live

    async def cancel(self, flights: list[Flight]) -> list[Delivery]:
        """Cancel these calls and wait until each has closed its connection; returns what they had
        queued and nobody had taken yet (finished samples the caller may still want to bill)."""
        doomed = [self._tasks.pop(f) for f in flights if f in self._tasks]
        for task in doomed:
            task.cancel()
        for task in doomed:
            with contextlib.suppress(BaseException):
                await task
        gone = set(flights)
        kept: list[Delivery] = []
        stale: list[Delivery] = []
        while not self._queue.empty():
            d = self._queue.get_nowait()
            (stale if d[0] in gone else kept).append(d)
        for d in kept:
            self._queue.put_nowait(d)
        return stale


class SimulatedFlights(Generic[T]):
    """Calls of an I/O-free source on a simulated clock of token steps (see the module doc)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Flight, object, float]] = []
        self._order = itertools.count()
        self._live: dict[Flight, int] = {}

    def __len__(self) -> int:
        return len(self._live)

    def flights(self) -> list[Flight]:
        return list(self._live)

    async def launch(self, flight: Flight, call: AsyncIterator[T], steps: Callable[[T], float]) -> None:
        """Consume ``call`` now; each item is delivered ``steps(item)`` (at least 1) after the start;
        an item of no steps (the call's closing usage) and the end of the call come with the last."""
        end = self.now + 1.0
        try:
            async for item in call:
                n = steps(item)
                at = self.now + max(1.0, n) if n > 0 else end
                end = max(end, at)
                self._push(at, flight, item, n)
        except Exception as exc:  # delivered at its time, as a live failure would be
            self._push(end, flight, exc, 0.0)
        else:
            self._push(end, flight, DONE, 0.0)
        self._live[flight] = self._live.get(flight, 0)

    def _push(self, at: float, flight: Flight, item: object, steps: float) -> None:
        heapq.heappush(self._heap, (at, next(self._order), flight, item, steps))

    async def wait(self, deadline: float | None) -> list[Delivery]:
        """Advance the clock to the next delivery time; everything delivered then (replay has no
        wall-clock deadline)."""
        out: list[Delivery] = []
        while self._heap:
            at, _, flight, item, _ = self._heap[0]
            if flight not in self._live:
                heapq.heappop(self._heap)
                continue
            if out and at > self.now:
                break
            heapq.heappop(self._heap)
            self.now = at
            out.append((flight, item))
            if item is DONE or isinstance(item, BaseException):
                del self._live[flight]
        return out

    async def cancel(self, flights: list[Flight]) -> list[Delivery]:
        """Drop these calls. Their unfinished samples had generated ``min(tokens, now - start)`` each:
        that goes into each flight's ``progress.tokens``."""
        for flight in flights:
            if self._live.pop(flight, None) is None:
                continue
            elapsed = self.now - flight.started
            flight.progress.tokens = sum(int(min(steps, elapsed)) for at, _, f, item, steps in self._heap
                                         if f is flight and at > self.now and steps > 0)
        return []
