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
from .stats import XLOGX_STEPS, BetaRule, StatsCache, VoteStats, xlogx_step


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

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        cache = self._cache
        by_id_get, refresh, max_n = cache.by_id.get, cache.get, p.max_samples
        gamma, min_n, rule = p.gamma, p.min_samples, self._rule
        min_top = rule.min_top
        table = rule.table(min(max_n, 64))  # the common prefix; larger counts extend it lazily
        n_table = len(table)
        steps, n_steps = XLOGX_STEPS, len(XLOGX_STEPS)
        k = p.k
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
            samples = st.samples
            n = len(samples)
            s = by_id_get(st.id)
            if s is None or s.ref is not samples or s.n > n:
                s = refresh(st)
            elif s.n + 1 == n and samples[-1].score is None:
                # one new unscored sample: VoteStats.update inlined (the common case of a k=1 round)
                smp = samples[-1]
                s.tokens += smp.tokens
                ans = smp.answer
                if ans is None:
                    s.nulls += 1
                else:
                    counts = s.counts
                    c = counts[ans] = counts.get(ans, 0) + 1
                    s.slogc += steps[c] if c < n_steps else xlogx_step(c)
                    if ans == s.top_answer:
                        s.top = c
                    elif c > s.top:
                        s.second, s.top, s.top_answer = s.top, c, ans
                    elif c > s.second:
                        s.second = c
                s.n = n
            elif s.n != n:
                s.update(samples)
            if s.mark_n != n:
                # the solved rule, inlined: a verifier score >= gamma, else the Beta rule
                if s.n_scored:
                    s.mark = s.max_score >= gamma
                else:
                    b = s.second
                    s.mark = n >= min_n and s.top >= (table[b] if b < n_table else min_top(b))
                s.mark_n = n
            if s.mark:
                continue
            cap = st.cap if st.cap < max_n else max_n
            if n < cap:
                if full:
                    plan[st.id] = k if cap - n >= k else cap - n
                    continue
                ids.append(st.id)
                wants.append(k if cap - n >= k else cap - n)
                active.append(s)
                if n == 0:
                    unexplored += 1
        if full or not ids:
            return plan
        limit = budget.samples if budget.tokens is None else sample_limit(
            budget, cache.mean_tokens(p.tokens_per_sample)
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
