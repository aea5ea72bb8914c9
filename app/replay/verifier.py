"""Verifiers for replay: ``--verifier none | ground_truth | scores | likelihood | code_tests``.

* ``ground_truth``: the service's ``reference`` verifier, which scores a recorded sample 1.0/0.0 from
  its recorded ``correct`` flag.
* ``scores``: :class:`RecordedScoreVerifier`, the recorded reward-model score of each sample. Scores
  already in [0, 1] are used as they are; a file with any score outside [0, 1] holds raw logits, and
  then every score goes through the logistic ``1 / (1 + exp(-x))`` (one rule per file, so the
  ordering of scores is kept).
* ``likelihood``: the service's ``likelihood`` verifier, ``exp(mean logprob * tokens)`` from the recorded
  ``logprobs`` and ``tokens`` of each sample.
* ``code_tests``: :class:`ReplayCodeVerifier`, the outcome of each sample's program on its problem's
  tests: ``passed / total`` (``score: fraction``, the default, as the live verifier's) or 1/0
  (``score: all``).

Code problems (:mod:`app.backends.replay`) are executed **once, before the runs**, by
:func:`execute_programs`: every distinct program of every problem runs its tests in the sandbox
through :class:`app.code.runner.CodeRunner` (the live service's classes; the sandbox bounds how many
run at once), and :meth:`CodeResults.correct` gives each sample's ``correct`` flag: its program passes
all its problem's tests (no program: wrong). The runs then look the outcomes up; no program runs twice.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.backends.base import Draw
from app.backends.replay import NO_PROGRAM, Problem
from app.code.runner import CodeRunner, TestOutcome
from app.sandbox import Sandbox, SandboxConfig
from app.verifiers import Verifier, VerifierError, VerifyContext, VerifyResult, create_verifier
from app.verifiers.base import VerifierParams, clamp01


class RecordedScoreVerifier(Verifier):
    """``Draw.score`` (recorded by the replay backend) as the verifier score."""

    name = "recorded_scores"

    def __init__(self, logits: bool = False) -> None:
        super().__init__()
        self.logits = logits

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        out: list[float] = []
        for d in candidates:
            if d.score is None:
                raise VerifierError(f"sample of query {ctx.request.query_id!r} has no recorded score")
            out.append(_logistic(d.score) if self.logits else clamp01(d.score))
        return VerifyResult(out)


def _logistic(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def scores_are_logits(problems: Sequence[Problem]) -> bool:
    """Whether any recorded score lies outside [0, 1] (then the file holds logits)."""
    return any(not 0.0 <= s <= 1.0 for p in problems for s in (p.scores or ()))


# --- code -----------------------------------------------------------------------------------------


def passes(outcome: TestOutcome | None) -> bool:
    """Every test passed (a program without tests, or without an outcome, is not correct)."""
    return outcome is not None and outcome.total > 0 and outcome.passed == outcome.total


@dataclass(slots=True)
class CodeResults:
    """``outcomes[problem_id][program]``: the tests' outcome of every distinct program of a code
    problem, executed once (:func:`execute_programs`); ``runner`` is what ran them."""

    runner: CodeRunner | None = None
    outcomes: dict[str, dict[str, TestOutcome]] = field(default_factory=dict)
    sandbox_errors: int = 0

    @property
    def programs(self) -> int:
        """Distinct (problem, program) pairs executed."""
        return sum(len(t) for t in self.outcomes.values())

    def correct(self, problem: Problem) -> tuple[bool, ...]:
        """Per sample of a code problem: whether its program passes all its tests."""
        table = self.outcomes.get(problem.id, {})
        return tuple(prog is not None and passes(table.get(prog)) for prog in problem.answers)


async def execute_programs(problems: Sequence[Problem], runner: CodeRunner, retries: int = 1) -> CodeResults:
    """Run every distinct program of every code problem on its tests, all concurrently (the sandbox
    runs ``max_concurrent`` at a time). A run that ends in ``sandbox_error`` (bwrap itself failed) is
    retried up to ``retries`` times, then counted in :attr:`CodeResults.sandbox_errors` (it scores
    what it passed: usually 0). Raises :class:`app.sandbox.SandboxUnavailable`."""
    results = CodeResults(runner)
    jobs = [(p, prog) for p in problems if p.tests is not None
            for prog in dict.fromkeys(a for a in p.answers if a is not None)]

    async def one(p: Problem, program: str) -> None:
        assert p.tests is not None
        outcome = await runner.run_tests(program, p.tests)
        for _ in range(retries):
            if outcome.status != "sandbox_error":
                break
            outcome = await runner.run_tests(program, p.tests)  # not cached: runs again
        results.sandbox_errors += outcome.status == "sandbox_error"
        results.outcomes.setdefault(p.id, {})[program] = outcome

    for p in problems:
        if p.tests is not None:
            results.outcomes.setdefault(p.id, {})
    await asyncio.gather(*(one(p, prog) for p, prog in jobs))
    return results


def code_runner(mode: str = "bwrap", concurrency: int | None = None, cache_size: int = 1 << 16) -> CodeRunner:
    """The runner replay executes programs with: the live service's sandbox and runner, ``mode``
    ``bwrap`` (or an explicit ``unsandboxed``), ``concurrency`` programs at once (default: one per core)."""
    config = SandboxConfig(mode=mode, max_concurrent=concurrency or os.cpu_count() or 1)
    return CodeRunner(Sandbox(config), cache_size=cache_size)


def code_stats(original: Sequence[Problem], executed: Sequence[Problem], results: CodeResults,
               timings: Mapping[str, float], since: tuple[int, int, float] = (0, 0, 0.0)) -> dict[str, float]:
    """The report's ``code`` numbers (:attr:`app.replay.evaluator.Report.code_stats`); ``original``
    and ``executed`` are the problems before and after :meth:`CodeResults.correct` replaced their flags;
    ``since``: the runner's ``(test_runs, behaviour_runs, sandbox_s)`` before this replay."""
    runner = results.runner
    assert runner is not None
    test_runs, behaviour_runs, sandbox_s = since
    mismatch = sum(a != b for p, q in zip(original, executed, strict=True) if p.tests is not None and p.correct_recorded
                   for a, b in zip(p.correct, q.correct, strict=True))
    return {"problems": float(len(results.outcomes)), "programs": float(results.programs),
            "test_runs": float(runner.test_runs - test_runs),
            "behaviour_runs": float(runner.behaviour_runs - behaviour_runs),
            "sandbox_s": runner.sandbox_s - sandbox_s, "tests_s": timings.get("execute_s", 0.0),
            "keys_s": timings.get("keys_s", 0.0),
            "concurrency": float(runner.sandbox.config.max_concurrent),
            "sandbox_errors": float(results.sandbox_errors), "recorded_mismatch": float(mismatch)}


class ReplayCodeParams(VerifierParams):
    score: Literal["fraction", "all"] = "fraction"


class ReplayCodeVerifier(Verifier):
    """The ``code_tests`` score of a replayed sample: its program (``Draw.answer``, formed by the
    replay backend) looked up in :class:`CodeResults`; a program not found there (none should be) is
    run through the results' runner (cached); no program scores 0."""

    name = "code_tests"
    Params = ReplayCodeParams

    def __init__(self, results: CodeResults | None, params: VerifierParams | None = None) -> None:
        super().__init__(params)
        self.results = results

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        params = self.params
        assert isinstance(params, ReplayCodeParams)
        pid = ctx.request.query_id or ""
        if self.results is None or pid not in self.results.outcomes:
            raise VerifierError(f"problem {pid!r} has no executed tests (code_tests needs 'tests' on every problem)")
        table = self.results.outcomes[pid]
        out: list[float] = []
        for d in candidates:
            program = d.answer
            if program is None or program == NO_PROGRAM:
                out.append(0.0)
                continue
            outcome = table.get(program)
            if outcome is None:
                if self.results.runner is None or ctx.tests is None:
                    raise VerifierError(f"a program of problem {pid!r} was not executed up front")
                outcome = table[program] = await self.results.runner.run_tests(program, ctx.tests)
            out.append(outcome.fraction if params.score == "fraction" else float(passes(outcome)))
        return VerifyResult(out)


def make_verifier(mode: str, logits: bool = False, *, params: Mapping[str, Any] | None = None,
                  code: CodeResults | None = None) -> Verifier | None:
    """The verifier of a replay mode (``none`` -> ``None``); ``params`` only for ``code_tests``
    (whose outcomes are ``code``) and ``likelihood`` (``temperature``); ``pydantic.ValidationError``
    when bad."""
    if params and mode not in ("code_tests", "likelihood"):
        raise ValueError(f"verifier params apply to code_tests and likelihood only, not {mode!r}")
    if mode == "none":
        return None
    if mode == "ground_truth":
        return create_verifier("reference")
    if mode == "scores":
        return RecordedScoreVerifier(logits)
    if mode == "likelihood":
        return create_verifier("likelihood", params)
    if mode == "code_tests":
        return ReplayCodeVerifier(code, ReplayCodeParams.model_validate(dict(params or {})))
    raise ValueError(f"unknown replay verifier {mode!r}")
