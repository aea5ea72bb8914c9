"""The structured answer kinds: ``choice`` (option letters), ``regex`` (a client pattern, RE2),
``code`` (programs, equal by behaviour) and ``tool_call`` (chat tool calls). See
:mod:`app.answers.kinds` for the contract."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import re2
from pydantic import Field, field_validator, model_validator

from app.answers.extract import MAX_ANSWER_CHARS, answer_phrase, boxed_contents, digest_key, number_key, tail
from app.answers.kinds import MAX_JSON_CHARS, AnswerKind, Deferred, Key, KindParams, canonical_json, text_key

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


class RegexParams(KindParams):
    pattern: str = Field(min_length=1, max_length=1000, description="RE2 pattern with exactly one group")
    ignore_case: bool = False
    match: Literal["last", "first"] = Field("last", description="Which match of the pattern counts")

    @model_validator(mode="after")
    def _one_group(self) -> RegexParams:
        compiled = compile_pattern(self.pattern, self.ignore_case)
        if compiled.groups != 1:
            raise ValueError(f"pattern must have exactly one group, it has {compiled.groups}")
        return self


def compile_pattern(pattern: str, ignore_case: bool) -> Any:
    """An RE2 pattern (linear-time matching, whatever the client wrote); ``ValueError`` if invalid."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = not ignore_case
    options.max_mem = 8 << 20
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise ValueError(f"not a valid RE2 pattern: {exc}") from None


class RegexKind(AnswerKind):
    """The pattern's group over the sample's tail (RE2: linear time, no backreferences); key = its
    number key, else its :func:`~app.answers.kinds.text_key`."""

    name = "regex"
    Params = RegexParams
    params: RegexParams

    def __init__(self, params: KindParams, prompt: str = "") -> None:
        super().__init__(params, prompt)
        self.compiled = compile_pattern(self.params.pattern, self.params.ignore_case)

    def extract(self, text: str) -> str | None:
        found = None
        for m in self.compiled.finditer(tail(text)):
            found = m.group(1)
            if self.params.match == "first":
                break
        return found

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
