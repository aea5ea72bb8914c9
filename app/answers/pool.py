"""A bounded pool of worker processes for CPU-bound answer work (math-verify parses and checks).

sympy holds the GIL, so threads would still stall the event loop: the work runs in ``workers``
processes (pebble, ``spawn`` context, each worker warmed up by importing math-verify before it takes
a task). Every call has a hard time limit counted from when a worker starts it: a call past its
limit has its worker killed (and replaced) and raises :class:`PoolTimeout`. At most ``max_pending``
calls wait or run at once; more raise :class:`PoolBusy` at once instead of queueing without bound.
Cancelling the awaiting task (a deadline, a client that left) cancels the call; a call already
running has its worker stopped, so abandoned work does not run on.

Callers fall back to a cheap key (or a "no match") on every one of these errors and count it with
``on_fallback(reason)``. The pool starts its workers on first use, so services and tests that never
need it pay nothing.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError as FutureCancelled
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger("ttc.answers")


class PoolError(Exception):
    """The call could not produce a result; ``reason`` is ``timeout``, ``busy`` or ``error``."""

    reason = "error"


class PoolTimeout(PoolError):
    reason = "timeout"


class PoolBusy(PoolError):
    reason = "busy"


def _warm() -> None:
    from app.answers.mathparse import parse_tame

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disabled its alarms

    parse_tame("x+1")


def _noop() -> None:
    return None


class ParsePool:
    """``await pool.run(fn, *args)`` runs a module-level ``fn`` in a worker process."""

    def __init__(self, workers: int = 2, timeout_s: float = 2.0, max_pending: int = 256,
                 on_fallback: Callable[[str], None] | None = None) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.on_fallback = on_fallback
        self.pending = 0
        self._pool: Any = None
        self._warming: Any = None
        self._lock = threading.Lock()

    def _ensure(self) -> Any:
        with self._lock:
            if self._pool is None:
                import pebble

                self._pool = pebble.ProcessPool(max_workers=self.workers, max_tasks=1000, initializer=_warm,
                                                context=multiprocessing.get_context("spawn"))
            return self._pool

    def start(self) -> None:
        """Start (and warm up) the workers now rather than on first use."""
        try:
            self._warming = self._ensure().schedule(_noop)  # pebble starts its workers with the first task
        except Exception as exc:
            log.error("could not start the answer worker pool: %s", exc)

    @property
    def warming(self) -> bool:
        """Started by :meth:`start` and no worker has finished its warm-up yet (each imports
        math-verify, about a second of CPU: a service is not ready to take traffic before)."""
        return self._warming is not None and not self._warming.done()

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """``fn(*args)`` in a worker; raises :class:`PoolTimeout`, :class:`PoolBusy` or :class:`PoolError`."""
        if self.pending >= self.max_pending:
            raise PoolBusy(f"{self.pending} answer computations already pending")
        self.pending += 1
        try:
            try:
                future = self._ensure().schedule(fn, args=args, timeout=timeout_s or self.timeout_s)
            except Exception as exc:  # the pool could not start or has broken down
                log.error("answer worker pool unavailable: %s", exc)
                raise PoolError(f"pool unavailable: {exc}") from None
            try:
                return await asyncio.wrap_future(future)
            except asyncio.CancelledError:
                future.cancel()
                raise
            except TimeoutError:
                raise PoolTimeout(f"{getattr(fn, '__name__', fn)} took over {timeout_s or self.timeout_s:g}s")\
                    from None
            except FutureCancelled:
                raise PoolError("cancelled") from None
            except Exception as exc:
                raise PoolError(f"{type(exc).__name__}: {exc}") from None
        finally:
            self.pending -= 1

    def fallback(self, reason: str) -> None:
        """Count one fallback (a cheap key used because the worker's answer did not come)."""
        if self.on_fallback is not None:
            self.on_fallback(reason)

    def close(self) -> None:
        """Stop the workers (running calls are abandoned)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()
            pool.join(timeout=5)


class InlinePool(ParsePool):
    """Runs calls in this process, without limits: for code that already runs inside a worker."""

    def __init__(self) -> None:
        super().__init__(workers=1)

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        return fn(*args)
