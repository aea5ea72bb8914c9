"""Percentile math, bootstrap interval, Pareto front and level summaries of the load tester."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ttc_tools.loadtest.records import RequestRecord
from ttc_tools.loadtest.report import pareto_front
from ttc_tools.loadtest.stats import bootstrap_ci, percentiles_ms, summarize


def test_percentiles_match_exact_order_statistics_within_hdr_precision() -> None:
    rng = random.Random(1)
    values = [rng.lognormvariate(-3, 1) for _ in range(20_000)]  # seconds, ~50 ms median
    got = percentiles_ms(values)
    for q in (50, 90, 99):
        exact_ms = float(np.percentile(values, q, method="inverted_cdf")) * 1000
        assert got[f"p{q}"] == pytest.approx(exact_ms, rel=2e-3, abs=2e-3)
    assert got["max"] == pytest.approx(max(values) * 1000, rel=1e-3)


def test_percentiles_of_a_known_uniform_grid() -> None:
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1000 ms
    got = percentiles_ms(values)
    assert got["p50"] == pytest.approx(500, rel=1e-3)
    assert got["p90"] == pytest.approx(900, rel=1e-3)
    assert got["p99"] == pytest.approx(990, rel=1e-3)
    assert got["max"] == pytest.approx(1000, rel=1e-3)


def test_percentiles_empty_are_zero() -> None:
    assert percentiles_ms([]) == {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}


def test_bootstrap_interval_brackets_the_mean_with_binomial_width() -> None:
    outcomes = [i % 10 < 7 for i in range(400)]  # accuracy 0.7
    lo, hi = bootstrap_ci(outcomes, seed=3)
    assert lo < 0.7 < hi
    se = (0.7 * 0.3 / 400) ** 0.5
    assert hi - lo == pytest.approx(2 * 1.96 * se, rel=0.2)
    assert bootstrap_ci(outcomes, seed=3) == (lo, hi)  # seeded
    assert bootstrap_ci([]) == (0.0, 0.0)
    assert bootstrap_ci([True] * 5) == (1.0, 1.0)


def test_pareto_front_keeps_only_non_dominated_points() -> None:
    pts = [(100, 0.5), (200, 0.7), (150, 0.4), (300, 0.7), (400, 0.9), (50, 0.5)]
    assert pareto_front(pts) == [5, 1, 4]


def _rec(i: int, *, error: str | None = None, correct: bool | None = True, gold: str | None = "1",
         end: float = 1.0) -> RequestRecord:
    return RequestRecord(policy="p", mode="closed", load=2, index=i, problem_id=str(i), gold=gold,
                         start_s=0.0, end_s=end, latency_s=0.1 * (i + 1), ttfb_s=0.05, error=error,
                         samples=4, rounds=2, stop_reason="policy", completion_tokens=40, correct=correct)


def test_summarize_counts_errors_as_incorrect_and_computes_throughput() -> None:
    recs = [_rec(0), _rec(1, correct=False), _rec(2, error="http_504:deadline_exceeded", correct=False,
                                                  end=3.0),
            _rec(3, gold=None, correct=None)]
    s = summarize(recs, policy="p", mode="closed", load=2, elapsed_s=2.0, kill_at_s=2.5)
    assert (s.requests, s.ok, s.failed) == (4, 3, 1)
    assert s.throughput_rps == pytest.approx(1.5)
    assert s.offered_rps == pytest.approx(2.0)
    assert s.scored == 3 and s.accuracy == pytest.approx(1 / 3)
    assert s.errors == {"http_504:deadline_exceeded": 1}
    assert s.samples_per_query == 4 and s.tokens_per_query == 40 and s.rounds_per_query == 2
    assert s.stop_reasons == {"policy": 3}
    assert s.failed_after_kill == 1
    assert s.latency_max_ms == pytest.approx(400, rel=1e-3)  # the 504 is not in the histogram
