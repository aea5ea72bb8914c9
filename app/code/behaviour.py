"""Behaviour of a candidate program: what it returns on the calls its prompt shows.

Two programs that return the same thing on the same inputs behave alike, whatever their text;
:func:`doctest_calls` finds such inputs in the prompt (the ``>>> f(...)`` lines of its docstrings)
and :func:`build_behaviour_script` runs them, so candidates can be grouped by behaviour (see
:meth:`app.code.runner.CodeRunner.behaviour`).

The script prints ``MARKER`` and a JSON list with one entry per call: ``repr(result)`` (at most
:data:`MAX_REPR_CHARS`, memory addresses ``0x...`` replaced by ``0x?`` so default reprs compare
equal across runs), or ``"!ExceptionType"`` when the call raised (``"!Timeout"`` past the per-call
alarm). ``random`` is reseeded with 0 before each call and the hash seed is fixed by the sandbox, so
a deterministic-in-spirit program gives the same outputs every run. Nothing is printed when the
program itself fails to run. Same trust model as :mod:`app.code.harness`.
"""

from __future__ import annotations

import ast
import re

from app.code.harness import prelude

MAX_CALLS = 32
MAX_CALL_CHARS = 1000
MAX_REPR_CHARS = 1000
MAX_PROMPT_CHARS = 64 * 1024  # longer prompts are not parsed, only scanned for >>> lines
MARKER = "@@ttc-behaviour@@ "

_PROMPT_LINE = re.compile(r"^[ \t]*>>>[ \t]+(.+?)[ \t]*$", re.M)


def doctest_calls(prompt: str, *, limit: int = MAX_CALLS) -> list[str]:
    """The call expressions of ``>>> `` lines in ``prompt``'s docstrings, deduplicated, in order.

    Only single-line expressions that contain a call and are at most ``MAX_CALL_CHARS`` long
    (statements such as ``>>> x = f(1)`` and ``...`` continuations are skipped); at most ``limit``.
    When the prompt does not parse (a fragment) or is over 64 KiB, its raw ``>>>`` lines are used.
    """
    calls: list[str] = []
    for doc in _docstrings(prompt):
        for m in _PROMPT_LINE.finditer(doc):
            expr = m.group(1)
            if len(calls) >= limit:
                return calls
            if len(expr) <= MAX_CALL_CHARS and expr not in calls and _is_call_expression(expr):
                calls.append(expr)
    return calls


def build_behaviour_script(program: str, calls: list[str], *, call_timeout_s: float = 2.0) -> str:
    """A script that runs ``program``, then each of ``calls`` (expressions), and prints the outputs."""
    return prelude(program, call_timeout_s) + _BEHAVIOUR_MAIN.format(
        calls=list(calls)[:MAX_CALLS], marker=MARKER, max_repr=MAX_REPR_CHARS
    )


def _docstrings(prompt: str) -> list[str]:
    if len(prompt) > MAX_PROMPT_CHARS:
        return [prompt]
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [prompt]
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                docs.append(doc)
    return docs


def _is_call_expression(expr: str) -> bool:
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(n, ast.Call) for n in ast.walk(tree))


_BEHAVIOUR_MAIN = '''
import random, re

CALLS = {calls!r}
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _output(expr, ns):
    try:
        try:
            arm()
            random.seed(0)
            value = eval(expr, ns)
            text = repr(value)
        finally:
            disarm()
    except Timeout:
        return "!Timeout"
    except BaseException as e:
        return "!" + type(e).__name__
    return _ADDRESS.sub("0x?", text[:{max_repr!r}])


ns = run_program()
if ns is not None:
    outputs = [_output(c, ns) for c in CALLS]
    emit({marker!r} + json.dumps(outputs))
os._exit(0)
'''
