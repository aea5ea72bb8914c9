"""WindowBudget: a sliding-window global sample budget with explicit clock values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocators import Budget, WindowBudget


def test_window_budget_spends_and_releases() -> None:
    w = WindowBudget(samples_per_window=10, window_s=60.0)
    assert w.remaining(0.0) == 10
    w.spend(4, now=0.0)
    w.spend(5, now=30.0)
    assert w.remaining(30.0) == 1
    assert w.next_release(30.0) == 60.0
    assert w.remaining(59.9) == 1
    assert w.remaining(60.0) == 5  # the spend at t=0 left the window (now - t >= window)
    assert w.remaining(90.0) == 10
    assert w.next_release(90.0) is None


def test_window_budget_clips_a_request_budget() -> None:
    w = WindowBudget(8, 10.0)
    w.spend(5, 1.0)
    assert w.clip(Budget(samples=10, tokens=500), 2.0) == Budget(samples=3, tokens=500)
    assert w.clip(Budget(), 2.0) == Budget(samples=3)
    assert w.clip(Budget(samples=1), 2.0) == Budget(samples=1)
    w.spend(9, 2.0)
    assert w.remaining(2.0) == 0


def test_window_budget_out_of_order_spends_expire_in_time_order() -> None:
    w = WindowBudget(100, 10.0)
    w.spend(3, 5.0)
    w.spend(4, 1.0)
    assert w.used(10.5) == 7
    assert w.used(11.0) == 3
    assert w.used(15.0) == 0


def test_window_budget_validation() -> None:
    with pytest.raises(ValueError):
        WindowBudget(-1, 1.0)
    with pytest.raises(ValueError):
        WindowBudget(1, 0.0)
    with pytest.raises(ValueError):
        WindowBudget(1, 1.0).spend(-1, 0.0)


@settings(database=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 5)), max_size=30), st.floats(0, 200))
def test_window_budget_matches_a_direct_sum(events: list[tuple[float, int]], probe: float) -> None:
    w = WindowBudget(50, 7.5)
    for t, n in sorted(events):
        w.spend(n, t)
    now = max([probe, *(t for t, _ in events)])
    assert w.used(now) == sum(n for t, n in events if now - t < 7.5)
