"""The planning benchmark runs for every policy. Its timings are printed by `ttc bench replay`
(target: < 10 ms per round for 10,000 active queries); tests do not assert on time."""

from __future__ import annotations

import pytest

from allocators.bench import BENCH_CONFIGS, bench_plan


@pytest.mark.parametrize("label", sorted(BENCH_CONFIGS))
def test_bench_runs_every_policy(label: str) -> None:
    got = bench_plan(200, policies=[label], rounds=3)
    assert set(got) == {label, f"{label}:first"}
    assert all(v > 0 for v in got.values())  # milliseconds a round took: never nothing
