"""Waiting on things the test does not control (another process), without fixed delays."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable


async def until(predicate: Callable[[], bool], *, timeout_s: float = 60, what: str = "the condition") -> None:
    """Return as soon as ``predicate()`` holds (checked every 10 ms); fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(0.01)


async def until_true(predicate: Callable[[], Awaitable[bool]], *, timeout_s: float = 60,
                     what: str = "the condition") -> None:
    """:func:`until` for a predicate that must await (a store read, an HTTP call)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        await asyncio.sleep(0.01)


async def exited(pid: int, *, timeout_s: float = 10) -> bool:
    """Whether process ``pid`` exits within ``timeout_s`` (a pidfd becomes readable when it does)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await asyncio.wait_for(done, timeout_s)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)
