"""Answer-handling benchmark: does the text a backend returns decide whether the service stalls?

``clients`` closed-loop clients send chat requests (``policy``, default ``self-consistency-8``: one
8-sample call each) through the service to a fake backend whose samples are numbers, math, code or
prose (``ttc fake-backend --style``), for ``duration_s``; meanwhile a prober sends ``GET /health``
every ``probe_interval_s`` and records its latency. A service whose event loop blocks on answer
normalisation shows it in ``/health``'s p99 and in its request rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
from hdrh.histogram import HdrHistogram


@dataclass
class AnswerLoad:
    style: str
    served: int
    errors: int
    timeouts: int
    duration_s: float
    health: HdrHistogram

    def row(self) -> dict[str, Any]:
        def ms(q: float) -> float:
            return self.health.get_value_at_percentile(q) / 1000.0

        return {"style": self.style, "served": self.served, "req_per_s": self.served / self.duration_s,
                "errors": self.errors, "timeouts": self.timeouts, "health_probes": self.health.get_total_count(),
                "health_p50_ms": ms(50), "health_p99_ms": ms(99), "health_max_ms": self.health.get_max_value() / 1000}


async def run_answer_load(service_url: str, style: str, *, clients: int = 16, duration_s: float = 20.0,
                          policy: str = "self-consistency-8", probe_interval_s: float = 0.05,
                          client_timeout_s: float = 30.0, seed: int = 0) -> AnswerLoad:
    """Closed-loop load plus a ``/health`` prober against a running service (see the module doc)."""
    health = HdrHistogram(1, 600_000_000, 3)  # microseconds
    served = errors = timeouts = 0
    rng = random.Random(seed)
    stop_at = time.monotonic() + duration_s
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=service_url, timeout=client_timeout_s, limits=limits) as http:

        async def client() -> None:
            nonlocal served, errors, timeouts
            while time.monotonic() < stop_at:
                a, b = rng.randint(100, 999), rng.randint(10, 99)
                body = {"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "temperature": 1.0,
                        "ttc": {"policy": policy}}
                try:
                    resp = await http.post("/v1/chat/completions", json=body)
                    if resp.status_code == 200:
                        served += 1
                    else:
                        errors += 1
                except httpx.TimeoutException:
                    timeouts += 1
                except httpx.HTTPError:
                    errors += 1

        async def prober() -> None:
            while time.monotonic() < stop_at:
                start = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    await http.get("/health", timeout=client_timeout_s)
                health.record_value(max(1, int((time.perf_counter() - start) * 1e6)))
                await asyncio.sleep(probe_interval_s)

        started = time.monotonic()
        await asyncio.gather(prober(), *(client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    return AnswerLoad(style, served, errors, timeouts, elapsed, health)


# --- the sandbox: cost per program under load ------------------------------------------------------

HUMANEVAL_0_PROMPT = '''from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    """ Check if in given list of numbers, are any two numbers closer to each other than
    given threshold.
    """
'''
HUMANEVAL_0_SOLUTION = '''    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True

    return False
'''
HUMANEVAL_0_CHECK = '''
def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False
'''


@dataclass
class SandboxLoad:
    """``programs`` distinct programs of one ``program`` kind run ``concurrency`` at a time through the
    service's :class:`~app.sandbox.Sandbox`; ``walls``: each run's own wall time; ``busy``: the share of the
    machine's CPU time that was busy meanwhile (every process, this benchmark's and anyone else's: the
    sandboxed processes cannot be counted alone, bwrap does not reap them all); ``load``: the 1-minute load
    average before the row."""

    program: str
    concurrency: int
    programs: int
    elapsed_s: float
    busy: float
    walls: list[float]
    failures: int
    load: float

    def row(self) -> dict[str, Any]:
        walls = sorted(self.walls)
        return {"program": self.program, "concurrency": self.concurrency, "programs": self.programs,
                "programs_per_s": self.programs / self.elapsed_s,
                "ms_per_program": 1000 * self.elapsed_s / self.programs,
                "run_ms_p50": 1000 * walls[len(walls) // 2], "run_ms_max": 1000 * walls[-1],
                "cpu_busy_pct": 100 * self.busy, "failures": self.failures, "load_1m": self.load}


def sandbox_script(program: str, i: int) -> str:
    """The ``i``-th distinct program of a kind: ``empty`` (a comment), ``humaneval`` (HumanEval/0's canonical
    solution under its tests, through the code_tests harness), ``python`` (the same empty program, for the
    bare-interpreter baseline)."""
    from app.code.harness import CodeTests, build_test_script

    if program == "humaneval":
        tests = CodeTests(check=HUMANEVAL_0_CHECK, entry_point="has_close_elements")
        return build_test_script(f"{HUMANEVAL_0_PROMPT}{HUMANEVAL_0_SOLUTION}# {i}\n", tests)
    return f"# {i}\n"


async def _bare_python(script: str) -> tuple[bool, float]:
    """The baseline: the sandbox's interpreter with its flags, no bwrap, no rlimits."""
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("/usr/bin/python3", "-S", "-P", "-B", "-c", script,
                                                stdout=asyncio.subprocess.DEVNULL)
    return await proc.wait() == 0, time.perf_counter() - start


async def run_sandbox_load(program: str, concurrency: int, programs: int) -> SandboxLoad:
    """``programs`` runs of distinct ``program`` scripts, ``concurrency`` at a time (see :class:`SandboxLoad`)."""
    import os

    from app.sandbox import Sandbox, SandboxConfig

    sandbox = Sandbox(SandboxConfig(max_concurrent=concurrency))
    sandbox.check()
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[bool, float]:
        script = sandbox_script(program, i)
        if program == "python":
            async with gate:
                return await _bare_python(script)
        result = await sandbox.run(script)
        return result.status == "ok", result.wall_s

    load = os.getloadavg()[0]
    busy_before, total_before = _cpu_times()
    started = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(programs)))
    elapsed = time.perf_counter() - started
    busy_after, total_after = _cpu_times()
    busy = (busy_after - busy_before) / max(1, total_after - total_before)
    return SandboxLoad(program, concurrency, programs, elapsed, busy, [w for _, w in done],
                       sum(not ok for ok, _ in done), load)


def _cpu_times() -> tuple[int, int]:
    """Busy and total CPU time of the whole machine so far (``/proc/stat``, in clock ticks)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total
