"""Sharing the sandbox's slots between API keys (:class:`FairSlots`).

``owner`` is the API key a program runs for. A program that
finds no free slot waits in its key's queue, and each slot that frees goes to the waiting key served
least recently (round-robin over keys: one key flooding the sandbox with slow programs delays another
key's program by at most one turn per other waiting key, not by its whole queue);
``max_running_per_key`` optionally caps the slots one key holds. A key's program that would wait
behind ``max_queued_per_key`` of its own is refused with a 429 (:class:`SandboxBusy`), one that would
wait behind ``max_queued`` keyed programs in all with a 503 (:class:`SandboxOverloaded`). Programs
without an owner (auth off, the config's admin keys, offline tools such as replay) take their turns
as one more key and are never refused: they are the operator's own.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Protocol

from app.errors import BackendUnavailable, RateLimited


class SandboxBusy(RateLimited):
    """429: the caller's key already has ``max_queued_per_key`` programs waiting for the sandbox."""

    code = "sandbox_queue_full"


class SandboxOverloaded(BackendUnavailable):
    """503: ``max_queued`` programs of all keys together are waiting for the sandbox."""

    code = "sandbox_overloaded"


SANDBOX_FULL = (SandboxBusy, SandboxOverloaded)


class SlotLimits(Protocol):
    """The limits :class:`FairSlots` keeps (:class:`~app.sandbox.SandboxConfig`'s fields)."""

    @property
    def max_concurrent(self) -> int: ...
    @property
    def max_running_per_key(self) -> int | None: ...
    @property
    def max_queued_per_key(self) -> int: ...
    @property
    def max_queued(self) -> int: ...
    @property
    def wall_s(self) -> float: ...


class FairSlots:
    """``limits.max_concurrent`` slots shared by owners (API keys; ``None`` is one more owner): a program takes
    a free slot at once when nobody waits, else waits in its owner's FIFO queue; every freed slot goes to the
    first program of the waiting owner served least recently (never served: first), skipping owners at
    ``max_running_per_key``. Queue limits as in the module doc. ``granted`` counts every program started
    (the queue's turns)."""

    def __init__(self, limits: SlotLimits) -> None:
        self.config = limits
        self.running = 0
        self.granted = 0
        self.queued = 0  # waiting programs, all owners
        self.queued_keyed = 0  # of which with an owner
        self._running: dict[str | None, int] = {}
        self._waiting: dict[str | None, deque[asyncio.Future[int]]] = {}
        self._served: dict[str | None, int] = {}  # owner -> the turn it last got (only owners still present)

    def waiting(self, owner: str | None) -> int:
        return len(self._waiting.get(owner, ()))

    def running_for(self, owner: str | None) -> int:
        return self._running.get(owner, 0)

    async def acquire(self, owner: str | None) -> int:
        """Wait for a slot; returns the turns (programs started) it waited. Raises :class:`SandboxBusy` or
        :class:`SandboxOverloaded` instead of waiting behind a full queue; a cancelled wait leaves the
        queue (a slot granted meanwhile is handed on)."""
        since = self.granted
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(fut)
        self.queued += 1
        self.queued_keyed += owner is not None
        self._dispatch()
        if not fut.done():
            self._admit(owner, fut)
        try:
            turn = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(owner)  # granted, but its program will not run
            else:
                self._leave(owner, fut)
            raise
        return turn - since - 1

    def release(self, owner: str | None) -> None:
        """A program of ``owner`` ended: its slot goes to the next waiting program."""
        self.running -= 1
        left = self._running[owner] - 1
        if left:
            self._running[owner] = left
        else:
            del self._running[owner]
            if owner not in self._waiting:
                self._served.pop(owner, None)
        self._dispatch()

    def _admit(self, owner: str | None, fut: asyncio.Future[int]) -> None:
        cfg = self.config
        if owner is None:
            return
        mine = len(self._waiting[owner]) - 1
        if mine >= cfg.max_queued_per_key:
            self._leave(owner, fut)
            raise SandboxBusy(
                f"This key already has {mine} programs waiting for the sandbox (its limit is "
                f"{cfg.max_queued_per_key}); retry when some have run.", headers=self._retry_after())
        ahead = self.queued_keyed - 1
        if ahead >= cfg.max_queued:
            self._leave(owner, fut)
            raise SandboxOverloaded(
                f"{ahead} programs of all keys are waiting for the sandbox (the limit is {cfg.max_queued}); retry "
                "later.", headers=self._retry_after())

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.config.wall_s)))}  # a slot frees by then at the latest

    def _leave(self, owner: str | None, fut: asyncio.Future[int]) -> None:
        """``fut`` stops waiting (unless :meth:`_dispatch` already dropped it, cancelled)."""
        queue = self._waiting.get(owner)
        if queue is None or fut not in queue:
            return
        queue.remove(fut)
        self._dequeued(owner, queue)

    def _dequeued(self, owner: str | None, queue: deque[asyncio.Future[int]]) -> None:
        self.queued -= 1
        self.queued_keyed -= owner is not None
        if not queue:
            del self._waiting[owner]
            if owner not in self._running:
                self._served.pop(owner, None)

    def _next_owner(self) -> tuple[bool, str | None]:
        cap = self.config.max_running_per_key
        best: tuple[bool, str | None] = (False, None)
        best_turn = -1
        for owner in self._waiting:
            if cap is not None and self._running.get(owner, 0) >= cap:
                continue
            turn = self._served.get(owner, 0)
            if not best[0] or turn < best_turn:
                best, best_turn = (True, owner), turn
        return best

    def _dispatch(self) -> None:
        while self.running < self.config.max_concurrent:
            found, owner = self._next_owner()
            if not found:
                return
            queue = self._waiting[owner]
            fut = queue.popleft()
            self._dequeued(owner, queue)
            if fut.done():  # its waiter was cancelled and has not left yet
                continue
            self.running += 1
            self._running[owner] = self._running.get(owner, 0) + 1
            self.granted += 1
            self._served[owner] = self.granted
            fut.set_result(self.granted)
