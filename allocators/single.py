"""Base of the single-request policies: each query is decided on its own samples alone.

A subclass states, per query, how many more samples it wants this round (:meth:`want`); the base caps
that at ``state.room`` and, when several queries share a budget, trims the round with
:func:`~allocators.budgeting.water_fill` in input order. Policies with :class:`StoppingParams`
(``adaptive_consistency``, ``esc``, ``margin``, ``deepconf``) also give up on a query none of whose
first ``give_up_after`` samples voted (``no_answer``: a prompt that is no question, samples cut short)
and on one whose first ``no_agreement_after`` samples all disagree (``no_agreement``: no two answers
alike; a hopeless query, or one that asks nothing the model can answer, would otherwise run to the
cap). These policies keep no per-run state, so they serve one query, many queries at once, or a
stream of queries alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, limit_for, water_fill


class StoppingParams(BudgetParams):
    """Params of the adaptive per-query policies: they also give up on a query whose samples carry no
    answer at all (nothing extractable, or every sample truncated), or whose answers never agree,
    which would otherwise run to the cap."""

    give_up_after: int = Field(
        3, ge=0, le=1024,
        description="Stop a query once this many samples were drawn and none voted (0: never give up).")
    no_agreement_after: int = Field(
        8, ge=0, le=1024,
        description="Stop a query once this many samples were drawn and no two of them agree (0: never).")


def gave_up(state: QueryState, params: StoppingParams) -> str | None:
    """Why the query is given up: ``no_answer`` (``give_up_after`` samples drawn and not one voted),
    ``no_agreement`` (``no_agreement_after`` drawn and no answer holds two votes); else ``None``."""
    n, spent = params.give_up_after, state.spent
    if n > 0 and spent >= n and all(s.answer is None for s in state.samples):
        return "no_answer"
    m = params.no_agreement_after
    if m > 0 and spent >= m and state.top_two()[0] <= 1:
        return "no_agreement"
    return None


class PerQueryAllocator(Allocator):
    """Round = every query's own :meth:`want`, capped by its room and the shared budget."""

    params: BudgetParams

    def want(self, state: QueryState) -> int:
        """More samples this query wants now (0: done)."""
        raise NotImplementedError

    def finished(self, state: QueryState) -> bool:
        """Done on its finished samples alone: gave up, or wants nothing more."""
        stopping = self.params if isinstance(self.params, StoppingParams) else None
        return (stopping is not None and gave_up(state, stopping) is not None) or min(self.want(state),
                                                                                       state.room) <= 0

    def stop_reason(self, state: QueryState) -> str:
        stopping = self.params if isinstance(self.params, StoppingParams) else None
        return (stopping is not None and gave_up(state, stopping)) or super().stop_reason(state)

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        ids: list[str] = []
        wants: list[int] = []
        stopping = self.params if isinstance(self.params, StoppingParams) else None
        for st in states:
            if stopping is not None and gave_up(st, stopping) is not None:
                continue
            w = min(self.want(st), st.room)
            if w > 0:
                ids.append(st.id)
                wants.append(w)
        if not ids:
            return {}
        return water_fill(ids, wants, limit_for(budget, states, self.params.tokens_per_sample))
