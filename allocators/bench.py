"""Timing of ``plan()`` for the built-in policies on a large batch (the service wires it into its CLI)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import Budget, QueryState, Sample
from .registry import create

#: Benchmarked configurations: label -> (registry name, params).
BENCH_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "fixed": ("fixed", {"n": 8, "per_round": 1}),
    "adaptive_consistency": ("adaptive_consistency", {"lookahead": False}),
    "esc": ("esc", {"window": 4}),
    "elimination/all": ("elimination", {"exploration": "all"}),
    "elimination/ucb": ("elimination", {"exploration": "ucb"}),
    "elimination/gap": ("elimination", {"exploration": "gap"}),
    "elimination/entropy": ("elimination", {"exploration": "entropy"}),
    "greedy": ("greedy", {}),
    "uniform": ("uniform", {"per_round": 1}),
    "two_stage": ("two_stage", {}),
    "difficulty": ("difficulty", {}),
}

_WRONG = ("w1", "w2", "w3", "w4")


def _draw(rng: random.Random, p_right: float, k: int) -> list[Sample]:
    out = []
    for _ in range(k):
        u = rng.random()
        answer = "ok" if u < p_right else None if u > 0.95 else rng.choice(_WRONG)
        out.append(Sample(answer=answer, tokens=rng.randint(50, 400)))
    return out


def bench_plan(
    n_queries: int = 10_000,
    *,
    policies: Sequence[str] | None = None,
    configs: Mapping[str, tuple[str, dict[str, Any]]] | None = None,
    rounds: int = 6,
    timer: Callable[[], float] = time.perf_counter,
    reduce: Callable[[list[float]], float] = statistics.median,
    budget_per_query: int = 32,
    seed: int = 0,
) -> dict[str, float]:
    """Milliseconds of wall-clock time one ``plan()`` call takes, per configuration.

    Scenario: ``n_queries`` queries (cap 64) sharing ``budget_per_query * n_queries`` samples; each
    query has a seeded single-sample success ``p`` in [0.2, 0.9], wrong answers fall on four
    distractors and 5% of samples are unparseable. Up to ``rounds`` rounds run; between rounds the
    planned samples are drawn (not timed). Result: ``label`` -> ``reduce`` (median) of the rounds after
    the first (the steady state: caches warm, every active query holding new samples), and
    ``label:first`` -> the first round (caches built from scratch). A configuration that ends after one
    round reports that round under both keys. ``timer`` defaults to wall-clock ``time.perf_counter``;
    ``time.process_time`` measures CPU time only (useful on a shared machine).
    """
    table = dict(configs if configs is not None else BENCH_CONFIGS)
    labels = list(policies) if policies is not None else list(table)
    out: dict[str, float] = {}
    for label in labels:
        name, params = table[label]
        rng = random.Random(seed)
        allocator = create(name, params, random.Random(seed))
        states = [QueryState(id=f"q{i}", cap=64, features={"chars": float(100 + i % 400)}) for i in range(n_queries)]
        p_right = [0.2 + 0.7 * rng.random() for _ in states]
        by_id = {st.id: (st, p) for st, p in zip(states, p_right, strict=True)}
        budget_left = budget_per_query * n_queries
        timings: list[float] = []
        for _ in range(rounds):
            start = timer()
            plan = allocator.plan(states, Budget(samples=budget_left))
            timings.append((timer() - start) * 1e3)
            if not plan:
                break
            for qid, k in plan.items():
                st, p = by_id[qid]
                st.samples.extend(_draw(rng, p, k))
                budget_left -= k
        out[f"{label}:first"] = timings[0]
        out[label] = reduce(timings[1:]) if len(timings) > 1 else timings[0]
    return out
