"""The demo problem generator: gold answers are right, levels are graded, sets are reproducible."""

from __future__ import annotations

import random

from app.answers import extract_answer
from app.demo.problems import LEVELS, generate, make_set, render_training_text
from app.demo.problems import extract_answer as demo_extract


def test_gold_answers_follow_the_worked_steps() -> None:
    rng = random.Random(0)
    for level in LEVELS:
        for _ in range(50):
            p = generate(level, rng)
            value = None
            for line in p.worked.splitlines()[:-1]:
                lhs, rhs = line.split(" = ")
                a, op, b = lhs.split(" ")
                assert int(rhs) == (int(a) + int(b) if op == "+" else int(a) - int(b))
                assert int(rhs) >= 0
                value = int(rhs)
            assert value == p.gold
            assert p.worked.endswith(f"The answer is {p.gold}.")
            assert len(p.worked.splitlines()) == LEVELS[level][0] + 1


def test_service_and_demo_extractors_agree() -> None:
    for p in make_set(5, seed=3):
        assert demo_extract(p.worked) == p.gold
        assert extract_answer(p.worked) == str(p.gold)


def test_sets_are_reproducible_and_unique() -> None:
    a, b = make_set(10, levels=[1, 2], seed=7), make_set(10, levels=[1, 2], seed=7)
    assert a == b
    assert len({p.question for p in a}) == len(a)
    assert render_training_text(a[0]).startswith("<s>") and render_training_text(a[0]).endswith("</s>")
