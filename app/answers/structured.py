"""The structured answer kinds: ``choice`` (option letters), ``regex`` (a client pattern, RE2),
``code`` (programs, equal by behaviour) and ``tool_call`` (chat tool calls). See
:mod:`app.answers.kinds` for the contract."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import re2
from pydantic import Field, ValidationInfo, field_validator, model_validator

from app.answers.extract import MAX_ANSWER_CHARS, answer_phrase, boxed_contents, digest_key, number_key, tail
from app.answers.kinds import (
    MAX_JSON_CHARS,
    AnswerKind,
    Deferred,
    ExtractJob,
    Key,
    KindParams,
    canonical_json,
    text_key,
)

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_OPTION_LINE = re.compile(r"^[ \t]*\(?([A-Z])[).:][ \t]+(\S[^\n]{0,999})$", re.M)
_OPTION_INLINE = re.compile(r"\(([A-Z])\)[ \t]*([^()\n]{1,1000}?)(?=[ \t]*\([A-Z]\)|\n|$)")
_LETTER = re.compile(r"^[*_$`\s]*\(?([A-Z])\)?(?:[.:)]|\s|$)")
_LONE_LETTER = re.compile(r"^[*_$`\s]*\(?([a-z])\)?[.*_$`\s]*$")
_PAREN_LETTER = re.compile(r"\(([A-Za-z])\)")


def prompt_options(prompt: str) -> list[str]:
    """Option texts listed in a prompt as lines ``A. text`` / ``(A) text`` / ``A) text``, or inline
    ``(A) text (B) text``; only a run starting at A in order counts."""
    for pattern in (_OPTION_LINE, _OPTION_INLINE):
        found: list[str] = []
        for m in pattern.finditer(tail(prompt)):
            if m.group(1) == _LETTERS[len(found)]:
                found.append(m.group(2).strip())
            elif m.group(1) == "A":
                found = [m.group(2).strip()]
        if len(found) >= 2:
            return found
    return []


class ChoiceParams(KindParams):
    options: list[str] | None = Field(
        None, max_length=26, description="Option texts in letter order (A, B, ...); default: read from the prompt")

    @field_validator("options")
    @classmethod
    def _short(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(len(o) > MAX_ANSWER_CHARS for o in v):
            raise ValueError(f"each option is limited to {MAX_ANSWER_CHARS} characters")
        return v


class ChoiceKind(AnswerKind):
    """Multiple choice: the key is the option letter, found as ``\\boxed{B}``, "the answer is (C)",
    "answer: B", the last "(B)" in the text, or an answer that is one option's text. With known
    options only their letters vote."""

    name = "choice"
    Params = ChoiceParams
    params: ChoiceParams

    def __init__(self, params: KindParams, prompt: str = "") -> None:
        super().__init__(params, prompt)
        options = self.params.options if self.params.options is not None else prompt_options(prompt)
        self.letters = _LETTERS[: len(options)] if options else _LETTERS
        self.by_text = {text_key(o): _LETTERS[i] for i, o in enumerate(options) if text_key(o)}

    def _letter(self, s: str) -> str | None:
        m = _LETTER.match(s) or _LONE_LETTER.match(s)
        if m:
            letter = m.group(1).upper()
            return letter if letter in self.letters else None
        return self.by_text.get(text_key(s) or "")

    def extract(self, text: str) -> str | None:
        text = tail(text)
        for candidate in (boxed_contents(text), answer_phrase(text)):
            if candidate:
                letter = self._letter(candidate)
                if letter is not None:
                    return letter
        last = None
        for m in _PAREN_LETTER.finditer(text):
            if m.group(1).upper() in self.letters:
                last = m.group(1).upper()
        if last is not None:
            return last
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return self._letter(lines[-1].strip()) if lines else None

    def key(self, raw: str) -> Key | Deferred:
        return self._letter(raw)


MAX_PROGRAM_SIZE = 1000
"""Most RE2 instructions a client's pattern may compile to (forward and reverse program). Matching costs up to
the text's length times the program's size (RE2's NFA, when its DFA cache overflows): about 50-200 ms per
16 KiB sample at this size, measured on the worst patterns found, and it runs in an answer worker under its
hard time limit; ``((?:[a-z]?){1000}[a-z]{1000})`` (3,006 instructions) took 0.2-2.3 s per sample."""
_CHECK_MEM = 128 << 10
"""RE2's memory budget when a pattern is validated (on the event loop): RE2 gives up on a program much larger
than :data:`MAX_PROGRAM_SIZE` within about a millisecond instead of compiling it whole (up to 0.2 s)."""
_MATCH_MEM = 8 << 20
"""RE2's memory budget of a pattern that matches (in a worker): its program and its DFA cache."""
_REGEX_CHUNK = 8
"""Samples matched per worker call (one call per chunk of a delivery, under the pool's time limit each)."""


class RegexParams(KindParams):
    ignore_case: bool = False
    pattern: str = Field(min_length=1, max_length=1000,
                         description=f"RE2 pattern with exactly one group, at most {MAX_PROGRAM_SIZE} RE2 instructions "
                                     "compiled")
    match: Literal["last", "first"] = Field("last", description="Which match of the pattern counts")

    @field_validator("pattern")
    @classmethod
    def _bounded(cls, v: str, info: ValidationInfo) -> str:
        check_pattern(v, info.data.get("ignore_case") is True)
        return v

    @model_validator(mode="after")
    def _one_group(self) -> RegexParams:
        groups = check_pattern(self.pattern, self.ignore_case)
        if groups != 1:
            raise ValueError(f"pattern must have exactly one group, it has {groups}")
        return self


def _options(ignore_case: bool, max_mem: int) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.max_mem = max_mem
    return options


@functools.lru_cache(maxsize=256)
def check_pattern(pattern: str, ignore_case: bool) -> int:
    """The number of groups of a valid pattern of at most :data:`MAX_PROGRAM_SIZE` instructions (forward and
    reverse); ``ValueError`` otherwise. Compiles within :data:`_CHECK_MEM` (bounded time, never matches)."""
    def too_large(size: str) -> ValueError:
        return ValueError(f"pattern is too large: the limit is {MAX_PROGRAM_SIZE} RE2 instructions and it compiles "
                          f"to {size} (use fewer or smaller repetitions)")

    try:
        compiled = re2.compile(pattern, _options(ignore_case, _CHECK_MEM))
    except re2.error as exc:
        if "too large" in str(exc):
            raise too_large("far more") from None
        raise ValueError(f"not a valid RE2 pattern: {exc}") from None
    if compiled.reverseprogramsize < 0:  # RE2 gave up compiling the reverse program
        raise too_large("far more")
    size = max(compiled.programsize, compiled.reverseprogramsize)
    if size > MAX_PROGRAM_SIZE:
        raise too_large(str(size))
    return int(compiled.groups)


def compile_pattern(pattern: str, ignore_case: bool) -> Any:
    """An RE2 pattern (linear-time matching, whatever the client wrote) for matching; ``ValueError`` if invalid or
    too large (:func:`check_pattern`)."""
    check_pattern(pattern, ignore_case)
    return _matcher(pattern, ignore_case)


@functools.lru_cache(maxsize=16)
def _matcher(pattern: str, ignore_case: bool) -> Any:
    try:
        return re2.compile(pattern, _options(ignore_case, _MATCH_MEM))
    except re2.error as exc:
        raise ValueError(f"not a valid RE2 pattern: {exc}") from None


def _find(compiled: Any, text: str, which: str) -> str | None:
    found = None
    for m in compiled.finditer(text):
        found = m.group(1)
        if which == "first":
            break
    return found


def regex_answers(pattern: str, ignore_case: bool, which: str, texts: Sequence[str]) -> list[str | None]:
    """The group of the first or last match of ``pattern`` in each text (``None``: no match). Runs in an answer
    worker (:meth:`RegexKind.extract_job`); the pattern was checked by :func:`check_pattern` when it arrived."""
    compiled = compile_pattern(pattern, ignore_case)
    return [_find(compiled, text, which) for text in texts]


class RegexKind(AnswerKind):
    """The pattern's group over the sample's tail (RE2: linear time, no backreferences, a bounded program);
    key = its number key, else its :func:`~app.answers.kinds.text_key`. The service matches in an answer
    worker (:meth:`extract_job`: a client's pattern costs up to text x program, so never on the event loop);
    :meth:`extract` matches here (offline code, workers)."""

    name = "regex"
    Params = RegexParams
    params: RegexParams
    extract_in_worker = True

    def extract(self, text: str) -> str | None:
        return _find(compile_pattern(self.params.pattern, self.params.ignore_case), tail(text), self.params.match)

    def extract_job(self, texts: Sequence[str]) -> list[ExtractJob]:
        p = self.params
        chunks = [[tail(t) for t in texts[i:i + _REGEX_CHUNK]] for i in range(0, len(texts), _REGEX_CHUNK)]
        return [ExtractJob(regex_answers, (p.pattern, p.ignore_case, p.match, chunk), len(chunk)) for chunk in chunks]

    def key(self, raw: str) -> Key | Deferred:
        return number_key(raw) or text_key(raw)


class CodeParams(KindParams):
    program: Literal["auto", "completion", "chat"] = Field(
        "auto", description="completion: the prompt followed by the sample; chat: a whole program in the sample")
    inputs: list[str] | None = Field(
        None, max_length=50, description="Call expressions whose outputs decide equality (default: the prompt's "
        "doctest examples)")
    entry_point: str | None = Field(None, max_length=200, description="Function the inputs call")

    @field_validator("inputs")
    @classmethod
    def _short(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(len(x) > MAX_ANSWER_CHARS for x in v):
            raise ValueError(f"each input is limited to {MAX_ANSWER_CHARS} characters")
        return v


_COMMENT = re.compile(r"^\s*#[^\n]*$|[ \t]+$", re.M)
_BLANKS = re.compile(r"\n\s*\n+")


def code_text_key(program: str) -> str:
    """Key of a program by its text: comment lines, trailing spaces and blank lines dropped."""
    return digest_key("code", _BLANKS.sub("\n", _COMMENT.sub("", program)).strip())


class CodeKind(AnswerKind):
    """Programs. With inputs (given, or the prompt's doctest examples) candidates that print the same
    outputs share a key (run sandboxed, in :class:`app.code.runner.CodeRunner`); without inputs, or
    when running is not possible, the key is the normalised program text."""

    name = "code"
    Params = CodeParams
    params: CodeParams

    def __init__(self, params: KindParams, prompt: str = "") -> None:
        from app.code.behaviour import doctest_calls

        super().__init__(params, prompt)
        self.calls = list(self.params.inputs) if self.params.inputs is not None else doctest_calls(prompt)

    def extract(self, text: str) -> str | None:
        from app.code.extract import form_program

        return form_program(text, prompt=self.prompt or None, mode=self.params.program)

    def key(self, raw: str) -> Key | Deferred:
        fallback = code_text_key(raw)
        return Deferred("code", raw, fallback) if self.calls else fallback


class ToolCallKind(AnswerKind):
    """Tool calls (chat ``tools``): the key is the list of calls, each its function name and its
    arguments as canonical JSON (the raw argument text when it is not JSON), in call order; a sample
    without tool calls votes with its normalised text."""

    name = "tool_call"

    def extract(self, text: str) -> str | None:
        return text_key(text) if text else None

    def extract_from(self, text: str, tool_calls: Sequence[Mapping[str, Any]] | None) -> str | None:
        if not tool_calls:
            return self.extract(text)
        calls = []
        for call in tool_calls[:64]:
            fn = call.get("function") if isinstance(call, Mapping) else None
            fn = fn if isinstance(fn, Mapping) else {}
            args = str(fn.get("arguments") or "")[:MAX_JSON_CHARS]
            calls.append({"name": str(fn.get("name") or ""), "arguments": canonical_json(args) or args})
        return "tool_calls:" + json.dumps(calls, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def key(self, raw: str) -> Key | Deferred:
        return raw if len(raw) <= MAX_ANSWER_CHARS else digest_key("tool_calls", raw)
