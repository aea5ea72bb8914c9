"""The replay backend: serves recorded samples in place of vLLM, through the same engine loop.

Reads the replay JSONL schema (one problem per line: ``id``, ``question``, ``gold``, ``answers``,
``correct``, optional ``scores``, ``tokens``, ``logprobs``/``logprob``, ``texts``, ``traces``). For each problem
the recorded samples are shuffled once per seed; ``draw(n)`` hands out the next ``n`` of them, so
any prefix is an independent sample of that size. A problem has as many samples as were recorded:
callers cap each query at :meth:`ReplaySource.available`.

**Code problems** carry ``tests`` (the request's ``ttc.tests`` shape, :class:`~app.code.harness.CodeTests`:
``asserts``, or ``check`` with ``entry_point``, optional ``prompt``), optionally a top-level
``entry_point`` (filled into ``tests`` when it has none) and ``program``: ``completion`` |
``chat`` | ``auto`` (default), how a program is formed from a sample by
:func:`~app.code.extract.form_program`:

* ``completion`` (HumanEval style): the prefix followed by the sample;
* ``chat``: the program in the sample's code fence (else the whole sample when it parses), after
  ``tests.prompt`` when one is given;
* ``auto``: chat when the sample is fenced or defines the entry point, else completion.

The prefix is ``tests.prompt`` when given, else (``completion``/``auto``) the ``question``, which
then holds the prompt code. Each sample's text is in ``texts`` (the completion or the chat answer;
when ``texts`` is absent, ``answers`` is read as the texts); ``answers`` is otherwise ignored.
``correct`` is optional: the truth for a code problem is whether its program passes every test,
which the replay evaluator executes (:mod:`app.replay.verifier`); a recorded list is kept only to
be compared with it (:attr:`Problem.correct_recorded`). Parsed, a code problem's
:attr:`Problem.answers` holds each sample's *program* (``None``: no program could be formed), so
answer keys and votes work on programs, and :attr:`Problem.texts` the sample texts as recorded.

**Traces** (``traces``, with ``meta.trace_top_k``): per sample its token confidences ``C_t`` over the
top ``k`` alternatives of each token, one byte per token (:func:`app.confidence.encode_trace`), as the
service records them when a request asks for top log-probs. A request asking for top-``k`` log-probs
(``deepconf``'s trace monitor) gets each sample's trace as its log-probs, and a request asking the
engine to cut its traces (``SamplingRequest.cut``) has each sample cut at the token where the engine's
monitor would cut it (the same window, :func:`ttc_monitor.window.first_cut`). A request asking for a
``k`` the file was not recorded with, or for traces a file does not have, is an error
(:func:`check_traces`), never a silent replay of something else. On the simulated clock a cut sample
is delivered at its last token.

The source serves a code sample as ``Draw(text=<sample text>, answer=<program>)``; a sample
without a program gets ``answer=""`` (:data:`NO_PROGRAM`), not ``None``, so the engine does not
extract another program from the text, and keys to ``None`` (no vote; see
:meth:`app.replay.keys.ReplayKeys.known`).
"""

from __future__ import annotations

import binascii
import json
import math
import random
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import ValidationError
from ttc_monitor.window import first_cut

from app.backends.base import Draw, DrawResult, Progress, SampleSource, SamplingRequest, StreamItem, Usage
from app.code.extract import form_program
from app.code.harness import CodeTests
from app.confidence import decode_trace, trace_logprobs

ProgramMode = Literal["auto", "completion", "chat"]
PROGRAM_MODES: tuple[str, ...] = get_args(ProgramMode)
NO_PROGRAM = ""
"""``Draw.answer`` of a code sample without a program (never a program: those are non-blank)."""


class ReplayFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Problem:
    """One recorded problem. ``tests`` (and ``program``) make it a code problem (module doc);
    ``correct_recorded`` is False when its ``correct`` flags are placeholders (all False) that the
    evaluator replaces by executed outcomes."""

    id: str
    question: str
    gold: str | None
    answers: tuple[str | None, ...]
    correct: tuple[bool, ...]
    scores: tuple[float, ...] | None = None
    tokens: tuple[int, ...] | None = None
    logprobs: tuple[float | None, ...] | None = None
    texts: tuple[str, ...] | None = None
    traces: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    tests: CodeTests | None = None
    program: ProgramMode = "auto"
    correct_recorded: bool = True

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def prefix(self) -> str | None:
        """The code that completion-style samples continue (see the module doc)."""
        return program_prefix(self.tests, self.program, self.question)


def program_prefix(tests: CodeTests | None, program: ProgramMode, question: str) -> str | None:
    """``tests.prompt`` when given; else the question, except for chat samples (prose questions)."""
    if tests is not None and tests.prompt is not None:
        return tests.prompt
    return None if program == "chat" else question


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v))


# What each optional per-sample field holds: (check of one value, how the error says it).
_FIELDS: dict[str, tuple[Any, str]] = {
    "tokens": (_is_count, "non-negative integers"),
    "scores": (_is_number, "finite numbers or nulls"),
    "logprobs": (_is_number, "finite numbers or nulls"),
    "logprob": (_is_number, "finite numbers or nulls"),
}


def _optional(rec: dict[str, Any], names: Sequence[str], n: int, where: str) -> tuple[Any, ...] | None:
    """The first of ``names`` that ``rec`` has, as a tuple of ``n`` values checked by :data:`_FIELDS`."""
    for name in names:
        value = rec.get(name)
        if value is not None:
            if not isinstance(value, list) or len(value) != n:
                raise ReplayFormatError(f"{where}: '{name}' must be a list of {n} values")
            check, what = _FIELDS.get(name, (None, ""))
            if check is not None:
                bad = next((i for i, v in enumerate(value) if not check(v)), None)
                if bad is not None:
                    raise ReplayFormatError(f"{where}: '{name}' must hold {what} (item {bad} is "
                                            f"{json.dumps(value[bad])[:40]})")
            return tuple(value)
    return None


def _flags(value: Any, n: int, where: str) -> tuple[bool, ...]:
    """``correct``: a list of ``n`` JSON booleans (``"false"`` or ``0`` is an error, not a guess)."""
    if not isinstance(value, list) or len(value) != n:
        raise ReplayFormatError(f"{where}: 'answers' and 'correct' must be lists of equal length")
    bad = next((i for i, c in enumerate(value) if not isinstance(c, bool)), None)
    if bad is not None:
        raise ReplayFormatError(f"{where}: 'correct' must hold booleans, true or false (item {bad} is "
                                f"{json.dumps(value[bad])[:40]})")
    return tuple(value)


def parse_problem(rec: dict[str, Any], where: str) -> Problem:
    """One record as a :class:`Problem`; a :class:`ReplayFormatError` naming ``where`` (file:line)
    and the field for anything malformed."""
    if not isinstance(rec, dict):
        raise ReplayFormatError(f"{where}: a problem must be a JSON object")
    if rec.get("tests") is not None:
        return _code_problem(rec, where)
    for name in ("entry_point", "program"):
        if rec.get(name) is not None:
            raise ReplayFormatError(f"{where}: '{name}' only applies to a problem with 'tests'")
    try:
        answers = rec["answers"]
        correct = rec["correct"]
        pid = str(rec["id"])
    except KeyError as exc:
        raise ReplayFormatError(f"{where}: missing field {exc.args[0]!r}") from None
    if not isinstance(answers, list):
        raise ReplayFormatError(f"{where}: 'answers' must be a list")
    n = len(answers)
    flags = _flags(correct, n, where)
    gold = rec.get("gold")
    return Problem(
        id=pid, question=str(rec.get("question", "")), gold=None if gold is None else str(gold),
        answers=tuple(None if a is None else str(a) for a in answers), correct=flags,
        scores=_optional(rec, ("scores",), n, where), tokens=_optional(rec, ("tokens",), n, where),
        logprobs=_optional(rec, ("logprobs", "logprob"), n, where), texts=_optional(rec, ("texts",), n, where),
        traces=_traces(rec, n, where), meta=rec.get("meta") or {},
    )


def _code_problem(rec: dict[str, Any], where: str) -> Problem:
    if "id" not in rec:
        raise ReplayFormatError(f"{where}: missing field 'id'")
    tests = parse_tests(rec.get("tests"), rec.get("entry_point"), where)
    program = rec.get("program") or "auto"
    if program not in PROGRAM_MODES:
        raise ReplayFormatError(f"{where}: 'program' must be one of {', '.join(PROGRAM_MODES)}, got {program!r}")
    name = "texts" if rec.get("texts") is not None else "answers"
    raw_texts = rec.get(name)
    if raw_texts is None:
        raise ReplayFormatError(f"{where}: a problem with 'tests' needs 'texts' (each sample's program or completion)")
    texts = _strings(raw_texts, name, None, where)
    n = len(texts)
    if name == "texts" and rec.get("answers") is not None:
        _strings(rec["answers"], "answers", n, where)  # the same text or null: checked, not used
    correct = rec.get("correct")
    if correct is not None and (not isinstance(correct, list) or len(correct) != n
                                or not all(isinstance(c, bool) for c in correct)):
        raise ReplayFormatError(f"{where}: 'correct' must be a list of {n} booleans (or absent)")
    gold = rec.get("gold")
    mode = cast(ProgramMode, program)
    question = str(rec.get("question", ""))
    prefix = program_prefix(tests, mode, question)
    formed: dict[str | None, str | None] = {None: None}  # one program per distinct text
    for t in texts:
        if t is not None and t not in formed:
            formed[t] = form_program(t, prompt=prefix, mode=mode, entry_point=tests.entry_point)
    return Problem(
        id=str(rec["id"]), question=question, gold=None if gold is None else str(gold),
        answers=tuple(formed[t] for t in texts), correct=tuple(correct) if correct is not None else (False,) * n,
        scores=_optional(rec, ("scores",), n, where), tokens=_optional(rec, ("tokens",), n, where),
        logprobs=_optional(rec, ("logprobs", "logprob"), n, where),
        texts=tuple("" if t is None else t for t in texts), traces=_traces(rec, n, where),
        meta=rec.get("meta") or {}, tests=tests, program=mode, correct_recorded=correct is not None,
    )


def _traces(rec: dict[str, Any], n: int, where: str) -> tuple[str, ...] | None:
    """``traces``: per sample its token confidences (:func:`app.confidence.encode_trace`) over
    ``meta.trace_top_k`` alternatives per token."""
    traces = _optional(rec, ("traces",), n, where)
    if traces is None:
        return None
    top_k = (rec.get("meta") or {}).get("trace_top_k")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ReplayFormatError(f"{where}: 'traces' needs 'meta.trace_top_k' (the alternatives per token)")
    for t in traces:
        try:
            if not isinstance(t, str):
                raise ValueError
            binascii.a2b_base64(t, strict_mode=True)
        except (ValueError, binascii.Error):
            raise ReplayFormatError(f"{where}: 'traces' must be base64 strings, one byte per token") from None
    return traces


def parse_tests(value: Any, entry_point: Any, where: str) -> CodeTests:
    """A record's ``tests`` object, with the record's ``entry_point`` filled in where it has none."""
    if not isinstance(value, dict):
        raise ReplayFormatError(f"{where}: 'tests' must be an object with 'asserts', or 'check' and 'entry_point'")
    data = dict(value)
    if entry_point is not None:
        if not isinstance(entry_point, str):
            raise ReplayFormatError(f"{where}: 'entry_point' must be a string")
        if data.get("entry_point") is None:
            data["entry_point"] = entry_point
        elif data["entry_point"] != entry_point:
            raise ReplayFormatError(f"{where}: 'entry_point' {entry_point!r} differs from 'tests.entry_point' "
                                    f"{data['entry_point']!r}")
    try:
        return CodeTests.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in ("tests", *first.get("loc", ())))
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise ReplayFormatError(f"{where}: '{loc}': {msg}") from None


def _strings(value: Any, name: str, n: int | None, where: str) -> list[str | None]:
    if not isinstance(value, list) or (n is not None and len(value) != n) \
            or not all(v is None or isinstance(v, str) for v in value):
        size = "" if n is None else f"{n} "
        raise ReplayFormatError(f"{where}: '{name}' must be a list of {size}strings or nulls")
    return value


def load_problems(path: str | Path) -> list[Problem]:
    """Load a replay file; a clear :class:`ReplayFormatError` (file:line) for anything malformed."""
    problems: list[Problem] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReplayFormatError(f"{where}: not JSON ({exc.msg})") from None
            problem = parse_problem(rec, where)
            if problem.id in seen:
                raise ReplayFormatError(f"{where}: duplicate id {problem.id!r}")
            seen.add(problem.id)
            problems.append(problem)
    if not problems:
        raise ReplayFormatError(f"{path}: no problems")
    return problems


class ReplaySource(SampleSource):
    """A :class:`~app.backends.base.SampleSource` over recorded samples (``request.query_id`` picks
    the problem). ``inline = True`` tells the engine draws complete immediately (no I/O)."""

    inline = True

    def __init__(self, problems: Iterable[Problem], seed: int) -> None:
        self.problems = {p.id: p for p in problems}
        self.seed = seed
        self._order: dict[str, list[int]] = {}
        self._next: dict[str, int] = {}

    def why_not_cutting(self, model: str) -> str | None:
        """Recorded traces are cut where the engine would have cut them (see the module doc)."""
        return None

    def available(self, problem_id: str) -> int:
        return self.problems[problem_id].n

    def order(self, problem_id: str) -> list[int]:
        order = self._order.get(problem_id)
        if order is None:
            order = list(range(self.problems[problem_id].n))
            random.Random(f"{self.seed}:{problem_id}").shuffle(order)
            self._order[problem_id] = order
        return order

    async def draw(self, request: SamplingRequest, n: int, *, seed: int | None = None,
                   max_tokens: int | None = None) -> DrawResult:
        draws = self._next_samples(request, n, max_tokens)
        return DrawResult(draws, Usage(0, sum(d.tokens for d in draws)), backend="replay")

    def stream(self, request: SamplingRequest, n: int, progress: Progress, *, seed: int | None = None,
               max_tokens: int | None = None) -> AsyncIterator[StreamItem]:
        """As :meth:`draw`, each sample yielded on its own."""
        return self._stream(request, n, max_tokens)

    async def _stream(self, request: SamplingRequest, n: int, max_tokens: int | None) -> AsyncIterator[StreamItem]:
        for draw in self._next_samples(request, n, max_tokens):
            yield draw
        yield Usage(0, 0)

    def _next_samples(self, request: SamplingRequest, n: int, max_tokens: int | None) -> list[Draw]:
        """The problem's next ``n`` recorded samples, each with its token-confidence trace as its
        log-probs when the request asks for top log-probs per token, and cut where the engine's
        monitor would have cut it when the request asks for that (``finish_reason: "cut"``, no answer;
        the tokens up to and including that one generated and billed). A sample longer than
        ``max_tokens`` stops there: ``finish_reason: "length"``, so it does not vote."""
        pid = request.query_id or ""
        p = self.problems[pid]
        top_k = asked_top_k(request)
        if top_k is not None:
            check_traces(p, top_k)
        start = self._next.get(pid, 0)
        picked = self.order(pid)[start:start + n]
        self._next[pid] = start + len(picked)
        code = p.tests is not None
        out = []
        for i in picked:
            answer = p.answers[i]
            tokens = p.tokens[i] if p.tokens else 0
            finish = "stop"
            if max_tokens is not None and tokens > max_tokens:
                tokens, finish = max_tokens, "length"
            text = p.texts[i] if p.texts else ("" if answer is None else f"The answer is {answer}.")
            if code and answer is None:
                answer = NO_PROGRAM
            trace = decode_trace(p.traces[i])[:tokens] if top_k is not None and p.traces else None
            cut = request.cut
            at = None if cut is None or cut.threshold is None or trace is None else \
                first_cut(trace, cut.window, cut.threshold)
            if trace is not None and at is not None:
                kept = trace[:at + 1]
                out.append(Draw(text="", finish_reason="cut", tokens=at + 1,
                                logprobs=trace_logprobs(kept, request.kind), correct=False))
                continue
            out.append(Draw(
                text=text, finish_reason=finish, tokens=tokens,
                logprob=p.logprobs[i] if p.logprobs else None,
                logprobs=None if trace is None else trace_logprobs(trace, request.kind),
                answer=answer, correct=p.correct[i], score=p.scores[i] if p.scores else None,
            ))
        return out


def asked_top_k(request: SamplingRequest) -> int | None:
    """The alternatives per token a request asks log-probs for (chat ``top_logprobs``, completion
    ``logprobs`` as a number), ``None`` when it asks for none."""
    k = request.params.get("top_logprobs" if request.kind == "chat" else "logprobs")
    return k if isinstance(k, int) and not isinstance(k, bool) and k > 0 else None


def check_traces(p: Problem, top_k: int) -> None:
    """A policy reading top-``k`` confidences per token (``deepconf``) needs traces recorded over
    ``k`` alternatives: anything else would replay a different measure without saying so."""
    if p.traces is None:
        raise ReplayFormatError(f"problem {p.id!r}: the policy reads top-{top_k} log-probs per token and this "
                                "file records no 'traces' (record with top_logprobs, as `make demo-data` does)")
    recorded = p.meta.get("trace_top_k")
    if recorded != top_k:
        raise ReplayFormatError(f"problem {p.id!r}: the policy reads top-{top_k} log-probs per token; the "
                                f"traces were recorded over top-{recorded} (set the policy's top_k to {recorded})")
