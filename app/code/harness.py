"""Unit tests for candidate programs: what a request supplies and the script that runs them.

:class:`CodeTests` is the request's tests: ``asserts`` (source with top-level ``assert``
statements, or a list of such sources) and/or a HumanEval-style ``check`` (source defining
``check(candidate)``) with the ``entry_point`` it is called with, plus an optional ``prompt`` (the
code prefix that completions continue).

:func:`build_test_script` turns a candidate program and the tests into one self-contained script
for :class:`app.sandbox.Sandbox`. What a *test* is:

* ``asserts``: every top-level statement that contains an ``assert`` (an ``assert``, or e.g. a
  ``for`` loop of asserts); the other top-level statements (imports, helpers) are setup, run in
  order before the tests that follow them.
* ``check``: every statement of ``check``'s body that contains an ``assert``, run after the
  non-assert statements that precede it, with ``candidate`` bound to the entry point (looked up in
  the candidate's namespace; missing means every test fails). The rest of the check source (e.g.
  HumanEval's ``METADATA``) is module-level setup.
* ``assert <truthy constant>`` (HumanEval's ``assert True, "..."``) cannot fail and is dropped.

The script runs the program as module ``candidate`` (so ``if __name__ == "__main__":`` blocks do
not run; ``exit``/``quit`` are provided), with ``print`` output discarded, and each test and
setup statement under its own wall-clock alarm (``test_timeout_s``). Tests run in the candidate's
namespace, in order (as HumanEval does); each is wrapped so that any exception, the alarm included,
fails that test only. After the program and after every test the script writes
``MARKER {"passed": p, "total": t}`` to the original stdout: the last such line is the score, and a
run killed half way (CPU limit, crash, ``os._exit``) still scores the tests it passed before. A
program that fails to even define things (syntax error, exception at import) scores 0 of t.

Trust: the tests are request input, trusted to mean what they say but bounded (64 KiB per source,
200 tests) and only parsed with ``ast`` on the host, never executed there. The candidate shares the
process with the harness, so a hostile candidate can make the harness report any score for *itself*
(write a fake marker line, patch the callbacks, exit early) — the scores of other candidates, the
host and the service are out of its reach (see :mod:`app.sandbox`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

MAX_SOURCE_CHARS = 64 * 1024
MAX_TESTS = 200
MARKER = "@@ttc-tests@@ "
CHECK_NAME = "check"

Source = Annotated[str, Field(max_length=MAX_SOURCE_CHARS)]


class CodeTests(BaseModel):
    """The tests a request supplies for the ``code_tests`` verifier."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    asserts: Source | Annotated[list[Source], Field(min_length=1, max_length=MAX_TESTS)] | None = Field(
        None, description="Python source whose top-level assert statements are the tests, or a list of such sources"
    )
    check: Source | None = Field(
        None, description="HumanEval-style source defining check(candidate); each assert in its body is one test"
    )
    entry_point: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=200,
        description="the function check() is called with (required with check)",
    )
    prompt: Source | None = Field(
        None, description="code prefix that completion-style samples continue (HumanEval's prompt)"
    )
    _plan: CompiledTests | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _consistent(self) -> CodeTests:
        if self.asserts is None and self.check is None:
            raise ValueError("tests need asserts or check")
        if self.check is not None and self.entry_point is None:
            raise ValueError("check needs entry_point (the function it tests)")
        self._plan = _compile(self)  # raises ValueError for unparsable tests
        total = self._plan.total
        if total == 0:
            raise ValueError("the tests contain no assert statement")
        if total > MAX_TESTS:
            raise ValueError(f"at most {MAX_TESTS} tests, got {total}")
        return self

    def sources(self) -> list[str]:
        """The ``asserts`` sources as a list."""
        if self.asserts is None:
            return []
        return [self.asserts] if isinstance(self.asserts, str) else list(self.asserts)


@dataclass(frozen=True, slots=True)
class CompiledTests:
    """The tests compiled for the harness: ``module`` is source to exec in the candidate's namespace."""

    module: str
    total: int


def plan_tests(tests: CodeTests) -> CompiledTests:
    """The tests split and wrapped for the harness (see the module docstring); compiled once, when
    ``tests`` was validated."""
    return tests._plan if tests._plan is not None else _compile(tests)


def _compile(tests: CodeTests) -> CompiledTests:
    body: list[ast.stmt] = []
    counter = [0]
    for i, src in enumerate(tests.sources()):
        body += _wrap_all(_parse(src, f"asserts[{i}]" if isinstance(tests.asserts, list) else "asserts"), counter)
    if tests.check is not None:
        module = _parse(tests.check, "check")
        defs = [s for s in module if isinstance(s, ast.FunctionDef) and s.name == CHECK_NAME]
        if not defs:
            raise ValueError("check must define a function check(candidate)")
        check = defs[-1]
        body += _wrap_all([s for s in module if s is not check], counter)
        fn = ast.FunctionDef(
            name="_ttc_check", args=check.args, body=_wrap_all(check.body, counter) or [ast.Pass()],
            decorator_list=[], returns=None, type_comment=None,
        )
        call = f"try:\n    _ttc_check(globals().get({tests.entry_point!r}))\nexcept BaseException:\n    pass\n"
        body += [fn, *ast.parse(call).body]
    try:
        module_ast = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
        return CompiledTests(ast.unparse(module_ast), counter[0])
    except RecursionError:
        raise ValueError("the tests nest too deeply") from None


def build_test_script(program: str, tests: CodeTests, *, test_timeout_s: float = 3.0) -> str:
    """A script that runs ``program`` and then each test; its last ``MARKER`` line is the score."""
    plan = plan_tests(tests)
    return prelude(program, test_timeout_s) + _TESTS_MAIN.format(tests=plan.module, total=plan.total, marker=MARKER)


def prelude(program: str, limit_s: float) -> str:
    """The common start of a runner script: helpers (alarm, output sink) and ``run_program()``,
    which runs ``program`` as module ``candidate`` and returns its namespace, or None on failure."""
    return _PRELUDE.format(program=program, limit=float(limit_s))


def _parse(source: str, field: str) -> list[ast.stmt]:
    try:
        return ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ValueError(f"{field} is not valid Python: {e}") from None


def _is_test(stmt: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(stmt))


def _trivial(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant) and bool(stmt.test.value)


def _wrap_all(stmts: list[ast.stmt], counter: list[int]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for s in stmts:
        if _trivial(s):
            continue
        test = _is_test(s)
        counter[0] += test
        out += _wrap([s], test=test)
    return out


def _wrap(stmts: list[ast.stmt], *, test: bool) -> list[ast.stmt]:
    """``stmts`` under the alarm, any exception swallowed; a test also records whether it passed."""
    template = _TEST_BLOCK if test else _SETUP_BLOCK
    wrapped = ast.parse(template).body
    inner = next(n for n in ast.walk(wrapped[1 if test else 0]) if isinstance(n, ast.Try) and n.finalbody)
    inner.body[1:2] = stmts  # replace the placeholder after _ttc_arm()
    return wrapped


_SETUP_BLOCK = """
try:
    try:
        _ttc_arm()
        pass
    finally:
        _ttc_disarm()
except BaseException:
    pass
"""

_TEST_BLOCK = """
_ttc_ok = False
try:
    try:
        _ttc_arm()
        pass
        _ttc_ok = True
    finally:
        _ttc_disarm()
except BaseException:
    pass
_ttc_record(_ttc_ok)
"""

_PRELUDE = '''\
import io, json, os, signal, sys, types

PROGRAM = {program!r}
LIMIT = {limit!r}
OUT = os.dup(1)
_armed = False


class Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    if _armed:
        raise Timeout()


def arm():
    global _armed
    _armed = True
    signal.setitimer(signal.ITIMER_REAL, LIMIT)


def disarm():
    global _armed
    _armed = False
    signal.setitimer(signal.ITIMER_REAL, 0)


def emit(line):
    os.write(OUT, (line + "\\n").encode("utf-8", "replace"))


class _Sink(io.TextIOBase):
    def write(self, s):
        return len(s)


def run_program():
    signal.signal(signal.SIGALRM, _on_alarm)
    module = types.ModuleType("candidate")
    sys.modules["candidate"] = module
    ns = module.__dict__
    ns.update(exit=sys.exit, quit=sys.exit)
    sys.stdout = sys.stderr = _Sink()
    sys.stdin = io.StringIO("")
    try:
        try:
            arm()
            exec(compile(PROGRAM, "candidate.py", "exec"), ns)
        finally:
            disarm()
    except BaseException:
        return None
    return ns
'''

_TESTS_MAIN = '''
TESTS = {tests!r}
TOTAL = {total!r}
_passed = 0


def report():
    emit({marker!r} + json.dumps({{"passed": _passed, "total": TOTAL}}))


def record(ok):
    global _passed
    _passed += ok is True
    report()


report()
ns = run_program()
if ns is not None:
    ns.update(_ttc_arm=arm, _ttc_disarm=disarm, _ttc_record=record)
    try:
        exec(compile(TESTS, "tests.py", "exec"), ns)
    except BaseException:
        pass
    report()
os._exit(0)
'''
