"""From samples to programs: extract_code, form_program, doctest_calls (no execution)."""

from __future__ import annotations

from typing import Literal

import pytest

from app.code import doctest_calls, extract_code, form_program
from app.code.extract import MAX_TEXT_CHARS, fenced_blocks

FENCE = "```"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Here:\n{FENCE}python\ndef f():\n    return 1\n{FENCE}\nDone.", "def f():\n    return 1"),
        (f"{FENCE}py\nx = 1\n{FENCE}", "x = 1"),
        (f"{FENCE}Python3 title=sol.py\nx = 3\n{FENCE}", "x = 3"),
        (f"{FENCE}\nx = 2\n{FENCE}", "x = 2"),
        ("~~~python\nx = 4\n~~~", "x = 4"),
        (f"first\n{FENCE}python\nx = 1\n{FENCE}\nthen\n{FENCE}python\nx = 2\n{FENCE}", "x = 2"),  # the last block
        (f"{FENCE}python\nx = 1\n{FENCE}\n{FENCE}bash\npip install x\n{FENCE}", "x = 1"),  # non-python skipped
        (f"{FENCE}bash\nls\n{FENCE}", None),
        (f"  {FENCE}python\n  x = 5\n  {FENCE}", "  x = 5"),  # indented fence (inside a list item)
        (f"{FENCE}python\ndef f():\n    return 1\n", "def f():\n    return 1\n"),  # unterminated: to the end
        (f"{FENCE}python\ns = '{FENCE}'\n{FENCE}", "s = '```'"),  # a fence must be alone on its line
        (f"{FENCE}python\n\n{FENCE}", None),  # empty block
        ("def f(x):\n    return x + 1\n", "def f(x):\n    return x + 1\n"),  # no fence: the whole text parses
        ("The answer is to return x + 1.", None),  # prose does not parse
        ("", None),
        ("x = 1\n" * (MAX_TEXT_CHARS // 6 + 1), None),  # over the cap
    ],
)
def test_extract_code(text: str, expected: str | None) -> None:
    assert extract_code(text) == expected


def test_fenced_blocks_languages() -> None:
    text = f"{FENCE}Python\na\n{FENCE}\n````\nb\n```\nstill b\n````\n"
    assert fenced_blocks(text) == [("python", "a"), ("", "b\n```\nstill b")]


PROMPT = 'def add(a, b):\n    """Sum.\n    >>> add(1, 2)\n    3\n    """\n'
Mode = Literal["auto", "completion", "chat"]


@pytest.mark.parametrize(
    ("sample", "prompt", "mode", "expected"),
    [
        ("    return a + b\n", PROMPT, "completion", PROMPT + "    return a + b\n"),
        ("    return a + b\n", PROMPT, "auto", PROMPT + "    return a + b\n"),  # a completion of the prompt
        ("    return a + b\n", None, "completion", "    return a + b\n"),
        (f"Sure!\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}", PROMPT, "auto",
         PROMPT + "\n\ndef add(a, b):\n    return a + b"),  # fenced: chat, after the prompt's stub
        ("def add(a, b):\n    return a + b\n", PROMPT, "auto", PROMPT + "\n\ndef add(a, b):\n    return a + b\n"),
        ("def add(a, b):\n    return a + b\n", "def add(a, b", "chat", "def add(a, b):\n    return a + b\n"),
        ("def add(a, b):\n    return a + b\n", None, "auto", "def add(a, b):\n    return a + b\n"),
        ("    return a + b\n", PROMPT, "chat", None),  # an indented fragment is no program
        ("Just use +.", None, "auto", None),
        (f"{FENCE}python\nx = 1\n{FENCE}", PROMPT, "completion", PROMPT + f"{FENCE}python\nx = 1\n{FENCE}"),
    ],
)
def test_form_program(sample: str, prompt: str | None, mode: Mode, expected: str | None) -> None:
    assert form_program(sample, prompt=prompt, mode=mode) == expected


def test_form_program_entry_point() -> None:
    prompt = "def helper(x):\n    return x\n\n\ndef solve(x):\n"
    whole = "def solve(x):\n    return helper(x) * 2\n"
    # the prompt's last def is the entry point; the prompt does not parse alone, so it is no prefix
    assert form_program(whole, prompt=prompt, mode="auto") == whole
    assert form_program(whole, prompt=prompt, mode="auto", entry_point="other") == prompt + whole
    program = form_program("def helper(x):\n    return 0\n", prompt=prompt, mode="auto")
    assert program is not None and program.startswith(prompt)


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (PROMPT, ["add(1, 2)"]),
        ('def f(x):\n    """\n    >>> f([1, 2])\n    [2, 4]\n    >>> f([])\n    []\n    >>> f([])\n    """\n',
         ["f([1, 2])", "f([])"]),  # deduplicated, in order
        ('def f(x):\n    """\n    >>> y = f(1)\n    >>> import math\n    >>> 1 + 1\n    >>> f(2\n    """\n', []),
        ('def f(x):\n    """No examples. f(1) == 2"""\n', []),
        ('import x\n# >>> f(1)\ndef f(x):\n    """>>> f(3)"""\n', ["f(3)"]),  # comments are no docstrings
        ('def f(x):\n    """\n    >>> f(1)\n', ["f(1)"]),  # a fragment that does not parse: raw lines
        ("", []),
    ],
)
def test_doctest_calls(prompt: str, expected: list[str]) -> None:
    assert doctest_calls(prompt) == expected


def test_doctest_calls_bounded() -> None:
    prompt = 'def f(x):\n    """\n' + "".join(f"    >>> f({i})\n" for i in range(100)) + '    """\n'
    assert doctest_calls(prompt) == [f"f({i})" for i in range(32)]
    assert len(doctest_calls(prompt, limit=5)) == 5
    long = 'def f(x):\n    """\n    >>> f(' + "1" * 2000 + ')\n    """\n'
    assert doctest_calls(long) == []
