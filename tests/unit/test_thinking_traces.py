"""The thinking-trace generator of the reasoning demo model: format, arithmetic, lengths, final line, slips."""

from __future__ import annotations

import itertools
import random
import re
from statistics import mean

import pytest

from ttc_tools.demo import problems
from ttc_tools.demo.thinking import (
    GENERATION_PROMPT,
    JSON_CUES,
    LEVELS,
    NO_THINK_PROMPT,
    THINK_END,
    THINK_START,
    column_add,
    column_sub,
    completion_prompt,
    extract_answer,
    final_line,
    generate,
    make_set,
    make_trace,
    split_completion,
    thought_lines,
)

COLUMN_LINE = re.compile(r"^(?:wait, )?(\d+) ([+-]) (\d+): (.+), so (\d+)$")
CHECK_LINE = re.compile(r"^check (\d+) ([+-]) (\d+): (.+), so (\d+)(?: ok|, not (\d+))$")


def columns_value(cols: str, op: str) -> int:
    """Re-read a column string: every column's arithmetic holds, and carries/borrows chain correctly."""
    digits: list[int] = []
    carry = 0
    for part in cols.split(", "):
        lhs, rhs = part.split("=")
        terms = [int(t) for t in lhs.split(op)]
        assert len(terms) == 2 + carry, part  # a carry/borrow in is written exactly when there is one
        if op == "+":
            assert sum(terms) == int(rhs), part
            digits.append(int(rhs) % 10)
            carry = int(rhs) // 10
        else:
            assert terms[0] - sum(terms[1:]) == int(rhs) and 0 <= int(rhs) <= 9, part
            carry = terms[0] // 10
            digits.append(int(rhs))
    if op == "+" and carry:
        digits.append(carry)
    return int("".join(map(str, reversed(digits))))


def test_columns_are_exact() -> None:
    assert column_add(604, 57) == ("4+7=11, 0+5+1=6, 6+0=6", 661)
    assert column_add(984, 57) == ("4+7=11, 8+5+1=14, 9+0+1=10", 1041)
    assert column_sub(604, 17) == ("14-7=7, 10-1-1=8, 6-0-1=5", 587)
    assert column_sub(604, 597) == ("14-7=7, 10-9-1=0, 6-5-1=0", 7)
    rng = random.Random(0)
    for _ in range(2000):
        a, b = rng.randint(0, 9999), rng.randint(0, 999)
        cols, value = column_add(a, b)
        assert value == a + b == columns_value(cols, "+")
        hi, lo = max(a, b), min(a, b)
        cols, value = column_sub(hi, lo)
        assert value == hi - lo == columns_value(cols, "-")


def test_slipped_columns_are_wrong_but_self_consistent() -> None:
    cols, value = column_add(604, 57, slip=(1, "carry"))
    assert (cols, value) == ("4+7=11, 0+5=5, 6+0=6", 651)
    cols, value = column_sub(684, 80, slip=(1, "digit"))
    assert (cols, value) == ("4-0=4, 8-8=1, 6-0=6", 614)


def walk(lines: list[str], gold: int, n_ops: int) -> int:
    """Check a thought line by line and return the number of corrected slips: every line is a chain, a
    column line, a check, or the result; every check of a right column line says ok, every wrong one is
    caught (``, not T``) and redone with ``wait, ...``; the last line is the gold answer."""
    corrected = 0
    pending: tuple[int, str, int, int] | None = None  # the last column line: (a, op, b, written value)
    steps = 0
    for i, line in enumerate(lines[:-1]):
        if m := COLUMN_LINE.match(line):
            a, op, b, cols, value = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
            if value == (a + b if op == "+" else a - b):
                assert columns_value(cols, op) == value
            else:  # a slip: the columns differ from the right ones and the line says what they say
                right_cols = column_add(a, b)[0] if op == "+" else column_sub(a, b)[0]
                assert cols != right_cols and len(cols.split(", ")) == len(right_cols.split(", "))
            if line.startswith("wait, "):
                assert pending is not None and pending[:3] == (a, op, b)
                assert value == (a + b if op == "+" else a - b)
                corrected += 1
            pending = (a, op, b, value)
        elif m := CHECK_LINE.match(line):
            assert pending is not None
            a, op, b, written = pending
            got, inv, x, cols, back, not_t = int(m[1]), m[2], int(m[3]), m[4], int(m[5]), m[6]
            assert (got, x) == (written, b) and inv != op
            assert columns_value(cols, inv) == back
            right = a + b if op == "+" else a - b
            if written == right:
                assert line.endswith(" ok") and back == a
                steps += 1
            else:
                assert not_t is not None and int(not_t) == a and back != a
                assert lines[i + 1].startswith("wait, ")
        else:  # a chain line: numbers and +/- only (the first may be rewritten with "= ")
            assert re.fullmatch(r"(= )?\d+( [+-] \d+)*", line), line
    assert steps == n_ops
    assert lines[-1] == str(gold)
    return corrected


def test_trace_walk() -> None:
    rng = random.Random(2)
    slips_seen = 0
    for level, (n_ops, _, _) in LEVELS.items():
        for _ in range(40):
            p = generate(level, rng)
            lines, slips = thought_lines(p, rng, slip_rate=0.3)
            assert walk(lines, p.gold, n_ops) == slips
            assert not any("The answer is" in line or "{" in line for line in lines)
            slips_seen += slips
    assert slips_seen > 50


def test_slip_is_noticed_and_corrected() -> None:
    p = problems.Problem(question="What is 684 - 80?", gold=604, level=1, first=684, ops=(("-", 80),))
    for seed in range(200):
        lines, slips = thought_lines(p, random.Random(seed), slip_rate=1.0)
        if slips:
            break
    assert slips == 1
    assert lines[0] == "684 - 80"
    assert lines[2].startswith("check ") and lines[2].endswith(", not 684")
    assert lines[3].startswith("wait, 684 - 80: ") and lines[3].endswith(", so 604")
    assert lines[4] == "check 604 + 80: 4+0=4, 0+8=8, 6+0=6, so 684 ok"
    assert lines[-1] == "604"


def test_lengths_grow_with_level() -> None:
    rng = random.Random(3)
    means = []
    for level in sorted(LEVELS):
        lens = [len(make_trace(generate(level, rng), rng, json_cue_rate=0, json_silent_rate=0).thought)
                for _ in range(60)]
        means.append(mean(lens))
    assert all(b > a + 50 for a, b in itertools.pairwise(means)), means
    assert 80 <= means[0] <= 160 and 800 <= means[-1] <= 1200, means


def test_training_sequence_and_final_line() -> None:
    rng = random.Random(4)
    kinds = {"text": 0, "cue": 0, "silent": 0, "empty": 0}
    for _ in range(600):
        p = generate(rng.choice(list(LEVELS)), rng)
        tr = make_trace(p, rng, json_cue_rate=0.3, json_silent_rate=0.1, no_think_rate=0.1)
        assert tr.text == f"<s>{tr.question}{GENERATION_PROMPT}{tr.thought}{THINK_END}{tr.final}</s>"
        assert tr.text.count(THINK_START) == 1 and tr.text.count(THINK_END) == 1
        assert "\n" not in tr.final and (tr.thought.endswith("\n") or tr.thought == "")
        assert tr.final == final_line(p.gold, json=tr.json)
        assert extract_answer(tr.completion) == p.gold == extract_answer(tr.final)
        cued = tr.question != p.question
        assert not cued or any(tr.question.endswith(c) for c in JSON_CUES)
        assert not cued or tr.json  # a cue always gets JSON
        kinds["cue" if cued else "silent" if tr.json else "text"] += 1
        kinds["empty"] += tr.thought == ""
        if not tr.json:
            assert tr.final == f"The answer is {p.gold}." and problems.extract_answer(tr.final) == p.gold
        else:
            assert tr.final == f'{{"answer": {p.gold}}}'
    assert all(v > 20 for v in kinds.values()), kinds


def test_prompts_and_splitting() -> None:
    assert completion_prompt("What is 1 + 2?") == "What is 1 + 2?\nA:\n<think>\n"
    assert completion_prompt("Q", thinking=False) == "Q" + NO_THINK_PROMPT == "Q\nA:\n<think>\n</think>"
    assert split_completion("1 + 2\n3\n</think>The answer is 3.") == ("1 + 2\n3\n", "The answer is 3.")
    assert split_completion("1 + 2: 2+1") == (None, "1 + 2: 2+1")
    assert extract_answer("1 + 2: 2+1") is None
    assert extract_answer('x\n</think>{"answer": 12}') == 12
    assert extract_answer('{ "answer" : -3 }') == -3


@pytest.mark.parametrize("level", [1, 5])
def test_sets_match_the_old_levels(level: int) -> None:
    """Levels 1-5 keep the old model's specs, so the two models can be compared on the same problems."""
    assert LEVELS[level] == problems.LEVELS[level]
    assert make_set(5, [level], seed=9) == problems.make_set(5, [level], seed=9)


def test_sets_are_reproducible() -> None:
    a = make_set(4, [6, 8], seed=1)
    assert a == make_set(4, [6, 8], seed=1) and len({p.question for p in a}) == 8
    assert all(len(p.ops) == p.level for p in a)


def test_segments_leave_forced_and_template_think_end_out_of_the_loss() -> None:
    rng = random.Random(6)
    seen = set()
    for _ in range(300):
        tr = make_trace(generate(3, rng), rng, no_think_rate=0.2, cut_rate=0.3)
        assert "".join(piece for piece, _ in tr.segments) == tr.text
        assert tr.segments[0] == ("<s>" + tr.prompt, False)
        assert tr.segments[2] == (THINK_END, tr.think_end == "generated")
        assert tr.segments[3] == (tr.final + "</s>", True)
        if tr.think_end == "prompt":
            assert tr.thought == "" and tr.text == f"<s>{tr.question}{NO_THINK_PROMPT}{tr.final}</s>"
        elif tr.think_end == "forced":
            assert not tr.thought.endswith(f"\n{tr.problem.gold}\n")
        assert extract_answer(tr.completion) == tr.problem.gold
        seen.add(tr.think_end)
    assert seen == {"generated", "forced", "prompt"}
