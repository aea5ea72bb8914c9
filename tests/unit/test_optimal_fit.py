"""Fitting the compute-optimal table: per bin the most accurate candidate, or the cheapest close to it;
measured through the service itself (fake generator tree and PRM)."""

from __future__ import annotations

import httpx

from app.main import create_app
from tests.api.test_search import PRM, TREE, policy
from tests.conftest import HostRouter, fake_settings
from ttc_tools.fakes.tree import FakePRM, FakeTree
from ttc_tools.optimal import (
    Outcome,
    Problem,
    candidate_policies,
    comparison_policies,
    fit,
    measure,
    summarise,
    wilson,
)


def outcome(bin_: int, cand: str, correct: bool, tokens: int) -> Outcome:
    return Outcome("p", 1, cand, bin_, correct, tokens, 10, 4)


def test_each_bin_gets_the_best_or_the_cheapest_close_to_it() -> None:
    rows = [
        *(outcome(0, "majority:4", True, 40) for _ in range(10)),
        *(outcome(0, "beam:8", True, 300) for _ in range(10)),  # as good, dearer
        *(outcome(1, "majority:4", i < 3, 40) for i in range(10)),
        *(outcome(1, "beam:8", i < 8, 300) for i in range(10)),  # much better
    ]
    assert fit(rows, bins=2, tolerance=0.02) == [{"method": "majority", "width": 4}, {"method": "beam", "width": 8},
                                                 {"method": "majority", "width": 8}]  # bin 2: nobody, the fallback
    by = summarise(rows, lambda o: o.bin)
    assert by[1]["beam:8"]["accuracy"] == 0.8 and by[0]["majority:4"]["completion_tokens"] == 40


async def test_measure_runs_every_candidate_through_the_service() -> None:
    app = create_app(fake_settings(["gen"]), transport=HostRouter({"gen": FakeTree(TREE), "prm": FakePRM(PRM)}))
    base = {**policy("beam"), "aggregator": "weighted_majority"}
    problems = [Problem(f"p{i}", "What is 2 + 40?", "42", 1) for i in range(3)]
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        policies = candidate_policies(base, ["majority:8", "beam:8"], probe=4, bins=[0.99])
        got = await measure(client, "fake-model", problems, policies)
    assert len(got) == 6 and all(o.error is None for o in got)
    assert {o.bin for o in got} <= {0, 1}
    for p in problems:  # the same probe for both candidates: the same bin
        assert len({o.bin for o in got if o.problem == p.id}) == 1
    beam = [o for o in got if o.candidate == "beam:8"]
    assert all(o.correct for o in beam if o.bin == 1)


async def test_the_comparison_runs_whole_samples_search_and_the_fitted_policy_side_by_side() -> None:
    app = create_app(fake_settings(["gen"]), transport=HostRouter({"gen": FakeTree(TREE), "prm": FakePRM(PRM)}))
    base = {**policy("beam"), "aggregator": "weighted_majority"}
    fitted = candidate_policies(base, ["beam:8"], probe=4, bins=[0.99])["beam:8"]
    policies = comparison_policies(base, fitted, n=8, width=8)
    assert list(policies) == ["majority-8", "best-of-8 (PRM)", "weighted-8 (PRM)", "best-of-8 (likelihood)",
                              "beam-8", "dvts-8", "particles-8", "beam-8 (likelihood)", "dvts-8 (likelihood)",
                              "particles-8 (likelihood)", "compute-optimal"]
    problems = [Problem("p", "What is 2 + 40?", "42", 1)]
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        got = {o.candidate: o for o in await measure(client, "fake-model", problems, policies)}
    assert all(o.error is None for o in got.values()), got
    assert not got["majority-8"].correct  # the tree's majority goes the wrong way
    assert all(got[label].correct for label in ("beam-8", "dvts-8", "particles-8", "compute-optimal"))
    row = summarise(list(got.values()), lambda o: o.level)[1]["beam-8"]
    assert row["ci"] == wilson(1, 1) and row["ci"][0] < 1.0 == row["ci"][1]


def test_wilson_interval() -> None:
    lo, hi = wilson(8, 10)
    assert 0.49 < lo < 0.5 and 0.94 < hi < 0.95  # 0.8 of 10: [0.490, 0.943]
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_comparison_search_rows_are_the_builtin_search_policies() -> None:
    from app.policy import BUILTIN_POLICIES
    from ttc_tools.cli import DEMO_PRM_URL, demo_base

    rows = comparison_policies(demo_base(DEMO_PRM_URL), None, n=16, width=8)
    assert rows["beam-8 (likelihood)"] == BUILTIN_POLICIES["beam-likelihood"]
    for method in ("beam", "dvts", "particles"):  # what `ttc optimal compare` measures is what a name runs
        assert rows[f"{method}-8"] == BUILTIN_POLICIES[method]


def test_compare_only_refuses_a_row_it_does_not_have() -> None:
    """``--only`` names rows by their printed labels; an unknown one is a usage error (exit 2) that lists
    the rows, before any request (nothing listens at the URL: a request would fail differently)."""
    from typer.testing import CliRunner

    from tests.support.cli import ttc_app

    got = CliRunner().invoke(ttc_app(), ["optimal", "compare", "--url", "http://127.0.0.1:9", "--only",
                                         "majority-16,beam-9"])
    assert got.exit_code == 2, got.output
    assert "--only" in got.output and "'beam-9'" in got.output and "beam-8 (likelihood)" in got.output
