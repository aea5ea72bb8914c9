"""Base of the single-request policies: each query is decided on its own samples alone.

A subclass states, per query, how many more samples it wants this round (:meth:`want`); the base caps
that at ``state.room`` and, when several queries share a budget, trims the round with
:func:`~allocators.budgeting.water_fill` in input order. These policies keep no per-run state, so
they serve one query, many queries at once, or a stream of queries alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, limit_for, water_fill


class PerQueryAllocator(Allocator):
    """Round = every query's own :meth:`want`, capped by its room and the shared budget."""

    params: BudgetParams

    def want(self, state: QueryState) -> int:
        """More samples this query wants now (0: done)."""
        raise NotImplementedError

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        ids: list[str] = []
        wants: list[int] = []
        for st in states:
            w = min(self.want(st), st.room)
            if w > 0:
                ids.append(st.id)
                wants.append(w)
        if not ids:
            return {}
        return water_fill(ids, wants, limit_for(budget, states, self.params.tokens_per_sample))
