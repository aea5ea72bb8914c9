"""The demo problem generator: gold answers are right, levels are graded, sets are reproducible."""

from __future__ import annotations

import random

from app.answers import extract_answer
from ttc_tools.demo.problems import LEVELS, Problem, generate, make_set, render_training_text, worked_paths
from ttc_tools.demo.problems import extract_answer as demo_extract


def check_path(worked: str, gold: int, n_ops: int) -> None:
    value = None
    for line in worked.splitlines()[:-1]:
        lhs, rhs = line.split(" = ")
        a, op, b = lhs.split(" ")
        assert int(rhs) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert int(rhs) >= 0
        value = int(rhs)
    assert value == gold
    assert worked.endswith(f"The answer is {gold}.")
    assert len(worked.splitlines()) == n_ops + 1


def test_gold_answers_follow_every_worked_path() -> None:
    rng = random.Random(0)
    two_paths = 0
    for level in LEVELS:
        for _ in range(50):
            p = generate(level, rng)
            paths = worked_paths(p)
            assert paths[0] == p.worked and len(set(paths)) == len(paths)
            for worked in paths:
                check_path(worked, p.gold, LEVELS[level][0])
            two_paths += len(paths) == 2
            if level == 1:
                assert len(paths) == 1
    assert two_paths > 50  # most multi-step problems have a second route


def test_grouped_path_adds_first_and_subtracts_once() -> None:
    p = Problem(question="What is 408 - 86 - 22?", gold=300, level=2, first=408, ops=(("-", 86), ("-", 22)))
    assert p.worked == "408 - 86 = 322\n322 - 22 = 300\nThe answer is 300."
    assert worked_paths(p)[1] == "86 + 22 = 108\n408 - 108 = 300\nThe answer is 300."
    q = Problem(question="What is 322 - 90 + 54?", gold=286, level=2, first=322, ops=(("-", 90), ("+", 54)))
    assert q.worked == "322 - 90 = 232\n232 + 54 = 286\nThe answer is 286."
    assert worked_paths(q)[1] == "322 + 54 = 376\n376 - 90 = 286\nThe answer is 286."


def test_service_and_demo_extractors_agree() -> None:
    for p in make_set(5, seed=3):
        assert demo_extract(p.worked) == p.gold
        assert extract_answer(p.worked) == str(p.gold)


def test_sets_are_reproducible_and_unique() -> None:
    a, b = make_set(10, levels=[1, 2], seed=7), make_set(10, levels=[1, 2], seed=7)
    assert a == b
    assert len({p.question for p in a}) == len(a)
    assert render_training_text(a[0]).startswith("<s>") and render_training_text(a[0]).endswith("</s>")
