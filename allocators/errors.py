"""Domain errors of the allocator library (the service maps them to HTTP errors in one place)."""

from __future__ import annotations

from collections.abc import Iterable


class AllocatorError(Exception):
    """Base of every error raised by the allocator library."""


class UnknownAllocatorError(AllocatorError, LookupError):
    """No built-in or entry-point allocator is registered under ``name``."""

    def __init__(self, name: str, available: Iterable[str] = ()) -> None:
        self.name = name
        self.available = tuple(sorted(available))
        known = ", ".join(self.available) or "none"
        super().__init__(f"unknown allocator {name!r}; available: {known}")


class PlanError(AllocatorError, ValueError):
    """A plan that breaks the allocator contract (unknown id, k <= 0, past a cap or the budget)."""
