"""Fitting the compute-optimal table: per bin the most accurate candidate, or the cheapest close to it;
measured through the service itself (fake generator tree and PRM)."""

from __future__ import annotations

import httpx

from app.main import create_app
from tests.api.test_search import PRM, TREE, policy
from tests.conftest import HostRouter, fake_settings
from ttc_tools.fakes.tree import FakePRM, FakeTree
from ttc_tools.optimal import Outcome, Problem, fit, measure, summarise


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
            transport=httpx.ASGITransport(app=app), base_url="http://ttc") as client:
        got = await measure(client, "fake-model", problems, base, ["majority:8", "beam:8"], probe=4, bins=[0.99])
    assert len(got) == 6 and all(o.error is None for o in got)
    assert {o.bin for o in got} <= {0, 1}
    for p in problems:  # the same probe for both candidates: the same bin
        assert len({o.bin for o in got if o.problem == p.id}) == 1
    beam = [o for o in got if o.candidate == "beam:8"]
    assert all(o.correct for o in beam if o.bin == 1)
