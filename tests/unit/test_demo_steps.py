"""Step checker / labeller / corrupter of the demo task: taught paths are right, every kind of slip is
caught at its line, first-error labels, corruptions are deterministic and always wrong somewhere."""

from __future__ import annotations

import random

import pytest

from ttc_tools.demo.problems import LEVELS, Problem, generate, make_set, worked_paths
from ttc_tools.demo.steps import (
    CORRUPTIONS,
    STEP_TAG,
    VERDICTS,
    char_labels,
    check_steps,
    corrupt,
    first_error,
    label_steps,
    lowest_step,
    prm_messages,
    prm_text,
    split_steps,
)


def problem(first: int, *ops: tuple[str, int]) -> Problem:
    gold = first + sum(x if op == "+" else -x for op, x in ops)
    expr = str(first) + "".join(f" {op} {x}" for op, x in ops)
    return Problem(question=f"What is {expr}?", gold=gold, level=len(ops), first=first, ops=tuple(ops))


P = problem(37, ("+", 85), ("-", 19))  # 37 + 85 - 19 = 103


def test_split_steps_strips_and_drops_blank_lines() -> None:
    assert split_steps(" 37 + 85 = 122\n\n122 - 19 = 103 \nThe answer is 103.\n") == [
        "37 + 85 = 122", "122 - 19 = 103", "The answer is 103."]
    assert split_steps("") == []


def test_every_taught_path_is_right_at_every_level() -> None:
    rng = random.Random(3)
    for level in LEVELS:
        for _ in range(200):
            p = generate(level, rng)
            for worked in worked_paths(p):
                assert check_steps(p, split_steps(worked)) == ["ok"] * (LEVELS[level][0] + 1)


def test_any_sound_order_is_right() -> None:
    p = problem(500, ("-", 40), ("+", 30), ("-", 20))
    assert all(label_steps(p, ["500 + 30 = 530", "530 - 20 = 510", "510 - 40 = 470", "The answer is 470."]))
    assert all(label_steps(p, ["40 + 20 = 60", "500 - 60 = 440", "440 + 30 = 470", "The answer is 470."]))


def test_wrong_arithmetic_is_the_first_error_and_later_steps_follow_it() -> None:
    # the slip propagates consistently: later lines are right on their own but labelled wrong
    assert check_steps(P, ["37 + 85 = 112", "112 - 19 = 93", "The answer is 93."]) == [
        "arithmetic", "after_error", "after_error"]
    assert label_steps(P, ["37 + 85 = 122", "122 - 19 = 104", "The answer is 104."]) == [True, False, False]


@pytest.mark.parametrize(
    "steps",
    [
        ["37 + 58 = 95", "95 - 19 = 76", "The answer is 76."],  # a number copied wrongly
        ["37 - 85 = -48", "The answer is -48."],  # wrong operation
        ["37 + 85 = 122", "37 - 19 = 18", "The answer is 18."],  # does not continue from 122
        ["37 + 85 = 122", "37 + 85 = 122", "The answer is 122."],  # a line repeated
        ["37 + 19 = 56", "The answer is 56."],  # + for a subtracted number
    ],
)
def test_operand_errors(steps: list[str]) -> None:
    verdicts = check_steps(P, steps)
    assert "operands" in verdicts
    assert verdicts.index("operands") == first_error(label_steps(P, steps))


def test_answer_line() -> None:
    assert check_steps(P, ["37 + 85 = 122", "The answer is 122."]) == ["ok", "answer"]  # an operation left out
    assert check_steps(P, ["37 + 85 = 122", "122 - 19 = 103", "The answer is 113."]) == ["ok", "ok", "answer"]
    assert check_steps(P, ["37 + 85 = 122", "122 - 19 = 103", "The answer is 103.", "103 + 1 = 104"]) == [
        "ok", "ok", "ok", "after_answer"]
    # no answer line: the steps so far are still judged
    assert label_steps(P, ["37 + 85 = 122", "122 - 19 = 103"]) == [True, True]


def test_format() -> None:
    assert check_steps(P, ["37+85=122", "122 - 19 = 103"]) == ["format", "after_error"]
    assert check_steps(P, ["The answer is 103", "x"]) == ["format", "after_error"]
    assert set(VERDICTS) >= {"ok", "format", "arithmetic", "operands", "answer", "after_answer", "after_error"}


def test_equal_numbers_keep_every_reading() -> None:
    p = problem(100, ("+", 20), ("-", 20), ("+", 30), ("-", 30))  # gold 100
    # "20 + 30" is either the two added numbers or the two subtracted ones; both continuations are right
    assert all(label_steps(p, ["20 + 30 = 50", "100 + 50 = 150", "20 + 30 = 50", "150 - 50 = 100",
                               "The answer is 100."]))
    assert all(label_steps(p, ["20 + 30 = 50", "100 - 50 = 50", "50 + 20 = 70", "70 + 30 = 100",
                               "The answer is 100."]))
    assert not all(label_steps(p, ["20 + 30 = 50", "20 + 30 = 50", "20 + 30 = 50"]))


def test_first_error() -> None:
    assert first_error([True, True]) is None
    assert first_error([True, False, False]) == 1
    assert first_error([]) is None


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_every_corruption_is_wrong_somewhere_and_labelled_by_the_checker(kind: str) -> None:
    rng = random.Random(kind)
    applied = 0
    for p in make_set(30, seed=5):
        if kind == "skip" and len(p.ops) == 1:
            with pytest.raises(ValueError):
                corrupt(p, rng, kind)
            continue
        c = corrupt(p, rng, kind)
        applied += 1
        assert c.kind == kind
        assert c.labels == label_steps(p, c.steps)
        fe = first_error(c.labels)
        assert fe is not None
        assert all(c.labels[:fe]) and not any(c.labels[fe:])  # first-error labels
        assert 0 <= c.line <= len(c.steps)
    assert applied >= 100


def test_corruption_matches_its_kind_on_a_three_step_problem() -> None:
    p = problem(482, ("+", 37), ("-", 19), ("+", 56))
    for kind in CORRUPTIONS:
        c = corrupt(p, random.Random(1), kind, path=0)
        fe = first_error(c.labels)
        verdict = check_steps(p, c.steps)[fe]  # type: ignore[index]
        expected = {"result_propagate": "arithmetic", "result_keep": "arithmetic", "answer": "answer",
                    "skip": "answer"}.get(kind, "operands")
        assert verdict == expected, (kind, c.steps)


def test_corrupt_is_deterministic_and_rejects_unknown_kinds() -> None:
    p = make_set(1, [4], seed=9)[0]
    a = [corrupt(p, random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(p, random.Random(0), "typo")


def test_prm_input_formats() -> None:
    steps = ["37 + 85 = 122", "122 - 19 = 103", "The answer is 103."]
    text = prm_text(P.question, steps)
    tagged = f"37 + 85 = 122{STEP_TAG}122 - 19 = 103{STEP_TAG}The answer is 103.{STEP_TAG}"
    assert text == "What is 37 + 85 - 19?\nA:\n" + tagged
    assert text.count(STEP_TAG) == len(steps)
    msgs = prm_messages(P.question, steps)
    assert msgs[0] == {"role": "user", "content": P.question}
    assert P.question + "\nA:\n" + msgs[1]["content"] == text


def bits(labels: list[bool]) -> str:
    return "".join("1" if x else "0" for x in labels)


def test_char_labels_mark_where_a_step_leaves_every_right_step() -> None:
    steps = ["37 + 85 = 132", "132 - 19 = 113", "The answer is 113."]
    cl = char_labels(P, steps)
    assert [len(c) for c in cl] == [len(s) for s in steps]
    assert bits(cl[0]) == "1" * 11 + "00"  # "37 + 85 = 1" could still become 122; "3" cannot
    assert not any(cl[1]) and not any(cl[2])  # after a wrong step nothing is right
    # "85 - " can only go on with 19 (85 and -19 are terms); "85 - 3" leaves every right step
    assert bits(char_labels(P, ["85 - 37 = 48"])[0]) == "11111" + "0" * 7
    # the answer line is only right once every term is combined
    assert bits(char_labels(P, ["37 + 85 = 122", "The answer is 122."])[1]) == "0" * 18


def test_char_labels_agree_with_step_labels() -> None:
    rng = random.Random(11)
    for p in make_set(40, seed=12):
        for worked in worked_paths(p):
            assert all(all(c) for c in char_labels(p, split_steps(worked)))
        for _ in range(4):
            c = corrupt(p, rng)
            for ok, chars in zip(c.labels, char_labels(p, c.steps), strict=True):
                assert chars or not ok
                if ok:
                    assert all(chars)


def test_lowest_step_is_the_first_of_the_lowest_scores() -> None:
    assert lowest_step([0.9, 0.2, 0.5, 0.2]) == 1
    assert lowest_step([0.7]) == 0
    assert lowest_step([]) is None
