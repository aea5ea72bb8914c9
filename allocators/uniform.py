"""``uniform``: the shared budget split evenly over the batch."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, deliver_targets, limit_for, water_fill


class UniformParams(BudgetParams):
    """Even split of the batch budget (``n`` per query without one), ``per_round`` at a time."""

    n: int = Field(8, ge=1, le=1024, description="Samples per query when the run has no sample budget.")
    per_round: int | None = Field(
        None, ge=1, le=1024, description="Samples per query per round (default: the whole share at once)."
    )


class Uniform(Allocator):
    """Every query gets the same share of the budget.

    With ``B`` samples for ``m`` new queries each gets ``floor(B / m)`` and the ``B mod m`` left go one
    each to the first queries of a seeded shuffle (the injected RNG); a query whose room is below its
    share leaves the excess to the others (water-filling, :func:`~allocators.budgeting.water_fill`).
    Without a sample or token budget each query gets ``min(n, cap)``. Shares are fixed the first time a
    query is seen (queries arriving later share what earlier ones have not claimed); rounds deliver at
    most ``per_round`` per query.
    """

    name = "uniform"
    Params = UniformParams
    params: UniformParams

    def __init__(self, params: UniformParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._targets: dict[str, int] = {}
        self._order: list[str] = []

    def _assign(self, new: list[QueryState], states: Sequence[QueryState], budget: Budget) -> None:
        pool = limit_for(budget, states, self.params.tokens_per_sample)
        ids = [st.id for st in new]
        self.rng.shuffle(ids)
        self._order.extend(ids)
        by_id = {st.id: st for st in new}
        if pool is None:
            for st in new:
                self._targets[st.id] = max(st.spent, min(self.params.n, st.cap))
            return
        claimed = sum(
            max(0, min(self._targets[st.id] - st.spent, st.room)) for st in states if st.id in self._targets
        )
        shares = water_fill(ids, [by_id[i].room for i in ids], max(0, pool - claimed))
        for i in ids:
            self._targets[i] = by_id[i].spent + shares.get(i, 0)

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        new = [st for st in states if st.id not in self._targets]
        if new:
            self._assign(new, states, budget)
        return deliver_targets(states, self._targets, self._order, self.params.per_round, budget, self.params)

