"""math-verify behind limits: parsing and equivalence of math answers.

These functions are CPU-bound (sympy holds the GIL) and their cost depends on model-written text, so
the service only calls them inside the parse pool's worker processes (:mod:`app.answers.pool`),
where each call has a hard time limit. Offline tools may call them directly. math-verify's own
``signal.alarm`` timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``); inputs
longer than :data:`MAX_PARSE_CHARS` are never parsed, and expressions that would stall ``verify``
(:func:`is_tame`) are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from app.answers.extract import decimal_string, normalize_text, number_key

MAX_PARSE_CHARS = 512
"""Answers longer than this are compared as text, never parsed."""
_MAX_EXPONENT = 10_000


def parse_math(answer: str) -> list[Any]:
    """``math_verify.parse`` of an answer (wrapped in ``\\boxed{}``), without signal timeouts;
    ``[]`` when it does not parse or is longer than :data:`MAX_PARSE_CHARS`."""
    if len(answer) > MAX_PARSE_CHARS:
        return []
    from math_verify import parse

    try:
        return list(parse(f"\\boxed{{{answer}}}", parsing_timeout=None))
    except Exception:
        return []


def verify_math(gold: Sequence[Any], pred: Sequence[Any]) -> bool:
    """``math_verify.verify`` without signal timeouts; ``False`` when either side did not parse."""
    if not gold or not pred:
        return False
    from math_verify import verify

    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=None))
    except Exception:
        return False


def is_tame(expr: Any) -> bool:
    """Whether comparing ``expr`` is cheap: no power with a numeric exponent above 10,000 or with a
    power/factorial inside its exponent, no factorial of a number above 10,000
    (``10^{10^{10}}`` would stall ``verify``)."""
    from sympy import Pow, factorial, preorder_traversal

    try:
        for node in preorder_traversal(expr):
            if getattr(node, "is_Pow", False):
                exp = node.exp
                if exp.is_Number and abs(exp) > _MAX_EXPONENT:
                    return False
                if exp.has(Pow, factorial):
                    return False
            elif isinstance(node, factorial):
                arg = node.args[0]
                if arg.is_Number and abs(arg) > _MAX_EXPONENT:
                    return False
    except Exception:
        return False
    return True


@lru_cache(maxsize=4096)
def parse_tame(answer: str) -> tuple[Any, ...]:
    """:func:`parse_math`, or ``()`` when the parse is not :func:`is_tame` (cached per process)."""
    parsed = parse_math(answer)
    if parsed and not all(is_tame(p) for p in parsed if not isinstance(p, str)):
        return ()
    return tuple(parsed)


def as_number_key(expr: Any) -> str | None:
    """Number key of a closed expression that evaluates to a rational
    (``\\sqrt{4}`` -> ``"2"``, ``2^3`` -> ``"8"``); ``None`` otherwise."""
    if not getattr(expr, "is_number", False):
        return None
    try:
        value = expr.doit()
        if value.is_Rational:
            return decimal_string(Fraction(int(value.p), int(value.q)))
    except Exception:
        return None
    return None


def math_key(raw: str, known: Sequence[tuple[str, str]], max_compare: int) -> str:
    """The key of a math answer among a query's earlier non-numeric keys.

    ``known`` holds ``(key, raw answer)`` of the earlier keys, oldest first. A parse that is a
    rational number gets that number's key; else the first of the last ``max_compare`` known keys
    that ``verify`` finds equivalent; else :func:`normalize_text` of ``raw``."""
    parsed = parse_tame(raw)
    as_number = as_number_key(parsed[0]) if parsed else None
    if as_number is not None:
        return as_number
    if parsed:
        for key, other in list(known)[-max_compare:] if max_compare > 0 else []:
            if verify_math(parse_tame(other), parsed):
                return key
    return normalize_text(raw)


def equivalent(gold: str, answer: str | None) -> bool:
    """Whether ``answer`` matches ``gold``: both plain numbers -> exact comparison of
    :func:`number_key`; else equal :func:`normalize_text`; else ``verify(parse(gold), parse(answer))``
    (both at most :data:`MAX_PARSE_CHARS` long)."""
    if answer is None:
        return False
    g_num, a_num = number_key(gold), number_key(answer)
    if g_num is not None and a_num is not None:
        return g_num == a_num
    if normalize_text(gold) == normalize_text(answer):
        return True
    return verify_math(parse_tame(gold), parse_tame(answer))
