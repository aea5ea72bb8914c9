"""``greedy``: a batch shares one budget; every round the samples go where one more is worth most.

Each active query gets an *index*, the expected gain in the chance its final answer is right per
sample drawn (:mod:`allocators.value`):

* no verifier: ``rho * G(a, b, min(room, lookahead))``, the KG(*) value of more votes on the
  leader-vs-runner-up decision (``a``/``b`` top-two votes, ``rho = (a + b + 1) / (n + 2)`` the
  smoothed rate at which a sample votes for one of them). A query whose leader is *settled*
  (``n >= min_samples`` and ``beta_confidence(a, b) >= consistency_threshold``, Adaptive-Consistency's
  Beta rule) is done;
* with a verifier (samples carry scores): solved (done) once a score reaches ``gamma``; before that
  the index is the hazard ``h(f, c)``, the chance the next sample is solved, learned online from the
  batch's own draws (empirical Bayes over states ``f`` failed samples, ``c`` the count of the most
  repeated failed answer): U-shaped pass@1 makes it fall with ``f`` and systematic wrong answers make
  it fall with ``c``, so the budget moves to queries that are cheap to solve. For a falling hazard
  the greedy order is the optimal index order (the Gittins index of a stopping problem with a
  non-increasing hazard is the hazard itself).

Every query is tried ``first`` times before any gets more (unexplored: index ``+inf``). A query is
also done at ``min(cap, max_samples)`` samples or when its index is at most ``min_value``.
Selection: without a sample or token budget every active query gets ``k`` samples. With one, the
active queries are ranked by index (ties keep input order) and the top
``max(unexplored, ceil(fraction * active))`` get ``k`` each; when the budget cannot cover them
:func:`~allocators.budgeting.water_fill` spreads it level by level in rank order (the final partial
round). Never more than the budget, never past a query's cap; deterministic (no randomness needed).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import Field

from .base import Allocator, Budget, Plan, QueryState
from .budgeting import BudgetParams, sample_limit, water_fill
from .exploration import rank, selection_size
from .stats import BetaRule, StatsCache, VoteStats
from .value import HazardModel, VoteValue


class GreedyParams(BudgetParams):
    """Budget-aware greedy by value of information (see the module doc for the formulas)."""

    k: int = Field(1, ge=1, le=256, description="Samples per selected query per round.")
    first: int = Field(1, ge=1, le=256, description="Samples every query gets before any gets more.")
    gamma: float = Field(0.8, ge=0.0, le=1.0, description="With a verifier: solved when a score >= gamma.")
    consistency_threshold: float = Field(
        0.95, gt=0.5, lt=1.0, description="Without a verifier: settled when the Beta rule reaches this.",
    )
    min_samples: int = Field(2, ge=1, le=1024, description="Samples before the Beta rule may settle a query.")
    max_samples: int = Field(64, ge=1, le=1024, description="Samples per query at most.")
    lookahead: int = Field(8, ge=1, le=64, description="KG(*) lookahead: most further votes valued together.")
    kappa: float = Field(4.0, gt=0.0, le=1000.0, description="Hazard shrinkage strength (pseudo-draws).")
    fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of the active queries sampled per round under a budget.",
    )
    min_value: float = Field(
        0.0, ge=0.0, lt=1.0, description="Done when the index (gain per sample) is at most this.",
    )


class Greedy(Allocator):
    """See the module doc. State: per-query vote counts, the hazard tallies, the KG(*) memo."""

    name = "greedy"
    Params = GreedyParams
    params: GreedyParams

    def __init__(self, params: GreedyParams, rng: random.Random) -> None:
        super().__init__(params, rng)
        self._cache = StatsCache()
        self._rule = BetaRule(params.consistency_threshold, max(params.max_samples, 2))
        self._value = VoteValue(params.lookahead)
        self._hazard = HazardModel(params.kappa)
        self._hz: list[list[float]] | None = None
        """The hazard table of the plan being made (built at its first scored query)."""

    def _fold(self, st: QueryState) -> VoteStats:
        """The query's counts brought up to date; every new scored draw is first recorded in the
        hazard tallies (at the count it was drawn at)."""
        by_id, samples = self._cache.by_id, st.samples
        s = by_id.get(st.id)
        if s is None or s.ref is not samples or s.n > len(samples):
            s = by_id[st.id] = VoteStats(samples)
        gamma, hazard, n = self.params.gamma, self._hazard, len(samples)
        while s.n < n:
            smp = samples[s.n]
            if smp.score is not None and not (s.n_scored and s.max_score >= gamma):
                hazard.observe(s.n, s.top, smp.score >= gamma)
            s.add(smp)
        return s

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        fold, index_of, first, max_n, k = self._fold, self._index, p.first, p.max_samples, p.k
        ids: list[str] = []
        wants: list[int] = []
        index: list[float] = []
        unexplored = 0
        self._hz = None
        for st in states:
            s = fold(st)
            n = s.n
            room = (st.cap if st.cap < max_n else max_n) - n
            if room <= 0:
                continue
            if n < first:
                ids.append(st.id)
                wants.append(first - n if first - n < room else room)
                index.append(math.inf)
                unexplored += 1
                continue
            v = index_of(s, room)
            if v is None or v <= p.min_value:
                continue
            ids.append(st.id)
            wants.append(k if room >= k else room)
            index.append(v)
        if not ids:
            return {}
        limit = budget.samples if budget.tokens is None else sample_limit(
            budget, self._cache.mean_tokens(p.tokens_per_sample)
        )
        if limit is None:
            return dict(zip(ids, wants, strict=True))
        if limit <= 0:
            return {}
        order = rank(index)[: selection_size(len(ids), unexplored, p.fraction)]
        return water_fill([ids[i] for i in order], [wants[i] for i in order], limit)

    def _index(self, s: VoteStats, room: int) -> float | None:
        """The value of one more sample for a query with ``room`` left (``None``: solved). With scores:
        the hazard model's chance that the next draw solves it; without: the vote value's expected gain
        over the lookahead, weighted by the leader-or-runner-up share ``(a + b + 1) / (n + 2)``."""
        p = self.params
        if s.n_scored:
            if s.max_score >= p.gamma:
                return None
            if self._hz is None:  # once per plan
                self._hz = self._hazard.table(max(len(self._hazard.t_f), 1))
            hz = self._hz
            row = hz[s.n] if s.n < len(hz) else hz[-1]
            return row[s.top] if s.top < len(row) else row[-1]
        a, b = s.top, s.second
        if s.n >= p.min_samples and self._rule.solved(a, b):
            return None
        h = room if room < p.lookahead else p.lookahead
        g = self._value.memo.get((a, b, h))
        if g is None:
            g = self._value(a, b, room)
        return g * (a + b + 1) / (s.n + 2)
