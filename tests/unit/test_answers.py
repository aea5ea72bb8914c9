"""Answer extraction, canonical keys and equivalence."""

from __future__ import annotations

import threading
import time

import pytest

from app.answers import AnswerCanon, equivalent, extract_answer, normalize_text, number_key


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is \boxed{\frac{a}{\sqrt{b}}} done", r"\frac{a}{\sqrt{b}}"),
        (r"first \boxed{1} then \boxed{ {2} } finally", "{2}"),
        (r"good \boxed{7} then truncated \boxed{\frac{1}{", "7"),
        ("The answer is 42.", "42"),
        ("blah. the answer is 42. Then more text 7", "42"),
        ("So the final answer is **12**.", "12"),
        ("the answer is $-3.5$.", "-3.5"),
        ("The answer is 1, then the answer is 9", "9"),
        ("#### 72", "72"),
        ("x = 5-3 and then -7 remains", "-7"),
        ("We get 1,234,567 apples", "1234567"),
        ("the value is 3.25 units", "3.25"),
        ("ratio 3/4", "3/4"),
        (r"so $\frac{1}{2}$", r"\frac{1}{2}"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("1,000", "1000"),
        ("1000.0", "1000"),
        ("+5", "5"),
        ("-0", "0"),
        (".5", "0.5"),
        ("$-2.50$", "-2.5"),
        (r"\frac{1}{2}", "0.5"),
        (r"-\dfrac{3}{4}", "-0.75"),
        (r"\frac12", "0.5"),
        ("2/6", "1/3"),
        (r"50\%", "50"),
        (r"90^\circ", "90"),
        ("x+1", None),
        ("1,2", None),
        ("", None),
    ],
)
def test_number_key(raw: str, key: str | None) -> None:
    assert number_key(raw) == key


def test_normalize_text() -> None:
    assert normalize_text(r"\left( 1, 2 \right)") == "(1,2)"
    assert normalize_text(r"\text{ B }") == normalize_text("(B)") == "B"
    assert normalize_text(r"\boxed{\dfrac{\pi}{2}}.") == r"\frac{\pi}{2}"


def test_canon_merges_equivalent_numbers() -> None:
    canon = AnswerCanon()
    assert canon.key("0.5") == canon.key(r"\frac{1}{2}") == canon.key("1/2") == "0.5"
    assert canon.key("1,000") == canon.key("1000") == canon.key("1000.00") == "1000"
    assert canon.key(None) is None
    assert canon.key("  ") is None


def test_canon_symbolic_uses_math_verify() -> None:
    canon = AnswerCanon()
    first = canon.key(r"\frac{\sqrt{2}}{2}")
    assert canon.key(r"\frac{1}{\sqrt{2}}") == first
    assert canon.key(r"\sqrt{2}/2") == first
    assert canon.key(r"\pi") != first
    assert canon.key(r"\sqrt{4}") == "2"  # closed forms that are rational become number keys
    assert canon.key(r"\text{B}") == canon.key("B") == "B"


def test_canon_skips_huge_expressions() -> None:
    canon = AnswerCanon()
    start = time.perf_counter()
    assert canon.key(r"10^{10^{10}}") == r"10^{10^{10}}"
    assert canon.key(r"\pi") == r"\pi"
    assert time.perf_counter() - start < 5


def test_number_fast_path_never_calls_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.answers

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("math-verify called for a plain number")

    monkeypatch.setattr(app.answers, "parse_math", boom)
    monkeypatch.setattr(app.answers, "verify_math", boom)
    canon = AnswerCanon()
    assert [canon.key(f"{i},000.5") for i in range(3)] == ["0.5", "1000.5", "2000.5"]


def test_canon_works_off_the_main_thread() -> None:
    out: list[str | None] = []
    t = threading.Thread(target=lambda: out.append(AnswerCanon().key(r"\frac{x}{2}")))
    t.start()
    t.join(timeout=30)
    assert out == [r"\frac{x}{2}"]


@pytest.mark.parametrize(
    ("gold", "answer", "ok"),
    [
        ("0.5", r"\frac{1}{2}", True),
        ("1000", "1,000", True),
        ("2", "3", False),
        (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
        ("x+1", "1+x", True),
        (r"\pi", "3", False),
        ("5", None, False),
    ],
)
def test_equivalent(gold: str, answer: str | None, ok: bool) -> None:
    assert equivalent(gold, answer) is ok
