"""A global sample budget per sliding time window, for the streaming setting.

Pure: the caller passes the time (``now``, seconds on any monotonic clock) to every call; nothing
here reads a clock. One instance per process (or per policy); cross-replica budgets go through the
service's shared store instead.
"""

from __future__ import annotations

from collections import deque

from .base import Budget


class WindowBudget:
    """At most ``samples_per_window`` samples spent in any window ``(now - window_s, now]``.

    ``remaining(now) = samples_per_window - sum(spends at t with now - t < window_s)``.
    """

    def __init__(self, samples_per_window: int, window_s: float) -> None:
        if samples_per_window < 0:
            raise ValueError("samples_per_window must be >= 0")
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        self.samples_per_window = samples_per_window
        self.window_s = float(window_s)
        self._events: deque[tuple[float, int]] = deque()
        self._used = 0

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        events = self._events
        while events and events[0][0] <= horizon:
            self._used -= events.popleft()[1]

    def used(self, now: float) -> int:
        """Samples spent inside the window ending at ``now``."""
        self._expire(now)
        return self._used

    def remaining(self, now: float) -> int:
        """Samples that may still be spent at ``now`` (never negative)."""
        return max(0, self.samples_per_window - self.used(now))

    def spend(self, samples: int, now: float) -> None:
        """Record ``samples`` spent at ``now`` (times may arrive out of order; each expires on its own)."""
        if samples < 0:
            raise ValueError("samples must be >= 0")
        if samples:
            events = self._events
            if events and now < events[-1][0]:
                # keep the deque sorted by time so expiry stays a pop from the left
                items = sorted([*events, (now, samples)], key=lambda e: e[0])
                events.clear()
                events.extend(items)
            else:
                events.append((now, samples))
            self._used += samples
        self._expire(now)

    def clip(self, budget: Budget, now: float) -> Budget:
        """``budget`` with its sample budget lowered to what the window still allows."""
        left = self.remaining(now)
        samples = left if budget.samples is None else min(budget.samples, left)
        return Budget(samples=samples, tokens=budget.tokens)

    def next_release(self, now: float) -> float | None:
        """When the oldest spend in the window expires (``None`` when nothing is in the window)."""
        self._expire(now)
        return self._events[0][0] + self.window_s if self._events else None
