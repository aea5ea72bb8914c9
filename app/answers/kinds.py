"""Answer kinds: how a sample's answer is extracted and which samples vote together.

A policy names its kind (``answer: {kind, params}``), a request may override it (``ttc.answer``);
replay, batches and the live service share these classes. Every kind does two things:

* ``extract(text)`` -> the raw answer of a sample (or ``None``), inline, linear in the text;
* ``key(raw)`` -> the canonical vote key (``None``: the sample does not vote), or a :class:`Deferred`
  when the key needs CPU-heavy work (math-verify, running code), which the query's canoniser
  (:mod:`app.answers.canon`) sends to a worker process; ``Deferred.fallback`` is the key used when
  that work times out, is refused or fails.

| kind   | extraction                                  | equal when                                  |
|--------|---------------------------------------------|---------------------------------------------|
| auto   | boxed / "answer is" / last number           | same number; math-verify only for text that |
|        |                                             | looks like math; else normalised text       |
| number | boxed / "answer is" / last number           | same number (anything else: no vote)        |
| math   | boxed / "answer is" / last number           | same number, else math-verify               |
| choice | "(B)", "answer: B", "the answer is (C)",    | same option letter                          |
|        | or the option's text                        |                                             |
| regex  | the pattern's one group (last match, RE2)   | same number, else normalised text           |
| json   | the JSON value of the text (fence stripped) | same canonical JSON (keys sorted)           |
| text   | "answer is" phrase, else the last line      | normalised exact match (case, spaces, ...)  |
| code   | last fenced block, else the text            | same outputs on the inputs (sandboxed),     |
|        |                                             | else the same normalised program text       |
| tool_call | the sample's tool calls (chat ``tools``) | same function names and canonical arguments |
| none   | -                                           | never: no vote (best-of-n, single)          |

The kinds themselves hold only validated params and per-query context (a prompt's options or
doctest inputs); they are built per query by a :func:`app.answers.spec.kind_factory`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.answers.extract import (
    MAX_ANSWER_CHARS,
    answer_phrase,
    digest_key,
    extract_answer,
    last_number,
    normalize_text,
    number_key,
    tail,
)
from app.answers.mathparse import MAX_PARSE_CHARS

KindName = Literal["auto", "number", "math", "choice", "code", "regex", "json", "text", "tool_call", "none"]
KIND_NAMES: tuple[str, ...] = ("auto", "number", "math", "choice", "code", "regex", "json", "text", "tool_call",
                               "none")


@dataclass(frozen=True, slots=True)
class Deferred:
    """Key work for a worker: ``work`` is ``"math"`` or ``"code"``, ``payload`` its input."""

    work: Literal["math", "code"]
    payload: str
    fallback: str | None


Key = str | None


@dataclass(frozen=True, slots=True)
class ExtractJob:
    """One worker call of :meth:`AnswerKind.extract_job`: ``fn(*args)`` returns ``count`` raw answers."""

    fn: Callable[..., list[str | None]]
    args: tuple[Any, ...]
    count: int


class KindParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class AnswerKind:
    """Base of every kind. Subclasses set ``name``/``Params`` and override what differs."""

    name: ClassVar[str]
    Params: ClassVar[type[KindParams]] = KindParams
    extract_in_worker: ClassVar[bool] = False
    """Extraction whose cost a client controls (``regex``: its pattern): the service runs
    :meth:`extract_job` in an answer worker, under its hard time limit, instead of :meth:`extract`."""

    def __init__(self, params: KindParams, prompt: str = "") -> None:
        self.params = params
        self.prompt = prompt

    def extract(self, text: str) -> str | None:
        return extract_answer(text)

    def extract_job(self, texts: Sequence[str]) -> list[ExtractJob]:
        """Worker calls whose results, concatenated in order, are the raw answers of ``texts`` (only kinds with
        :attr:`extract_in_worker`)."""
        raise NotImplementedError

    def extract_from(self, text: str, tool_calls: Sequence[Mapping[str, Any]] | None) -> str | None:
        """The raw answer of a sample with its tool calls (only ``tool_call`` looks at them)."""
        return self.extract(text)

    def key(self, raw: str) -> Key | Deferred:
        raise NotImplementedError


_MATH_SIGNAL = re.compile(r"[\d\\^_=+\-*/<>|()\[\]{}!]")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_CODE_SIGNAL = re.compile(r"\bdef\s|\breturn\b|\bimport\s|;\s*$|^\s*(?:for|while|if)\b.*:\s*$", re.M)


def looks_like_math(raw: str) -> bool:
    """Short text with a math signal (a digit, backslash, operator or bracket), at most three plain
    words and no code: only such answers are worth math-verify's time."""
    if len(raw) > MAX_PARSE_CHARS or not _MATH_SIGNAL.search(raw) or "\n" in raw.strip():
        return False
    words = _WORD.findall(raw)
    return len(words) <= 3 and not _CODE_SIGNAL.search(raw)


class AutoKind(AnswerKind):
    """Today's numeric-or-math behaviour, bounded: numbers inline, math-verify (in a worker) only for
    text that :func:`looks_like_math`, everything else (prose, code) by normalised text."""

    name = "auto"

    def key(self, raw: str) -> Key | Deferred:
        num = number_key(raw)
        if num is not None:
            return num
        if not raw.strip():
            return None
        if looks_like_math(raw):
            return Deferred("math", raw, normalize_text(raw) or None)
        return text_key(raw) if _WORD.search(raw) else (normalize_text(raw) or None)


class NumberKind(AnswerKind):
    """Numbers only: the number in the extracted answer, else no vote."""

    name = "number"

    def key(self, raw: str) -> Key | Deferred:
        num = number_key(raw)
        if num is None and len(raw) <= MAX_ANSWER_CHARS:
            inner = last_number(raw)
            num = number_key(inner) if inner is not None else None
        return num


class MathKind(AnswerKind):
    """math-verify equivalence for every non-numeric answer up to the parse cap."""

    name = "math"

    def key(self, raw: str) -> Key | Deferred:
        num = number_key(raw)
        if num is not None:
            return num
        norm = normalize_text(raw)
        if not norm:
            return None
        return Deferred("math", raw, norm) if len(raw) <= MAX_PARSE_CHARS else norm


_PUNCT_EDGES = "\"'`*_.,;:!?“”‘’«» \t\n"
_SPACES = re.compile(r"\s+")
_LAST_LINE_MARKUP = re.compile(r"^(?:[#>*\-+]+\s*)+")


def text_key(raw: str, case_sensitive: bool = False) -> Key:
    """Normalised exact-match key: NFKC, case folded (unless ``case_sensitive``), whitespace
    collapsed, quotes, markdown emphasis and sentence punctuation stripped at both ends; long answers
    become a digest."""
    s = unicodedata.normalize("NFKC", raw[: 4 * MAX_ANSWER_CHARS])
    s = _SPACES.sub(" ", s).strip(_PUNCT_EDGES)
    if not case_sensitive:
        s = s.casefold()
    if not s:
        return None
    return s if len(s) <= MAX_ANSWER_CHARS else digest_key("text", s)


class TextParams(KindParams):
    case_sensitive: bool = Field(False, description="Compare case as well")


class TextKind(AnswerKind):
    """Free-text answers by normalised exact match (:func:`text_key`)."""

    name = "text"
    Params = TextParams
    params: TextParams

    def extract(self, text: str) -> str | None:
        text = tail(text)
        phrase = answer_phrase(text)
        if phrase:
            return phrase
        for line in reversed(text.splitlines()):
            line = _LAST_LINE_MARKUP.sub("", line).strip()
            if line:
                return line
        return None

    def key(self, raw: str) -> Key | Deferred:
        return text_key(raw, self.params.case_sensitive)


class NoneKind(AnswerKind):
    """No vote: every sample's key is ``None`` (for best-of-n or single-sample policies)."""

    name = "none"

    def extract(self, text: str) -> str | None:
        return None

    def key(self, raw: str) -> Key | Deferred:
        return None


MAX_JSON_CHARS = 65_536


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every closed ``` fence in ``text``, fences paired in order (one pass)."""
    marks: list[int] = []
    i = text.find("```")
    while i >= 0:
        marks.append(i)
        i = text.find("```", i + 3)
    out = []
    for open_at, close_at in zip(marks[::2], marks[1::2], strict=False):
        head, _, body = text[open_at + 3:close_at].partition("\n")
        out.append((head.strip().split(" ")[0].lower(), body))
    return out


class JsonKind(AnswerKind):
    """JSON answers (``response_format``): the value of the whole text, else of its last ```json
    fence, else of the span from the first ``{``/``[`` to the last ``}``/``]``; key = canonical JSON
    (keys sorted, no spaces). At most 64 KiB are parsed."""

    name = "json"

    def extract(self, text: str) -> str | None:
        text = text.strip()
        if not text or len(text) > MAX_JSON_CHARS:
            return None
        candidates = [text]
        candidates += [body for lang, body in reversed(fenced_blocks(text)) if lang in ("json", "")]
        start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
        end = max(text.rfind("}"), text.rfind("]"))
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
        for c in candidates:
            canon = canonical_json(c)
            if canon is not None:
                return canon
        return None

    def key(self, raw: str) -> Key | Deferred:
        if len(raw) > MAX_ANSWER_CHARS:
            return digest_key("json", raw)
        return raw


def canonical_json(text: str) -> str | None:
    """``json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))`` or ``None``."""
    try:
        value = json.loads(text)
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (ValueError, RecursionError, TypeError):
        return None
