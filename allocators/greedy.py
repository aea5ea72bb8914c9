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
from .stats import XLOGX_STEPS, BetaRule, StatsCache, VoteStats, xlogx_step
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

    def _fold(self, st: QueryState) -> VoteStats:
        """Bring the query's counts up to date, recording every new scored draw in the hazard tallies."""
        cache = self._cache
        samples = st.samples
        s = cache.by_id.get(st.id)
        if s is None or s.ref is not samples or s.n > len(samples):
            s = cache.by_id[st.id] = VoteStats(samples)
        gamma, hazard = self.params.gamma, self._hazard
        n = len(samples)
        while s.n < n:
            smp = samples[s.n]
            if smp.score is not None and not (s.n_scored and s.max_score >= gamma):
                hazard.observe(s.n, s.top, smp.score >= gamma)
            s.update(samples if s.n + 1 == n else samples[: s.n + 1])
        return s

    def plan(self, states: Sequence[QueryState], budget: Budget) -> Plan:
        p = self.params
        by_id_get = self._cache.by_id.get
        fold = self._fold
        max_n, k, first, min_n, floor = p.max_samples, p.k, p.first, p.min_samples, p.min_value
        gamma = p.gamma
        table = self._rule.table(min(max_n, 64))
        n_table, min_top = len(table), self._rule.min_top
        memo, value = self._value.memo, self._value
        horizon = p.lookahead
        steps, n_steps = XLOGX_STEPS, len(XLOGX_STEPS)
        hz: list[list[float]] | None = None
        inf = math.inf
        ids: list[str] = []
        wants: list[int] = []
        index: list[float] = []
        unexplored = 0
        for st in states:
            samples = st.samples
            n = len(samples)
            s = by_id_get(st.id)
            if s is None or s.ref is not samples or s.n != n:
                if s is not None and s.ref is samples and s.n + 1 == n and samples[-1].score is None:
                    # one new unscored sample: VoteStats.update inlined (the common case of a k=1 round)
                    ans = samples[-1].answer
                    s.tokens += samples[-1].tokens
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
                else:
                    s = fold(st)
            cap = st.cap if st.cap < max_n else max_n
            room = cap - n
            if room <= 0:
                continue
            if n < first:
                ids.append(st.id)
                wants.append(min(first - n, room))
                index.append(inf)
                unexplored += 1
                continue
            if s.n_scored:
                if s.max_score >= gamma:
                    continue
                if hz is None:
                    hz = self._hazard.table(max(len(self._hazard.t_f), 1))
                row = hz[n] if n < len(hz) else hz[-1]
                v = row[s.top] if s.top < len(row) else row[-1]
            else:
                a, b = s.top, s.second
                if n >= min_n and a >= (table[b] if b < n_table else min_top(b)):
                    continue
                h = room if room < horizon else horizon
                g = memo.get((a, b, h))
                if g is None:
                    g = value(a, b, room)
                v = g * (a + b + 1) / (n + 2)
            if v <= floor:
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
