"""The replay backend: serves recorded samples in place of vLLM, through the same engine loop.

Reads the replay JSONL schema (one problem per line: ``id``, ``question``, ``gold``, ``answers``,
``correct``, optional ``scores``, ``tokens``, ``logprobs``/``logprob``, ``texts``). For each problem
the recorded samples are shuffled once per seed; ``draw(n)`` hands out the next ``n`` of them, so
any prefix is an independent sample of that size. A problem has as many samples as were recorded:
callers cap each query at :meth:`ReplaySource.available`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.backends.base import Draw, DrawResult, SampleSource, SamplingRequest, Usage


class ReplayFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Problem:
    id: str
    question: str
    gold: str | None
    answers: tuple[str | None, ...]
    correct: tuple[bool, ...]
    scores: tuple[float, ...] | None = None
    tokens: tuple[int, ...] | None = None
    logprobs: tuple[float | None, ...] | None = None
    texts: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.answers)


def _optional(rec: dict[str, Any], names: Sequence[str], n: int, where: str) -> tuple[Any, ...] | None:
    for name in names:
        value = rec.get(name)
        if value is not None:
            if not isinstance(value, list) or len(value) != n:
                raise ReplayFormatError(f"{where}: '{name}' must be a list of {n} values")
            return tuple(value)
    return None


def parse_problem(rec: dict[str, Any], where: str) -> Problem:
    try:
        answers = rec["answers"]
        correct = rec["correct"]
        pid = str(rec["id"])
    except KeyError as exc:
        raise ReplayFormatError(f"{where}: missing field {exc.args[0]!r}") from None
    if not isinstance(answers, list) or not isinstance(correct, list) or len(answers) != len(correct):
        raise ReplayFormatError(f"{where}: 'answers' and 'correct' must be lists of equal length")
    n = len(answers)
    gold = rec.get("gold")
    return Problem(
        id=pid, question=str(rec.get("question", "")), gold=None if gold is None else str(gold),
        answers=tuple(None if a is None else str(a) for a in answers), correct=tuple(bool(c) for c in correct),
        scores=_optional(rec, ("scores",), n, where), tokens=_optional(rec, ("tokens",), n, where),
        logprobs=_optional(rec, ("logprobs", "logprob"), n, where), texts=_optional(rec, ("texts",), n, where),
        meta=rec.get("meta") or {},
    )


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
        pid = request.query_id or ""
        p = self.problems[pid]
        start = self._next.get(pid, 0)
        picked = self.order(pid)[start:start + n]
        self._next[pid] = start + len(picked)
        draws = []
        for i in picked:
            answer = p.answers[i]
            tokens = p.tokens[i] if p.tokens else 0
            if max_tokens is not None:
                tokens = min(tokens, max_tokens)
            text = p.texts[i] if p.texts else ("" if answer is None else f"The answer is {answer}.")
            draws.append(Draw(
                text=text, finish_reason="stop", tokens=tokens,
                logprob=p.logprobs[i] if p.logprobs else None,
                answer=answer, correct=p.correct[i], score=p.scores[i] if p.scores else None,
            ))
        usage = Usage(0, sum(d.tokens for d in draws))
        return DrawResult(draws, usage, backend="replay")
