"""The monitor's arithmetic and arguments (:mod:`ttc_monitor`, pure Python): the window the engine's
processor cuts with is the one the service measures finished samples and replays recorded traces with."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from ttc_monitor.args import MonitorArgs, parse
from ttc_monitor.window import GroupConfidence, first_cut, token_confidence

values = st.lists(st.floats(0, 30, allow_nan=False), min_size=1, max_size=80)


def brute_groups(cs: list[float], w: int) -> list[float]:
    return [sum(cs[t - w + 1:t + 1]) / w for t in range(w - 1, len(cs))]


@given(values, st.integers(1, 20))
def test_lowest_group_confidence_is_the_least_window_mean(cs: list[float], w: int) -> None:
    group = GroupConfidence(w)
    seen = [group.add(c) for c in cs]
    full = brute_groups(cs, w)
    assert [g for g in seen if g is not None] == pytest.approx(full)
    expected = min(full) if full else sum(cs) / len(cs)  # shorter than the window: one group, all of it
    assert group.finish() == pytest.approx(expected)


@given(values, st.integers(1, 20), st.floats(0, 30))
def test_first_cut_is_the_first_window_under_the_threshold(cs: list[float], w: int, threshold: float) -> None:
    full = brute_groups(cs, w)
    assume(all(abs(g - threshold) > 1e-9 for g in full))  # a running sum and a fresh one may round apart
    under = [i for i, g in enumerate(full) if g < threshold]
    assert first_cut(cs, w, threshold) == (under[0] + w - 1 if under else None)


def test_a_position_added_again_replaces_its_value() -> None:
    group = GroupConfidence(2)
    assert group.add(5.0, pos=0) is None
    assert group.add(1.0, pos=0) is None  # the same step again: one token
    assert group.add(3.0, pos=1) == 2.0 and group.tokens == 2


def test_token_confidence() -> None:
    assert token_confidence([-0.5, -1.5]) == 1.0
    assert token_confidence([]) is None


def test_arguments_round_trip_and_defaults() -> None:
    args = MonitorArgs(12.5, 3, window=8, top_k=4)
    assert parse(args.as_xargs(), [3]) == args
    assert parse({"ttc_monitor_threshold": 2, "ttc_monitor_marker": 3}, [3]) == MonitorArgs(2.0, 3, 16, 5)
    assert parse({"other": 1}) is None and parse(None) is None


@pytest.mark.parametrize(("xargs", "message"), [
    ({"ttc_monitor_marker": 3}, "ttc_monitor_threshold is required"),
    ({"ttc_monitor_threshold": True, "ttc_monitor_marker": 3}, "ttc_monitor_threshold must be"),
    ({"ttc_monitor_threshold": -1, "ttc_monitor_marker": 3}, "ttc_monitor_threshold must be"),
    ({"ttc_monitor_threshold": math.nan, "ttc_monitor_marker": 3}, "ttc_monitor_threshold must be"),
    ({"ttc_monitor_threshold": 1, "ttc_monitor_marker": "3"}, "ttc_monitor_marker must be an integer"),
    ({"ttc_monitor_threshold": 1, "ttc_monitor_marker": 3, "ttc_monitor_window": 5000}, "ttc_monitor_window"),
    ({"ttc_monitor_threshold": 1, "ttc_monitor_marker": 3, "ttc_monitor_top_k": 1.5}, "ttc_monitor_top_k"),
    ({"ttc_monitor_threshold": 1, "ttc_monitor_marker": 4}, "stop_token_ids"),
])
def test_bad_arguments_name_themselves(xargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(xargs, [3])
