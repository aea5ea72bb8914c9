"""Exact cases of the ``margin`` allocator (weighted-vote lead stopping)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import pytest
from pydantic import ValidationError

from allocators import Budget, Margin, MarginParams, QueryState, Sample, simulate, weighted_lead


def scored(stream: Sequence[tuple[str | None, float | None]]) -> Callable[[QueryState, int], list[Sample]]:
    """A draw function handing out (answer, score) pairs in order."""
    it: Iterator[tuple[str | None, float | None]] = iter(stream)

    def draw(state: QueryState, k: int) -> list[Sample]:
        return [Sample(*next(it)) for _ in range(k)]

    return draw


def run(params: MarginParams, stream: Sequence[tuple[str | None, float | None]], cap: int = 100,
        budget: Budget | None = None) -> tuple[int, list[int]]:
    state = QueryState(id="q", cap=cap)
    trace = simulate(Margin(params, random.Random(0)), [state], budget or Budget(), scored(stream))
    return state.spent, [p["q"] for p in trace.plans]


def lead(samples: Sequence[tuple[str | None, float | None]]) -> float:
    return weighted_lead(QueryState(id="q", cap=99, samples=[Sample(a, s) for a, s in samples]))


def test_weighted_lead_sums_scores_per_answer() -> None:
    assert lead([("1", 0.9), ("2", 0.3), ("1", 0.2), ("2", 0.1)]) == pytest.approx(1.1 - 0.4)
    assert lead([("1", 0.4)]) == pytest.approx(0.4)  # no runner-up: counts as 0
    assert lead([(None, 0.99), ("3", 0.2)]) == pytest.approx(0.2)  # no answer: no vote
    assert lead([("1", None), ("1", None), ("2", None)]) == pytest.approx(1.0)  # unscored: 1 per vote
    assert lead([]) == 0.0


def test_one_confident_sample_settles_the_query() -> None:
    spent, plans = run(MarginParams(), [("7", 0.93)] * 20)
    assert (spent, plans) == (1, [1])


def test_unsure_samples_keep_sampling_in_steps_until_the_lead_is_reached() -> None:
    # weights 0.2 each on the same answer: lead 0.2, 0.6 after 1 + 2 samples -> stops at 3
    spent, plans = run(MarginParams(margin=0.5), [("7", 0.2)] * 20)
    assert (spent, plans) == (3, [1, 2])


def test_disagreement_runs_to_the_cap_and_the_cap_cuts_the_last_step() -> None:
    stream = [("1", 0.3), ("2", 0.3)] * 20
    spent, plans = run(MarginParams(margin=0.5, max_samples=6, step=4), stream)
    assert (spent, plans) == (6, [1, 4, 1])


def test_query_cap_and_shared_budget_bind() -> None:
    stream = [("1", 0.1)] * 50
    assert run(MarginParams(max_samples=12), stream, cap=4)[0] == 4
    assert run(MarginParams(max_samples=12), stream, budget=Budget(samples=5))[0] == 5


def test_without_scores_the_margin_counts_votes() -> None:
    stream: list[tuple[str | None, float | None]] = [("1", None), ("2", None), ("1", None), ("1", None),
                                                     ("1", None), ("1", None)]
    # leads after rounds of 1, 1, 1, ...: 1, 0, 1, 2 -> stops at 4 with margin 2
    assert run(MarginParams(margin=2, step=1), stream)[0] == 4


def test_params_validation() -> None:
    with pytest.raises(ValidationError):
        MarginParams(margin=0)
    with pytest.raises(ValidationError):
        MarginParams(first=5, max_samples=4)
    with pytest.raises(ValidationError):
        MarginParams(step=0)
