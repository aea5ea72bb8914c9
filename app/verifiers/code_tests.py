"""Code-tests verifier: run each candidate program's unit tests in the sandbox.

``score = passed / total`` (``score: fraction``) or ``1.0`` when every test passes, else ``0.0``
(``score: all``). The tests come from the request (``ctx.tests``, a :class:`app.code.CodeTests`)
and run through the app's :class:`app.code.CodeRunner` (``ctx.code``): one sandboxed process per
distinct candidate program, all candidates concurrently (the sandbox bounds how many run at once),
results cached per (program, tests).

Programs are formed by :func:`app.code.form_program` (``program: auto | completion | chat``) with the
prefix ``ctx.tests.prompt``, else the request's prompt when it is a completion request (a chat
request's messages are prose, not code). A candidate with no extractable program scores 0, as does
one whose run hit a sandbox error (logged). Costs no tokens. The programs take the turns of the
request's key (``ctx.owner``) in the sandbox; a full queue fails the request (429 for the key's own
queue, 503 for everyone's, :mod:`app.sandbox`) and stops its other programs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Literal

from app.backends.base import Draw
from app.code.extract import form_program
from app.sandbox import SandboxUnavailable
from app.verifiers.base import Verifier, VerifierError, VerifierParams, VerifyContext, VerifyResult


class CodeTestsParams(VerifierParams):
    score: Literal["fraction", "all"] = "fraction"
    program: Literal["auto", "completion", "chat"] = "auto"


class CodeTestsVerifier(Verifier):
    """Scores each candidate by the request's unit tests, executed in the sandbox."""

    name = "code_tests"
    Params = CodeTestsParams
    needs_tests = True

    async def score(self, ctx: VerifyContext, candidates: Sequence[Draw]) -> VerifyResult:
        params = self.params
        assert isinstance(params, CodeTestsParams)
        tests, runner = ctx.tests, ctx.code
        if tests is None:
            raise VerifierError(
                "the code_tests verifier needs tests for this query (asserts, or check with entry_point)"
            )
        if runner is None:
            raise VerifierError("the code_tests verifier needs the code runner, and this service has none configured")
        prefix = tests.prompt
        if prefix is None and ctx.request.kind == "completion":
            prefix = ctx.request.prompt
        programs = [
            form_program(d.text, prompt=prefix, mode=params.program, entry_point=tests.entry_point)
            for d in candidates
        ]
        distinct = list(dict.fromkeys(p for p in programs if p is not None))
        runs = [asyncio.ensure_future(runner.run_tests(p, tests, ctx.owner)) for p in distinct]
        try:
            try:
                outcomes = await asyncio.gather(*runs)
            finally:
                for run in runs:  # when one failed (a full sandbox queue: 429/503), the others stop too
                    run.cancel()
        except SandboxUnavailable as e:
            raise VerifierError(
                f"the code_tests verifier cannot run programs: {e}. Install bubblewrap, or set "
                "sandbox.mode: unsandboxed explicitly"
            ) from e
        by_program: dict[str, float] = {}
        for program, outcome in zip(distinct, outcomes, strict=True):
            if params.score == "all":
                by_program[program] = 1.0 if outcome.total and outcome.passed == outcome.total else 0.0
            else:
                by_program[program] = outcome.fraction
        return VerifyResult([by_program[p] if p is not None else 0.0 for p in programs])
