"""Failure scenarios run alongside a load test.

Backend kill: ``after_s`` seconds after the load test starts, either send ``signal`` (SIGKILL by
default: a crash, not a clean shutdown) to process ``pid``, or run the shell ``command`` (bounded
to 30 s). It fires once. Each level's summary then counts the failed requests that ended at or
after the kill (``failed_after_kill``); with two backends behind the service and working failover
that number should stay near zero.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class KillPlan:
    after_s: float
    pid: int | None = None
    command: str | None = None
    signal: int = signal.SIGKILL

    def __post_init__(self) -> None:
        if (self.pid is None) == (self.command is None):
            raise ValueError("a backend kill needs exactly one of --kill-pid or --kill-cmd")
        if self.after_s < 0:
            raise ValueError("--kill-backend-after must be >= 0")

    def describe(self) -> str:
        what = f"signal {self.signal} to pid {self.pid}" if self.pid is not None else repr(self.command)
        return f"kill after {self.after_s:g}s: {what}"


class KillSwitch:
    """Fires a :class:`KillPlan` once; ``fired_at`` is its ``time.monotonic()`` (``None`` until then)."""

    def __init__(self, plan: KillPlan) -> None:
        self.plan = plan
        self.fired_at: float | None = None
        self.outcome = "not fired"

    def fire(self) -> None:
        self.fired_at = time.monotonic()
        try:
            if self.plan.pid is not None:
                os.kill(self.plan.pid, self.plan.signal)
                self.outcome = f"sent signal {self.plan.signal} to pid {self.plan.pid}"
            else:
                assert self.plan.command is not None
                done = subprocess.run(self.plan.command, shell=True, timeout=30, check=False,
                                      capture_output=True)
                self.outcome = f"ran {self.plan.command!r}: exit {done.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.outcome = f"kill failed: {exc}"

    async def run(self, start: float) -> None:
        """Sleep until ``start + after_s`` (monotonic) and fire; cancel it to disarm."""
        await asyncio.sleep(max(0.0, start + self.plan.after_s - time.monotonic()))
        await asyncio.to_thread(self.fire)
