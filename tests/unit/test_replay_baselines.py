"""Uniform and oracle reference curves on tiny hand-checkable replay data."""

from __future__ import annotations

import numpy as np
import pytest

from app.backends.replay import Problem, ReplaySource
from app.replay import baselines
from app.replay.summary import Bootstrap, Row, efficiency, uniform_needed


def problem(pid: str, answers: list[str | None], gold: str = "1") -> Problem:
    return Problem(id=pid, question=f"q{pid}", gold=gold, answers=tuple(answers),
                   correct=tuple(a == gold for a in answers))


def constant(pid: str, n: int, ok: bool) -> Problem:
    return problem(pid, ["1" if ok else "2"] * n)


def test_per_problem_budgets_spreads_the_fraction_evenly() -> None:
    assert baselines.per_problem_budgets(2, 4).tolist() == [2, 2, 2, 2]
    assert baselines.per_problem_budgets(2.5, 4).tolist() == [3, 2, 3, 2]
    assert baselines.per_problem_budgets(1.25, 4).tolist() == [2, 1, 1, 1]
    assert baselines.per_problem_budgets(0.5, 4).sum() == 2


def test_shuffle_matches_the_replay_backend_order() -> None:
    p = problem("a", ["1", "2", "3", "4", None, "1"])
    sh = baselines.shuffle([p], [7])
    order = ReplaySource([p], 7).order("a")
    assert sh.correct[0, 0].tolist() == [p.correct[i] for i in order]
    # Codes are numbered by first appearance in the drawn order; None -> -1.
    seen: dict[str, int] = {}
    expect = [-1 if p.answers[i] is None else seen.setdefault(p.answers[i] or "", len(seen)) for i in order]
    assert sh.codes[0, 0].tolist() == expect


def test_uniform_majority_and_coverage_exact() -> None:
    # Always-right, always-wrong, and a problem whose samples agree on a wrong answer.
    problems = [constant("a", 4, True), constant("b", 4, False), problem("c", ["1", "2", "2", "2"])]
    table = baselines.uniform_table(baselines.shuffle(problems, [0, 1, 2]))
    out = table.at(4)
    assert out.samples.mean() == 4
    assert out.correct.mean(axis=0).tolist() == [1.0, 0.0, 0.0]  # c: 2 beats 1 three to one
    assert out.covered.mean(axis=0).tolist() == [1.0, 0.0, 1.0]
    one = table.at(1)
    assert one.correct[:, 2].tolist() == one.covered[:, 2].tolist()  # one sample: selected = drawn


def test_uniform_tie_goes_to_the_answer_drawn_first_and_nulls_do_not_vote() -> None:
    p = problem("t", ["1", "2", None])
    sh = baselines.shuffle([p], list(range(30)))
    table = baselines.uniform_table(sh)
    drawn = [[p.answers[i] for i in ReplaySource([p], s).order("t")] for s in range(30)]
    first_answer = [next(a for a in d if a is not None) for d in drawn]
    # All three samples: 1-1 tie between "1" and "2" -> the one drawn first wins.
    assert table.at(3).correct[:, 0].tolist() == [a == "1" for a in first_answer]
    # Only nulls drawn -> nothing selected (wrong).
    first_is_null = [d[0] is None for d in drawn]
    assert any(first_is_null)
    assert not table.at(1).correct[first_is_null, 0].any()


def test_uniform_is_capped_by_the_samples_available() -> None:
    problems = [constant("a", 2, True), constant("b", 6, False)]
    out = baselines.uniform_table(baselines.shuffle(problems, [0])).at(4)
    assert out.samples[0].tolist() == [2.0, 4.0]


def test_oracle_spends_on_the_cheapest_problems_first() -> None:
    costs = np.array([[1.0, 3.0, 2.0, np.inf]])
    out = baselines.oracle(costs, 1.0)  # B = 4: problems 0 (1) and 2 (2) fit, 1 (3) does not
    assert out.correct[0].tolist() == [True, False, True, False]
    assert out.samples[0].tolist() == [1.0, 0.0, 2.0, 0.0]
    assert (out.correct == out.covered).all()
    full = baselines.oracle(costs, 10.0)
    assert full.correct[0].tolist() == [True, True, True, False]
    assert full.samples.mean() == pytest.approx(6 / 4)


def test_first_correct_positions_follow_the_shuffle() -> None:
    p = problem("x", ["2", "2", "1", "2"])
    sh = baselines.shuffle([p, constant("y", 4, False)], [3])
    order = ReplaySource([p], 3).order("x")
    costs = baselines.first_correct(sh)
    assert costs[0, 0] == order.index(2) + 1
    assert costs[0, 1] == np.inf


def test_pass_at_1_is_the_mean_share_of_correct_samples() -> None:
    problems = [problem("a", ["1", "2", "1", "2"]), constant("b", 2, True)]
    assert baselines.pass_at_1(baselines.shuffle(problems, [0, 1])) == pytest.approx(0.75)


def test_bootstrap_interval_brackets_the_mean_and_is_seeded() -> None:
    values = np.array([[1, 0, 1, 1, 0, 1, 0, 1]] * 3, dtype=float)
    lo, hi = Bootstrap(8, 500, seed=1).ci(values)
    assert lo <= values.mean() <= hi
    assert (lo, hi) == Bootstrap(8, 500, seed=1).ci(values)
    assert Bootstrap(8, 200).ci(np.ones((2, 8))) == (1.0, 1.0)


def test_uniform_needed_interpolates_and_reports_never() -> None:
    xs, ys = np.array([0.0, 1.0, 2.0, 4.0]), np.array([0.0, 0.5, 0.6, 0.7])
    assert uniform_needed(0.55, xs, ys) == pytest.approx(1.5)
    assert uniform_needed(0.65, xs, ys) == pytest.approx(3.0)
    assert uniform_needed(0.8, xs, ys) is None
    rows = [Row(1, 1.5, (1.5, 1.5), 0.65, (0.6, 0.7), 0.8, (0.7, 0.9)),
            Row(1, 1.0, (1.0, 1.0), 0.9, (0.8, 1.0), 0.9, (0.8, 1.0))]
    assert efficiency(rows, xs, ys) == [pytest.approx(2.0), None]
