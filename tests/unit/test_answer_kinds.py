"""Answer kinds: what each extracts, which samples share a key, and params validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.answers import AnswerSpec, Deferred, kind_factory
from app.answers.kinds import looks_like_math, text_key

PROMPT = "Which city is the capital of Italy?\n(A) Paris\n(B) London\n(C) Rome\n(D) Madrid"


def key_of(kind: str, text: str, prompt: str = "", **params: object) -> object:
    k = kind_factory(AnswerSpec(kind=kind, params=params))(prompt)  # type: ignore[arg-type]
    raw = k.extract(text)
    if raw is None:
        return None
    found = k.key(raw)
    return ("deferred", found.work, found.fallback) if isinstance(found, Deferred) else found


@pytest.mark.parametrize(
    ("kind", "text", "key"),
    [
        # numbers: inline, whatever the kind that allows them
        ("auto", "So the total is 1,000.", "1000"),
        ("auto", r"\boxed{\frac{1}{2}}", "0.5"),
        ("number", "The answer is 42 apples.", "42"),
        ("number", r"The answer is \pi.", None),
        ("math", "The answer is 0.50", "0.5"),
        # LaTeX: math-verify, in a worker
        ("auto", r"so \boxed{\frac{\sqrt{2}}{2}}", ("deferred", "math", r"\frac{\sqrt{2}}{2}")),
        ("math", r"The answer is x^2+1.", ("deferred", "math", "x^2+1")),
        # prose and code never reach math-verify under auto
        ("auto", "Final answer: the cat sat on the mat because it was tired 3.",
         "the cat sat on the mat because it was tired 3"),
        ("auto", "The answer is `solve = lambda xs: sorted(xs)[:3]`.", "solve = lambda xs: sorted(xs)[:3]"),
        ("auto", "The answer is yajo.", "yajo"),
        ("text", "Let me think.\nThe answer is **Yajo**.", "yajo"),
        ("text", "thinking...\n\n  Paris, France  ", "paris, france"),
        # choices
        ("choice", "I think the answer is (C).", "C"),
        ("choice", "Answer: B", "B"),
        ("choice", r"so \boxed{D}", "D"),
        ("choice", "The answer is Rome.", "C"),
        ("choice", "(A) is wrong; (C) is right", "C"),
        ("choice", "The answer is (E).", None),  # not one of the prompt's options
        # regex, json, none
        ("regex", "answer: foo ... ANSWER: Bar", "bar"),
        ("json", '```json\n{"b": 1, "a": [1, 2]}\n```', '{"a":[1,2],"b":1}'),
        ("json", 'Here: {"a": 1 , "b": 2} done', '{"a":1,"b":2}'),
        ("json", "not json at all", None),
        ("none", "The answer is 4.", None),
    ],
)
def test_kind_table(kind: str, text: str, key: object) -> None:
    params = {"pattern": r"answer:\s*(\w+)", "ignore_case": True} if kind == "regex" else {}
    assert key_of(kind, text, PROMPT, **params) == key


@pytest.mark.parametrize(
    ("raw", "math"),
    [("x+1", True), (r"\frac{1}{2}", True), ("2 apples", True), ("yajo", False), ("(B)", True),
     ("the cat sat on the mat because 3", False), ("def f(x):\n    return x", False), ("x" * 600 + "+1", False)],
)
def test_looks_like_math(raw: str, math: bool) -> None:
    assert looks_like_math(raw) is math


def test_choice_options_given_in_params_and_inline() -> None:
    assert key_of("choice", "The answer is Banana.", "", options=["Apple", "Banana"]) == "B"
    assert key_of("choice", "I pick (c)", "Pick: (A) one (B) two (C) three") == "C"


def test_text_key_normalises_case_spaces_and_edges() -> None:
    assert text_key("  **Hello   World!** ") == text_key("hello world") == "hello world"
    assert text_key("Hello", case_sensitive=True) == "Hello"
    assert text_key("...") is None
    assert str(text_key("w " * 3000)).startswith("text#")


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"kind": "regex", "params": {"pattern": "no group"}}, "pattern must have exactly one group"),
        ({"kind": "regex", "params": {"pattern": "(a)(b)"}}, "exactly one group"),
        ({"kind": "regex", "params": {"pattern": r"(a)\1"}}, "not a valid RE2 pattern"),
        ({"kind": "text", "params": {"bogus": 1}}, "Extra inputs"),
        ({"kind": "choice", "params": {"options": ["x" * 2000]}}, "limited to"),
    ],
)
def test_bad_params_are_validation_errors(spec: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        AnswerSpec.model_validate(spec).validated_params()


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValidationError):
        AnswerSpec.model_validate({"kind": "poetry"})
