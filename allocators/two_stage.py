"""``two_stage``: explore uniformly, then commit the rest of the budget by estimated difficulty."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import Field

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, deliver_targets, limit_for, proportional_split, water_fill


class TwoStageParams(BudgetParams):
    """Stage 1 spends ``explore_fraction`` of the budget evenly; stage 2 commits the rest by difficulty."""

    explore_fraction: float = Field(0.25, gt=0.0, lt=1.0, description="Share of the budget explored evenly.")
    n: int = Field(8, ge=1, le=1024, description="Average samples per query when the run has no budget.")
    hopeless_share: float = Field(
        0.25, ge=0.0, lt=1.0, description="Stage 2 skips queries whose leader holds at most this share."
    )


class TwoStage(Allocator):
    """Explore, then commit.

    Stage 1: ``B1 = max(ceil(f * B), min(m, B))`` samples split evenly over the ``m`` queries (so each
    gets one when ``B >= m``), ``B`` being the budget at the first call (``n * m`` without one).
    Stage 2: with ``a`` the leader's votes among a query's ``s`` samples, it is *easy* when unanimous
    (``s >= 2`` and ``a = s``), *hopeless* when ``s >= 2`` and ``a <= hopeless_share * s``; both get
    nothing. The others split the rest of the budget in proportion to the smoothed disagreement
    ``d = 1 - (a + 1) / (s + 2)`` (:func:`~allocators.budgeting.proportional_split`, capped by room).
    Plans cover the queries of the first call; remainders follow a seeded shuffle.
    """

    name = "two_stage"
    Params = TwoStageParams
    params: TwoStageParams

    def __init__(self, params: TwoStageParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._stage = 0
        self._total = 0
        self._drawn0 = 0
        self._targets: dict[str, int] = {}
        self._order: list[str] = []

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        if self._stage == 0:
            self._stage = 1
            self._explore(states, budget)
        out = deliver_targets(states, self._targets, self._order, None, budget, p)
        if out or self._stage == 2:
            return out
        self._stage = 2
        self._commit(states, budget)
        return deliver_targets(states, self._targets, self._order, None, budget, p)

    def _explore(self, states: Sequence[QueryState], budget: Budget) -> None:
        pool = limit_for(budget, states, self.params.tokens_per_sample)
        self._total = self.params.n * len(states) if pool is None else pool
        self._drawn0 = sum(st.spent for st in states)
        self._order = [st.id for st in states]
        self.rng.shuffle(self._order)
        by_id = {st.id: st for st in states}
        explore = min(self._total, max(math.ceil(self.params.explore_fraction * self._total),
                                       min(len(states), self._total)))
        shares = water_fill(self._order, [by_id[i].room for i in self._order], explore)
        self._targets = {st.id: st.spent + shares.get(st.id, 0) for st in states}

    def _commit(self, states: Sequence[QueryState], budget: Budget) -> None:
        pool = limit_for(budget, states, self.params.tokens_per_sample)
        if pool is None:
            pool = max(0, self._total - (sum(st.spent for st in states) - self._drawn0))
        by_id = {st.id: st for st in states}
        chosen = [by_id[i] for i in self._order if i in by_id and i in self._targets]
        weights = [self.disagreement(st) for st in chosen]
        extra = proportional_split(weights, [st.room for st in chosen], pool)
        for st, x in zip(chosen, extra, strict=True):
            self._targets[st.id] = st.spent + x

    def disagreement(self, state: QueryState) -> float:
        """Stage-2 weight: 0 for easy or hopeless queries, else ``1 - (a + 1) / (s + 2)``."""
        s = state.spent
        a, _ = state.top_two()
        if s >= 2 and (a == s or a <= self.params.hopeless_share * s):
            return 0.0
        return 1.0 - (a + 1) / (s + 2)
