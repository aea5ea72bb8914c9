"""Budget arithmetic shared by the policies.

* :func:`sample_limit`: samples a round may plan under a sample and/or token budget
  (``floor(tokens_left / tokens_per_sample)`` with tokens per sample estimated from what was spent).
* :func:`water_fill`: trim wanted amounts to a limit, level by level in rank order, which defines the
  final partial round: every query gets its first unit before any gets its second, and at the level
  where the budget runs out the first-ranked queries get the last units.
* :func:`proportional_split`: split a total in proportion to weights under per-query caps.
* :func:`deliver_targets`: one round towards per-query sample targets fixed earlier.
* :func:`check_plan`: the contract check (used by tests and the offline simulator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import Field

from .base import AllocatorParams, Budget, Plan, QueryState
from .errors import PlanError


class BudgetParams(AllocatorParams):
    """Params every policy shares: the token estimate used before any sample reports its tokens."""

    tokens_per_sample: int = Field(
        512, ge=1, le=1_000_000,
        description="Tokens per sample assumed under a token budget until samples report their tokens.",
    )


def mean_tokens(states: Sequence[QueryState], default: float) -> float:
    """Mean completion tokens per sample over ``states`` (``default`` when none reported tokens)."""
    samples = tokens = 0
    for st in states:
        samples += len(st.samples)
        tokens += st.tokens_spent
    return tokens / samples if tokens > 0 else default


def sample_limit(budget: Budget, tokens_per_sample: float) -> int | None:
    """Most samples a plan may hold: ``min(samples, floor(tokens / tokens_per_sample))``.

    ``None`` when neither budget is set. Never negative.
    """
    limit = budget.samples
    if budget.tokens is not None:
        by_tokens = math.floor(max(0, budget.tokens) / max(tokens_per_sample, 1e-9))
        limit = by_tokens if limit is None else min(limit, by_tokens)
    return None if limit is None else max(0, limit)


def limit_for(budget: Budget, states: Sequence[QueryState], default_tokens: float) -> int | None:
    """:func:`sample_limit` with the tokens-per-sample estimate taken from ``states`` (lazily)."""
    if budget.tokens is None:
        return None if budget.samples is None else max(0, budget.samples)
    return sample_limit(budget, mean_tokens(states, default_tokens))


def water_fill(ids: Sequence[str], wants: Sequence[int], limit: int | None) -> Plan:
    """Give each id up to its want, at most ``limit`` in total, filling level by level in order.

    With ``L`` the largest level such that ``sum_i min(want_i, L) <= limit``, id ``i`` gets
    ``min(want_i, L)``, and the ``limit - sum_i min(want_i, L)`` units left go one each to the first
    ids (in the given order) that want more than ``L``. Zero entries are omitted.
    """
    if limit is None or sum(wants) <= limit:
        return {i: w for i, w in zip(ids, wants, strict=True) if w > 0}
    if limit <= 0:
        return {}
    w = np.asarray(wants, dtype=np.int64)
    lo, hi = 0, int(w.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(w, mid).sum()) <= limit:
            lo = mid
        else:
            hi = mid - 1
    alloc = np.minimum(w, lo)
    rest = limit - int(alloc.sum())
    if rest > 0:
        alloc[np.flatnonzero(w > lo)[:rest]] += 1
    return {ids[i]: a for i, a in enumerate(alloc.tolist()) if a > 0}


def proportional_split(weights: Sequence[float], caps: Sequence[int], total: int) -> list[int]:
    """Split ``total`` units in proportion to ``weights`` (largest remainders), never past ``caps``.

    Quotas ``q_i = T * w_i / sum(w)`` over the uncapped ids; an id whose quota reaches its cap gets the
    cap and leaves, and the quotas of the rest are recomputed from what is left. Then each id gets
    ``floor(q_i)`` and the units left go one each to the largest fractional parts (ties by order).
    Ids with weight or cap <= 0 get nothing; if the caps sum to at most ``total``, every eligible id
    gets its cap.
    """
    w = np.asarray(weights, dtype=np.float64)
    c = np.maximum(np.asarray(caps, dtype=np.int64), 0)
    free = (w > 0) & (c > 0)
    x = np.zeros(len(w), dtype=np.int64)
    if total <= 0 or not free.any():
        return x.tolist()
    if int(c[free].sum()) <= total:
        return np.where(free, c, 0).tolist()
    remaining = total
    while True:
        share = np.where(free, w, 0.0) / w[free].max()  # scaled so the largest free weight is 1
        quota = remaining * share / share.sum()
        over = free & (quota >= c)
        if not over.any():
            break
        x[over] = c[over]
        remaining -= int(c[over].sum())
        free &= ~over
    x[free] = np.floor(quota[free]).astype(np.int64)
    rest = remaining - int(x[free].sum())
    if rest > 0:
        idx = np.flatnonzero(free)
        order = idx[np.argsort(-(quota[idx] - x[idx]), kind="stable")][:rest]
        x[order] += 1
    return x.tolist()


def deliver_targets(
    states: Sequence[QueryState],
    targets: dict[str, int],
    order: Sequence[str],
    per_round: int | None,
    budget: Budget,
    params: BudgetParams,
) -> Plan:
    """One round towards absolute sample ``targets`` (samples a query should hold in all).

    Each query in ``order`` wants ``min(target - spent, room, per_round)``; the round is trimmed to
    the budget by :func:`water_fill` in ``order``. Queries without a target get nothing.
    """
    by_id = {st.id: st for st in states}
    ids: list[str] = []
    wants: list[int] = []
    for qid in order:
        st = by_id.get(qid)
        if st is None:
            continue
        w = min(targets.get(qid, 0) - st.spent, st.room)
        if per_round is not None:
            w = min(w, per_round)
        if w > 0:
            ids.append(qid)
            wants.append(w)
    if not ids:
        return {}
    return water_fill(ids, wants, limit_for(budget, states, params.tokens_per_sample))


def check_plan(plan: Plan, states: Sequence[QueryState], budget: Budget) -> None:
    """Raise :class:`PlanError` unless ``plan`` keeps the contract.

    Every id is a known query, every amount is an int in ``[1, state.room]``, and the total is at most
    ``budget.samples`` when that is set.
    """
    rooms = {st.id: st.room for st in states}
    total = 0
    for qid, k in plan.items():
        if qid not in rooms:
            raise PlanError(f"plan names unknown query {qid!r}")
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            raise PlanError(f"plan gives query {qid!r} a non-positive or non-int amount {k!r}")
        if k > rooms[qid]:
            raise PlanError(f"plan gives query {qid!r} {k} samples but its room is {rooms[qid]}")
        total += k
    if budget.samples is not None and total > budget.samples:
        raise PlanError(f"plan totals {total} samples but the budget has {budget.samples} left")
