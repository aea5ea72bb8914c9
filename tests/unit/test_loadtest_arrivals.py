"""Open-loop arrival timing: the Poisson schedule (statistically) and the sends that follow it."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest

from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.arrivals import poisson_arrivals
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.runner import LevelSpec, run_level


def test_poisson_schedule_is_bounded_and_seeded() -> None:
    a = poisson_arrivals(50, duration_s=2, max_count=1000, rng=random.Random(7))
    assert a == poisson_arrivals(50, duration_s=2, max_count=1000, rng=random.Random(7))
    assert all(0 < t < 2 for t in a) and a == sorted(a)
    assert len(poisson_arrivals(1000, duration_s=100, max_count=30, rng=random.Random(1))) == 30
    assert poisson_arrivals(5, duration_s=0, max_count=10, rng=random.Random(1)) == []
    with pytest.raises(ValueError):
        poisson_arrivals(0, duration_s=1, max_count=1, rng=random.Random(1))


def test_poisson_schedule_statistics() -> None:
    rate, horizon = 200.0, 50.0
    a = np.array(poisson_arrivals(rate, duration_s=horizon, max_count=100_000, rng=random.Random(11)))
    n_expected = rate * horizon
    assert abs(len(a) - n_expected) < 4 * math.sqrt(n_expected)  # Poisson count, 4 sigma
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential: CV = 1
    # Kolmogorov-Smirnov distance to Exp(rate), 1% critical value 1.63/sqrt(n)
    x = np.sort(gaps)
    ecdf = np.arange(1, len(x) + 1) / len(x)
    d = np.max(np.abs(ecdf - (1 - np.exp(-rate * x))))
    assert d < 1.63 / math.sqrt(len(x))
    # counts in 1 s windows: Poisson, so variance ≈ mean (index of dispersion ≈ 1)
    counts = np.histogram(a, bins=int(horizon), range=(0, horizon))[0]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.4)


def test_open_loop_sends_follow_the_schedule_over_http() -> None:
    fake = FakeTTCService(latency_s=0.05)  # slower than the gaps: open loop must not wait for answers
    problems = [Problem("a", "What is 7?", "7")]
    with serve_in_thread(fake) as url:
        spec = LevelSpec(url=url, policy="single", mode="open", load=40, duration_s=1.5, timeout_s=10,
                         ttc={"policy": "single"}, seed=5)
        result = asyncio.run(run_level(spec, problems))
    schedule = poisson_arrivals(40, duration_s=1.5, max_count=10**6, rng=random.Random(5))
    assert len(result.records) == len(schedule)
    assert all(r.error is None for r in result.records)
    starts = sorted(r.start_s for r in result.records)
    lags = np.array(starts) - np.array(schedule)
    assert lags.min() > -1e-3  # never early
    assert np.median(lags) < 0.02  # and on time (loaded CI machines: generous)
    assert result.elapsed_s < 1.5 + 1.0
