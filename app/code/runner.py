"""Run candidate programs' tests and behaviour probes in the sandbox, once per distinct input.

:class:`CodeRunner` caches each result per distinct (program, tests) or (program, calls) in a
bounded LRU (keys are SHA-256 digests, so memory is bounded by ``cache_size`` small entries), and
concurrent identical requests share one run (in the sandbox turn of the key that asked first). A
shared run is cancelled (and its process tree killed, see :mod:`app.sandbox`) only when every request
waiting on it has been cancelled.
Results with status ``sandbox_error`` are not cached (the next request tries again).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from cachetools import LRUCache

from app.code.behaviour import MARKER as BEHAVIOUR_MARKER
from app.code.behaviour import build_behaviour_script
from app.code.harness import MARKER as TESTS_MARKER
from app.code.harness import CodeTests, build_test_script, plan_tests
from app.sandbox import ExecStatus, Sandbox

log = logging.getLogger("ttc.code")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """``passed`` of ``total`` tests; ``status`` is how the sandboxed run ended (``ok`` normally)."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    passed: int
    total: int
    status: ExecStatus

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


class _Flight:
    __slots__ = ("task", "waiters")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.waiters = 0


class CodeRunner:
    """Executes tests and behaviour probes of candidate programs through ``sandbox``."""

    def __init__(self, sandbox: Sandbox, cache_size: int = 4096, *, test_timeout_s: float = 3.0) -> None:
        self.sandbox = sandbox
        self.test_timeout_s = test_timeout_s  # alarm per test / per behaviour call, inside the run
        self.runs = 0  # sandbox processes started (cache misses)
        self.test_runs = 0  # of which test runs
        self.behaviour_runs = 0  # of which behaviour probes
        self.sandbox_s = 0.0  # wall seconds of those runs, summed
        self._cache: LRUCache[str, Any] = LRUCache(maxsize=cache_size)
        self._flights: dict[str, _Flight] = {}

    async def run_tests(self, program: str, tests: CodeTests, owner: str | None = None) -> TestOutcome:
        """How many of ``tests`` ``program`` passes, run for ``owner`` (the API key whose turn in the
        sandbox it takes). Raises :class:`app.sandbox.SandboxUnavailable`, and
        :class:`app.sandbox_queue.SandboxBusy` / :class:`app.sandbox_queue.SandboxOverloaded` when its queue is full."""
        key = _key("tests", program, tests.model_dump_json())
        return await self._shared(key, lambda: self._run_tests(program, tests, owner))

    async def behaviour(self, program: str, calls: list[str], owner: str | None = None) -> str | None:
        """A stable key of what ``program`` returns on ``calls`` (SHA-256 of the outputs), or None
        when the program could not run (or there are no calls). Raises as :meth:`run_tests`."""
        if not calls:
            return None
        key = _key("behaviour", program, json.dumps(calls))
        return await self._shared(key, lambda: self._behaviour(program, calls, owner))

    async def _run_tests(self, program: str, tests: CodeTests, owner: str | None) -> TestOutcome:
        total = plan_tests(tests).total
        script = build_test_script(program, tests, test_timeout_s=self.test_timeout_s)
        result = await self.sandbox.run(script, owner=owner)
        self.runs += 1
        self.test_runs += 1
        self.sandbox_s += result.wall_s
        passed = 0
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(TESTS_MARKER):
                passed = _parse_score(line[len(TESTS_MARKER):], total)
                break
        if result.status == "sandbox_error":
            log.warning("sandbox error while testing a candidate: %s", result.stderr[-300:])
        return TestOutcome(passed, total, result.status)

    async def _behaviour(self, program: str, calls: list[str], owner: str | None) -> str | None:
        script = build_behaviour_script(program, calls, call_timeout_s=self.test_timeout_s)
        result = await self.sandbox.run(script, owner=owner)
        self.runs += 1
        self.behaviour_runs += 1
        self.sandbox_s += result.wall_s
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(BEHAVIOUR_MARKER):
                try:
                    outputs = json.loads(line[len(BEHAVIOUR_MARKER):])
                except ValueError:
                    return None
                if not isinstance(outputs, list) or len(outputs) != len(calls):
                    return None
                return hashlib.sha256(json.dumps(outputs).encode()).hexdigest()
        return None

    async def _shared(self, key: str, make: Callable[[], Awaitable[T]]) -> T:
        if key in self._cache:
            return self._cache[key]
        flight = self._flights.get(key)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(make()))
            self._flights[key] = flight
            flight.task.add_done_callback(functools.partial(self._landed, key, flight))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                if self._flights.get(key) is flight:
                    del self._flights[key]  # a later request starts afresh instead of joining a dying run
                flight.task.cancel()

    def _landed(self, key: str, flight: _Flight, _task: object = None) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        task = flight.task
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        if not (isinstance(result, TestOutcome) and result.status == "sandbox_error"):
            self._cache[key] = result


def _key(kind: str, program: str, spec: str) -> str:
    h = hashlib.sha256()
    for part in (kind, program, spec):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def _parse_score(payload: str, total: int) -> int:
    """``passed`` from the harness's JSON; 0 when it is malformed or names another total."""
    try:
        data = json.loads(payload)
        passed, reported = data["passed"], data["total"]
    except (ValueError, TypeError, KeyError):
        return 0
    if type(passed) is not int or reported != total:
        return 0
    return min(max(passed, 0), total)
