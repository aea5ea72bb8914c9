"""Answer extraction and normalisation.

* :func:`extract_answer` pulls the final answer out of a sample's text.
* :class:`AnswerCanon` maps the answers of one query to canonical keys, so equivalent answers
  ("0.5", "\\frac{1}{2}", "1/2") share one key and vote together.
* :func:`equivalent` decides whether an answer matches a gold answer.

Plain numbers (integers, decimals, thousands commas, signs, simple fractions) take a pure-Python
fast path (microseconds). Everything else goes through ``math-verify``, always with its
``signal.alarm`` timeouts disabled (``parsing_timeout=None``, ``timeout_seconds=None``) because the
service calls it outside the main thread; callers bound its run time themselves.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from math_verify import parse, verify
from sympy import Pow, factorial, preorder_traversal

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_IS = re.compile(r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*:|answer\s*:|####)[ \t:]*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_NUMBER_IN_TEXT = re.compile(
    r"(?:(?<![\w)\]}.])-)?"
    r"(?:\\[dt]?frac\{-?\d+\}\{\d+\}"
    r"|\d+/\d+(?![\d.])"
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?"
    r"|\d+(?:\.\d+)?"
    r"|\.\d+)"
)
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?")
_INT_FRACTION = re.compile(
    r"(?P<sign>[+-]?)(?:\\[dt]?frac\{(?P<n1>[+-]?\d+)\}\{(?P<d1>[+-]?\d+)\}"
    r"|\\[dt]?frac(?P<n2>\d)(?P<d2>\d)"
    r"|(?P<n3>\d+)/(?P<d3>\d+))"
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_DROP = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\$|\s+")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?$")
_MAX_EXPONENT = 10_000
_CHOICE = re.compile(r"\(([A-Za-z])\)")
_UNIT_SUFFIX = re.compile(r"(?:\\%|%|\^\{?\\circ\}?|\\circ|\\degree)$")


def _boxed_contents(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` with balanced braces (a truncated one is skipped)."""
    for m in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            c = text[i]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    inner = text[start:i].strip()
                    if inner:
                        return inner
                    break
    return None


def _clean_phrase(s: str) -> str:
    s = s.split("\n", 1)[0]
    end = _SENTENCE_END.search(s)
    if end:
        s = s[: end.start()]
    inner = _boxed_contents(s)
    if inner is not None:
        return inner
    return s.strip().strip("*_`$ ").rstrip(".").strip()


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``, or ``None``.

    Order: the last balanced ``\\boxed{...}``; else the last "the answer is X" / "final answer: X" /
    "answer: X" / "#### X" (case-insensitive, up to the end of the sentence, markup stripped); else
    the last number in the text (negatives, decimals, thousands commas removed, ``a/b`` and
    ``\\frac{a}{b}`` fractions).
    """
    if not text:
        return None
    boxed = _boxed_contents(text)
    if boxed is not None:
        return boxed
    phrases = list(_ANSWER_IS.finditer(text))
    if phrases:
        answer = _clean_phrase(text[phrases[-1].end() :])
        if answer:
            return answer
    numbers = _NUMBER_IN_TEXT.findall(text)
    if numbers:
        return str(numbers[-1]).replace(",", "")
    return None


def _decimal_string(value: Fraction) -> str:
    """Canonical text of a rational: ``"12"``, ``"-0.25"``, or ``"1/3"`` if not a finite decimal."""
    num, den = value.numerator, value.denominator
    if den == 1:
        return str(num)
    twos = fives = 0
    rest = den
    while rest % 2 == 0:
        rest //= 2
        twos += 1
    while rest % 5 == 0:
        rest //= 5
        fives += 1
    if rest != 1:
        return f"{num}/{den}"
    k = max(twos, fives)
    digits = str(abs(num) * (10**k // den)).rjust(k + 1, "0")
    sign = "-" if num < 0 else ""
    return f"{sign}{digits[:-k]}.{digits[-k:].rstrip('0')}"


def number_key(raw: str) -> str | None:
    """Canonical key of a plain number, or ``None`` when ``raw`` is not one.

    Accepts ``1,000`` / ``1000.0`` / ``+5`` / ``.5`` / ``-3`` / ``1/2`` / ``\\frac{1}{2}`` /
    ``\\dfrac12`` with optional ``$``, spaces, ``\\%`` and degree marks. Keys are exact:
    ``"1000"``, ``"0.5"``, ``"-3"``, ``"1/3"``.
    """
    s = _DROP.sub("", raw)
    s = _UNIT_SUFFIX.sub("", s)
    if not s:
        return None
    try:
        if _PLAIN_NUMBER.fullmatch(s) and any(c.isdigit() for c in s):
            return _decimal_string(Fraction(s.replace(",", "")))
        m = _INT_FRACTION.fullmatch(s)
        if m:
            num = int(m["n1"] or m["n2"] or m["n3"])
            den = int(m["d1"] or m["d2"] or m["d3"])
            if den == 0:
                return None
            value = Fraction(num, den)
            return _decimal_string(-value if m["sign"] == "-" else value)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def normalize_text(raw: str) -> str:
    """Normalised string form of a non-numeric answer: no spaces, ``$``, ``\\left``/``\\right``,
    spacing commands, ``\\text{}``-style wrappers, outer ``\\boxed{}``, trailing period or degree
    marks; ``\\dfrac``/``\\tfrac`` become ``\\frac``; a lettered choice ``(B)`` becomes ``B``."""
    s = raw.strip()
    boxed = _boxed_contents(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if boxed is not None:
        s = boxed
    prev = None
    while prev != s:
        prev, s = s, _TEXT_WRAPPER.sub(r"\1", s)
    s = _DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s).rstrip(".")
    choice = _CHOICE.fullmatch(s)
    return choice[1] if choice else s


def parse_math(answer: str) -> list[Any]:
    """``math_verify.parse`` of an answer (wrapped in ``\\boxed{}``), without signal timeouts."""
    try:
        return list(parse(f"\\boxed{{{answer}}}", parsing_timeout=None))
    except Exception:
        return []


def verify_math(gold: list[Any], pred: list[Any]) -> bool:
    """``math_verify.verify`` without signal timeouts; ``False`` when either side did not parse."""
    if not gold or not pred:
        return False
    try:
        return bool(verify(gold, pred, timeout_seconds=None))
    except Exception:
        return False


def _is_tame(expr: Any) -> bool:
    """Whether comparing ``expr`` is cheap: no power with a numeric exponent above
    ``_MAX_EXPONENT`` or with a power/factorial inside its exponent, no factorial of a number above
    ``_MAX_EXPONENT`` (``10^{10^{10}}`` would stall ``verify``, which runs here without a timeout)."""
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


def _as_number_key(expr: Any) -> str | None:
    """Number key of a closed expression that evaluates to a rational
    (``\\sqrt{4}`` -> ``"2"``, ``2^3`` -> ``"8"``); ``None`` otherwise."""
    if not getattr(expr, "is_number", False):
        return None
    try:
        value = expr.doit()
        if value.is_Rational:
            return _decimal_string(Fraction(int(value.p), int(value.q)))
    except Exception:
        return None
    return None


def _parse_tame(answer: str) -> list[Any]:
    """:func:`parse_math`, or ``[]`` when the parse is not :func:`_is_tame`."""
    parsed = parse_math(answer)
    if parsed and not all(_is_tame(p) for p in parsed if not isinstance(p, str)):
        return []
    return parsed


def equivalent(gold: str, answer: str | None) -> bool:
    """Whether ``answer`` matches ``gold``.

    Both plain numbers: exact comparison of :func:`number_key`. Otherwise equal normalised strings,
    else ``math_verify.verify(parse(gold), parse(answer))`` (no signal timeouts).
    """
    if answer is None:
        return False
    g_num, a_num = number_key(gold), number_key(answer)
    if g_num is not None and a_num is not None:
        return g_num == a_num
    if normalize_text(gold) == normalize_text(answer):
        return True
    return verify_math(_parse_tame(gold), _parse_tame(answer))


class AnswerCanon:
    """Canonical answer keys for the samples of one query (one instance per query, not shared
    between threads).

    ``key(raw)``:

    1. ``None`` / blank -> ``None``; a raw string seen before -> its earlier key (memoised).
    2. A plain number -> :func:`number_key` (no math-verify).
    3. Otherwise parse with math-verify; a parse that is a rational number gets that number's key;
       else the first earlier non-numeric key that ``verify`` finds equivalent is reused;
       else the new key is :func:`normalize_text` of ``raw``. Parses are cached per key.

    Cost: step 3 is one parse plus at most one ``verify`` per distinct earlier non-numeric key.
    """

    def __init__(self) -> None:
        self._memo: dict[str, str | None] = {}
        self._symbolic: dict[str, list[Any]] = {}

    def key(self, raw: str | None) -> str | None:
        if raw is None:
            return None
        if raw in self._memo:
            return self._memo[raw]
        result = self._compute(raw)
        self._memo[raw] = result
        return result

    def _compute(self, raw: str) -> str | None:
        num = number_key(raw)
        if num is not None:
            return num
        norm = normalize_text(raw)
        if not norm:
            return None
        if norm in self._symbolic:
            return norm
        parsed = _parse_tame(raw)
        as_number = _as_number_key(parsed[0]) if parsed else None
        if as_number is not None:
            return as_number
        if parsed:
            for existing, existing_parse in self._symbolic.items():
                if verify_math(existing_parse, parsed):
                    return existing
        self._symbolic[norm] = parsed
        return norm
