"""``elimination``: a batch shares one budget; every round the active queries get ``k`` more samples
and a query leaves the active set once it is judged solved (bandit-style elimination)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, sample_limit, water_fill
from .exploration import (
    ExplorationRule,
    all_scores,
    entropy_scores,
    gap_scores,
    rank,
    selection_size,
    ucb_scores,
)
from .stats import BetaRule, StatsCache, VoteStats


class EliminationParams(BudgetParams):
    """Elimination with a pluggable exploration rule (see :mod:`allocators.exploration`)."""

    k: int = Field(1, ge=1, le=256, description="Samples per selected query per round.")
    gamma: float = Field(0.8, ge=0.0, le=1.0, description="Solved when a sample's verifier score >= gamma.")
    consistency_threshold: float = Field(
        0.95, gt=0.5, lt=1.0, description="Without scores: solved when the Beta rule reaches this."
    )
    min_samples: int = Field(2, ge=1, le=1024, description="Samples before the Beta rule may fire.")
    max_samples: int = Field(32, ge=1, le=1024, description="Samples per query at most.")
    exploration: ExplorationRule = Field("all", description="Which active queries are sampled each round.")
    fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of active queries a non-'all' rule samples per round."
    )
    ucb_c: float = Field(1.0, ge=0.0, le=10.0, description="ucb: exploration weight c.")
    hopeless_after: int = Field(8, ge=1, le=1024, description="entropy: samples before a query may be hopeless.")
    hopeless_share: float = Field(
        0.25, ge=0.0, lt=1.0, description="entropy: hopeless when the leader holds at most this share."
    )


class Elimination(Allocator):
    """Every round, the selected active queries get ``min(k, room)`` samples each.

    Solved (leaves the active set): some sample has verifier score ``>= gamma`` (scores present, i.e.
    a verifier is configured) or, with no scores, ``spent >= min_samples`` and the Beta rule
    ``I_{1/2}(b + 1, a + 1) >= consistency_threshold`` holds. A query also leaves at
    ``min(cap, max_samples)`` samples. Selected: all active queries (``all``) or the top of the
    exploration ranking. Final partial round: when the budget cannot cover every selected query,
    :func:`~allocators.budgeting.water_fill` spreads it level by level in rank order (the
    first-ranked get the last units). Per-query counts are cached and updated from new samples only.
    """

    name = "elimination"
    Params = EliminationParams
    params: EliminationParams

    def __init__(self, params: EliminationParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._cache = StatsCache()
        self._rule = BetaRule(params.consistency_threshold, params.max_samples)

    def _solved(self, s: VoteStats) -> bool:
        """The solved rule, memoised per sample count: a verifier score >= gamma, else the Beta rule
        once ``min_samples`` were drawn."""
        if s.mark_n != s.n:
            p = self.params
            s.mark = s.max_score >= p.gamma if s.n_scored else (
                s.n >= p.min_samples and self._rule.solved(s.top, s.second))
            s.mark_n = s.n
        return s.mark

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        get, solved, k, max_n = self._cache.get, self._solved, p.k, p.max_samples
        # With 'all' and a budget that covers k samples for every state, the round is known to be
        # full: the loop writes the plan directly instead of collecting the active set first.
        full = p.exploration == "all" and budget.tokens is None and (
            budget.samples is None or budget.samples >= k * len(states)
        )
        plan: Plan = {}
        ids: list[str] = []
        wants: list[int] = []
        active: list[VoteStats] = []
        unexplored = 0
        for st in states:
            s = get(st)
            room = (st.cap if st.cap < max_n else max_n) - s.n
            if room <= 0 or (s.mark if s.mark_n == s.n else solved(s)):
                continue
            want = k if room >= k else room
            if full:
                plan[st.id] = want
                continue
            ids.append(st.id)
            wants.append(want)
            active.append(s)
            unexplored += s.n == 0
        if full or not ids:
            return plan
        return self._select(ids, wants, active, unexplored, budget)

    def _select(self, ids: list[str], wants: list[int], active: list[VoteStats], unexplored: int,
                budget: Budget) -> Plan:
        """The round when it may not be full: everyone within the budget, else the exploration
        ranking's share water-filled in rank order."""
        p = self.params
        limit = budget.samples if budget.tokens is None else sample_limit(
            budget, self._cache.mean_tokens(p.tokens_per_sample)
        )
        if limit is not None and limit <= 0:
            return {}
        if p.exploration == "all":
            if limit is None or sum(wants) <= limit:
                return dict(zip(ids, wants, strict=True))
            order = rank(all_scores(active))
        else:
            order = rank(self._scores(active))[: selection_size(len(ids), unexplored, p.fraction)]
        return water_fill(list(map(ids.__getitem__, order)), list(map(wants.__getitem__, order)), limit)

    def _scores(self, active: list[VoteStats]) -> list[float]:
        p = self.params
        if p.exploration == "ucb":
            return ucb_scores(active, self._cache.total_samples(), p.ucb_c)
        if p.exploration == "gap":
            return gap_scores(active, p.gamma, self._rule, p.min_samples)
        return entropy_scores(active, p.hopeless_after, p.hopeless_share)
