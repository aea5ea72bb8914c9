"""Bounded, linear-time answer extraction and the cheap normal forms (no math-verify here).

Everything in this module runs on the event loop, on text a backend returned, so every function is
linear in its input and its input is capped: :func:`tail` keeps the last :data:`MAX_SCAN_CHARS`
characters of a sample (the final answer sits at the end), and a key is never computed from more
than :data:`MAX_ANSWER_CHARS` characters of an answer (longer answers key on a digest).
"""

from __future__ import annotations

import hashlib
import re
from fractions import Fraction

MAX_SCAN_CHARS = 16_384
"""Characters at the end of a sample that extraction looks at."""
MAX_ANSWER_CHARS = 1_000
"""Longer extracted answers are keyed by a digest of their normal form."""

_BOXED_OR_BRACE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_ANSWER_IS = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*:|answer\s*:|####)[ \t:]*", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_NUMBER_IN_TEXT = re.compile(
    r"(?:(?<![\w)\]}.])-)?"
    r"(?:\\[dt]?frac\{-?\d{1,60}\}\{\d{1,60}\}"
    r"|\d{1,60}/\d{1,60}(?![\d.])"
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
_CHOICE = re.compile(r"\(([A-Za-z])\)")
_UNIT_SUFFIX = re.compile(r"(?:\\%|%|\^\{?\\circ\}?|\\circ|\\degree)$")
_MAX_NUMBER_DIGITS = 400


def tail(text: str) -> str:
    """The part of a sample extraction looks at: its last :data:`MAX_SCAN_CHARS` characters."""
    return text if len(text) <= MAX_SCAN_CHARS else text[-MAX_SCAN_CHARS:]


def boxed_contents(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (or ``\\fbox``) whose braces balance and that is not
    empty; a truncated one is skipped. One pass with a stack of open braces: O(len(text))."""
    stack: list[int] = []  # content start of each open brace; -1 for a plain brace
    best_start = -1
    best: str | None = None
    for m in _BOXED_OR_BRACE.finditer(text):
        token = m.group()
        if token == "}":
            if not stack:
                continue
            start = stack.pop()
            if start >= 0 and start > best_start:
                inner = text[start:m.start()].strip()
                if inner:
                    best_start, best = start, inner
        else:
            stack.append(m.end() if token != "{" else -1)
    return best


def _clean_phrase(s: str) -> str:
    s = s.split("\n", 1)[0]
    end = _SENTENCE_END.search(s)
    if end:
        s = s[: end.start()]
    inner = boxed_contents(s)
    if inner is not None:
        return inner
    return s.strip().strip("*_`$ ").rstrip(".").strip()


def answer_phrase(text: str) -> str | None:
    """What follows the last "the answer is" / "final answer:" / "answer:" / "####" (up to the end of
    its sentence, markup stripped), or ``None``."""
    last = None
    for last in _ANSWER_IS.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    return _clean_phrase(text[last.end():]) or None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands commas removed), ``a/b`` and ``\\frac{a}{b}`` included."""
    found = None
    for found in _NUMBER_IN_TEXT.finditer(text):  # noqa: B007 - we want the last match
        pass
    return None if found is None else found.group().replace(",", "")


def extract_answer(text: str) -> str | None:
    """The final answer in a sample's text, or ``None`` (the ``auto`` kind's extraction).

    Order: the last balanced ``\\boxed{...}``; else the last "the answer is X" / "final answer: X" /
    "answer: X" / "#### X" (case-insensitive, up to the end of the sentence, markup stripped); else
    the last number in the text (negatives, decimals, thousands commas removed, ``a/b`` and
    ``\\frac{a}{b}`` fractions). Looks at :func:`tail` of the text only.
    """
    if not text:
        return None
    text = tail(text)
    boxed = boxed_contents(text)
    if boxed is not None:
        return boxed
    phrase = answer_phrase(text)
    if phrase:
        return phrase
    return last_number(text)


def decimal_string(value: Fraction) -> str:
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
    ``"1000"``, ``"0.5"``, ``"-3"``, ``"1/3"``. Numbers of more than 400 digits are not numbers here.
    """
    if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_NUMBER_DIGITS:  # the common case, no Fraction
        return str(int(raw))
    if len(raw) > MAX_ANSWER_CHARS:
        return None
    s = _DROP.sub("", raw)
    s = _UNIT_SUFFIX.sub("", s)
    if not s or sum(c.isdigit() for c in s) > _MAX_NUMBER_DIGITS:
        return None
    try:
        if _PLAIN_NUMBER.fullmatch(s) and any(c.isdigit() for c in s):
            return decimal_string(Fraction(s.replace(",", "")))
        m = _INT_FRACTION.fullmatch(s)
        if m:
            num = int(m["n1"] or m["n2"] or m["n3"])
            den = int(m["d1"] or m["d2"] or m["d3"])
            if den == 0:
                return None
            value = Fraction(num, den)
            return decimal_string(-value if m["sign"] == "-" else value)
    except (ValueError, ZeroDivisionError):
        return None
    return None


def digest_key(prefix: str, text: str) -> str:
    """A short stable key for a long answer: ``prefix`` + 16 hex of its sha256."""
    return f"{prefix}#{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def normalize_text(raw: str) -> str:
    """Normalised string form of a non-numeric (math-like) answer: no spaces, ``$``,
    ``\\left``/``\\right``, spacing commands, ``\\text{}``-style wrappers, outer ``\\boxed{}``,
    trailing period or degree marks; ``\\dfrac``/``\\tfrac`` become ``\\frac``; a lettered choice
    ``(B)`` becomes ``B``. Answers longer than :data:`MAX_ANSWER_CHARS` become a digest key."""
    s = raw.strip()
    if len(s) > MAX_ANSWER_CHARS:
        return digest_key("long", _DROP.sub("", s))
    boxed = boxed_contents(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if boxed is not None:
        s = boxed
    prev = None
    while prev != s:
        prev, s = s, _TEXT_WRAPPER.sub(r"\1", s)
    s = _DROP.sub("", s).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DEGREES.sub("", s).rstrip(".")
    choice = _CHOICE.fullmatch(s)
    return choice[1] if choice else s
