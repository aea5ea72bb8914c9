"""Replay for code: the record format, ``--verifier code_tests`` and the HumanEval-derived set.

The sandboxed tests build a small set with ``scripts/make_code_replay.py``'s functions (a few
HumanEval problems, the canonical completion, its ``ast.unparse`` rewrite and three mutants each)
and replay it end to end; whether a sample is correct is what executing it says.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from app.backends.base import Draw, SamplingRequest
from app.backends.replay import NO_PROGRAM, Problem, ReplayFormatError, ReplaySource, load_problems, parse_problem
from app.code import CodeRunner
from app.code.harness import CodeTests
from app.replay.evaluator import ReplayConfigError, code_runner, default_answer, evaluate, resolve_policy
from app.replay.verifier import CodeResults, ReplayCodeParams, ReplayCodeVerifier, execute_programs
from app.sandbox import Sandbox, SandboxConfig
from app.verifiers import VerifyContext
from tests.support.sandboxes import ready_sandbox

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("HumanEval/0", "HumanEval/2", "HumanEval/3", "HumanEval/7")
# per problem: canonical x3, rewritten x1, mutants 0, 1, 0, 2 (the first mutant is the systematic one)
LAYOUT = ("canonical", 0, "canonical", "rewritten", 1, 0, 2, "canonical")
FENCE = "```"


@pytest.fixture(scope="module")
def gen() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_code_replay
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    yield make_code_replay


@pytest.fixture(scope="module")
def tasks(gen: Any) -> list[dict[str, Any]]:
    by_id = {t["task_id"]: t for t in gen.load_tasks()}
    return [by_id[k] for k in TASKS]


def fixed_record(gen: Any, task: dict[str, Any]) -> dict[str, Any]:
    """A record with a known layout of canonical, rewritten and mutant completions (:data:`LAYOUT`)."""
    rec = gen.make_record(task, 1, seed=1)
    pool = gen.mutants(task, random.Random(f"test:{task['task_id']}"), 3)
    assert len(pool) == 3
    _, fn, in_prompt = gen.solution(task)
    text = {"canonical": task["canonical_solution"], "rewritten": gen.completion_of(fn, in_prompt)}
    rec["texts"] = [text[x] if isinstance(x, str) else pool[x][1] for x in LAYOUT]
    rec["meta"]["intent"] = [x if isinstance(x, str) else pool[x][0] for x in LAYOUT]
    return rec


@pytest.fixture(scope="module")
def code_set(gen: Any, tasks: list[dict[str, Any]]) -> list[Problem]:
    return [parse_problem(fixed_record(gen, t), f"test:{i}") for i, t in enumerate(tasks)]


def distinct(problems: list[Problem]) -> int:
    """Distinct programs over the problems (a short canonical body may print the same when rewritten)."""
    return sum(len({a for a in p.answers if a is not None}) for p in problems)


def fresh_runner() -> CodeRunner:
    runner = code_runner()
    ready_sandbox(runner.sandbox)  # fails the test, with the fix-it message, when bwrap cannot run
    return runner




# --- the format (no sandbox) ------------------------------------------------------------------------

ADD = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}


def code_record(**over: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": "add", "question": "def add(a, b):\n", "tests": ADD, "program": "completion",
                           "texts": ["    return a + b\n", "    return a - b\n", None]}
    rec.update(over)
    return {k: v for k, v in rec.items() if v is not None}


def test_completion_records_hold_programs_formed_from_the_prompt() -> None:
    p = parse_problem(code_record(), "f:1")
    assert p.tests is not None and p.program == "completion"
    assert p.answers == ("def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n", None)
    assert p.texts == ("    return a + b\n", "    return a - b\n", "")
    assert not p.correct_recorded and p.correct == (False,) * 3
    assert default_answer([p]) is not None and default_answer([p]).kind == "code"  # type: ignore[union-attr]


def test_chat_records_take_the_fenced_program_and_answers_can_be_the_texts() -> None:
    answer = f"Here you go:\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}\n"
    rec = {"id": "c", "question": "Write add(a, b).", "tests": ADD, "program": "chat",
           "answers": [answer, "I cannot help with that."], "correct": [True, False]}
    p = parse_problem(rec, "f:2")
    assert p.answers == ("def add(a, b):\n    return a + b", None)
    assert p.texts == (answer, "I cannot help with that.")
    assert p.correct_recorded and p.correct == (True, False)
    # a sample without a program is served with answer '' (no extraction from its text) and wrong
    source = ReplaySource([p], seed=0)
    draws = asyncio.run(source.draw(SamplingRequest("completion", "replay", prompt="", query_id="c"), 2)).draws
    assert {d.answer for d in draws} == {"def add(a, b):\n    return a + b", NO_PROGRAM}


def test_entry_point_fills_the_tests_and_prompt_is_the_prefix() -> None:
    check = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
    p = parse_problem({"id": "e", "question": "prose", "tests": {"check": check, "prompt": "def add(a, b):\n"},
                       "entry_point": "add", "texts": ["    return a + b\n"]}, "f:3")
    assert p.tests is not None and p.tests.entry_point == "add"
    assert p.answers == ("def add(a, b):\n    return a + b\n",)  # auto mode: a completion of tests.prompt


@pytest.mark.parametrize(("over", "message"), [
    ({"tests": "assert add(1, 2) == 3"}, "'tests' must be an object"),
    ({"tests": {"check": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}},
     "'tests': check needs entry_point"),
    ({"tests": {"prompt": "def add(a, b):\n"}}, "'tests': tests need asserts or check"),
    ({"tests": {"asserts": "assert add(1, 2) =="}}, "asserts is not valid Python"),
    ({"tests": {"asserts": "x = 1"}}, "no assert statement"),
    ({"tests": {"asserts": "assert add(1, 2) == 3", "bogus": 1}}, "'tests.bogus': Extra inputs"),
    ({"tests": {"check": "def check(c):\n    assert c(1) == 1\n", "entry_point": "f"}, "entry_point": "g"},
     "differs from 'tests.entry_point'"),
    ({"entry_point": 3}, "'entry_point' must be a string"),
    ({"program": "diff"}, "'program' must be one of auto, completion, chat"),
    ({"texts": "    return a + b\n"}, "'texts' must be a list of strings or nulls"),
    ({"texts": [1, 2]}, "'texts' must be a list of strings or nulls"),
    ({"correct": [True]}, "'correct' must be a list of 3 booleans"),
    ({"answers": ["x"]}, "'answers' must be a list of 3 strings or nulls"),
])
def test_bad_code_fields_are_clear_format_errors(tmp_path: Path, over: dict[str, Any], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(code_record()) + "\n" + json.dumps(code_record(id="b", **over)) + "\n")
    with pytest.raises(ReplayFormatError, match=r"bad\.jsonl:2: ") as err:
        load_problems(path)
    assert message in str(err.value)


def test_code_fields_without_tests_and_tests_without_texts_are_errors() -> None:
    with pytest.raises(ReplayFormatError, match="'entry_point' only applies to a problem with 'tests'"):
        parse_problem({"id": "n", "answers": ["1"], "correct": [True], "entry_point": "f"}, "f:1")
    with pytest.raises(ReplayFormatError, match="needs 'texts'"):
        parse_problem({"id": "n", "tests": ADD}, "f:1")


def test_code_tests_verifier_needs_tests_on_every_problem() -> None:
    plain = Problem("n", "What is 1?", "1", ("1",), (True,))
    with pytest.raises(ReplayConfigError, match="needs 'tests' on every problem"):
        evaluate([plain], resolve_policy("elimination", verifier="code_tests"), [1], 1)
    with pytest.raises(ReplayConfigError, match="score"):
        resolve_policy("elimination", verifier="code_tests", verifier_params={"score": "most"})


def test_without_bubblewrap_replay_fails_with_the_sandbox_message(tmp_path: Path, cli: typer.Typer) -> None:
    problems = [parse_problem(code_record(), "f:1")]
    missing = CodeRunner(Sandbox(SandboxConfig(bwrap=str(tmp_path / "no-bwrap"))))
    with pytest.raises(ReplayConfigError, match="bubblewrap not found") as err:
        evaluate(problems, resolve_policy("elimination", verifier="code_tests"), [1], 1, code=missing)
    assert "sandbox.mode: unsandboxed explicitly" in str(err.value)
    assert missing.runs == 0
    data = tmp_path / "code.jsonl"
    data.write_text(json.dumps(code_record()) + "\n")
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--verifier", "code_tests", "--seeds", "1"],
                                env={"PATH": str(tmp_path)})
    assert result.exit_code == 2
    assert "bubblewrap not found" in result.output and "--sandbox-mode unsandboxed" in result.output
    assert "Traceback" not in result.output


# --- executing the HumanEval-derived set ------------------------------------------------------------


@pytest.mark.sandbox
def test_canonical_samples_are_correct_and_mutants_wrong(code_set: list[Problem]) -> None:
    runner = fresh_runner()
    results = asyncio.run(execute_programs(code_set, runner))
    assert runner.test_runs == results.programs == distinct(code_set) >= 4 * 4  # canonical (= rewritten?), 3 mutants
    for p in code_set:
        right = [intent in ("canonical", "rewritten") for intent in p.meta["intent"]]
        assert results.correct(p) == tuple(right), p.id
    partial = [o.fraction for t in results.outcomes.values() for o in t.values() if 0 < o.fraction < 1]
    assert partial  # some mutants pass some tests: the fraction score differs from all-or-nothing


@pytest.mark.sandbox
def test_replay_executes_each_distinct_program_once(code_set: list[Problem]) -> None:
    runner = fresh_runner()
    policy = resolve_policy("elimination", verifier="code_tests", answer=default_answer(code_set))
    report = evaluate(code_set, policy, [1, 2, 4, 8], 3, resamples=50, code=runner)
    # each distinct program is tested once, and run once on the prompt's doctest calls for its key
    n = distinct(code_set)
    assert runner.test_runs == n and runner.behaviour_runs == n
    assert report.code_stats["programs"] == n and report.code_stats["test_runs"] == n
    assert report.key_stats["behaviour"] == 4
    assert report.pass_at_1 == pytest.approx(0.5)  # 4 of 8 samples per problem are right
    for row in (*report.rows, *report.uniform, *report.oracle):
        assert row.coverage >= row.accuracy - 1e-12
    assert report.rows[-1].accuracy == 1.0  # the verifier finds the passing program
    assert report.rows[-1].mean_samples < 8  # and elimination stops there
    again = evaluate(code_set, resolve_policy("adaptive", verifier="code_tests"), [2, 4], 2, resamples=20,
                     code=runner)
    assert runner.test_runs == n and again.code_stats["test_runs"] == 0  # the runner's cache


@pytest.mark.sandbox
def test_executed_correctness_replaces_recorded_flags(code_set: list[Problem]) -> None:
    import dataclasses

    lying = dataclasses.replace(code_set[1], correct=(True,) * 8, correct_recorded=True)
    report = evaluate([lying], resolve_policy("uniform", verifier="none", answer=default_answer([lying])), [8], 1,
                      resamples=20, code=fresh_runner())
    assert report.code_stats["recorded_mismatch"] == 4  # the four mutants
    assert report.pass_at_1 == pytest.approx(0.5)


@pytest.mark.sandbox
async def test_verifier_scores_fraction_or_all_from_the_executed_outcomes(code_set: list[Problem]) -> None:
    runner = fresh_runner()
    p = code_set[0]  # HumanEval/0: its mutants pass 4 of 7 tests
    results = await execute_programs([p], runner)
    programs = [p.answers[0], p.answers[1]]  # canonical, a mutant
    request = SamplingRequest("completion", "replay", prompt=p.question, query_id=p.id)
    ctx = VerifyContext(request=request, tests=p.tests)
    draws = [Draw(text="", answer=a) for a in [*programs, NO_PROGRAM]]
    fraction = await ReplayCodeVerifier(results).score(ctx, draws)
    assert fraction.scores[0] == 1.0 and 0 < fraction.scores[1] < 1 and fraction.scores[2] == 0.0
    every = await ReplayCodeVerifier(results, ReplayCodeParams(score="all")).score(ctx, draws)
    assert every.scores == [1.0, 0.0, 0.0]
    assert runner.test_runs == 5  # scoring looked the outcomes up
    unknown = await ReplayCodeVerifier(CodeResults(runner, {p.id: {}})).score(ctx, draws[:1])
    assert unknown.scores == [1.0] and runner.test_runs == 5  # not in the table: the runner's cache


@pytest.mark.sandbox
def test_chat_problem_without_a_program_does_not_vote() -> None:
    fence = f"{FENCE}python\ndef add(a, b):\n    return a {{}} b\n{FENCE}"
    rec = {"id": "c", "question": "Write add(a, b).", "tests": ADD, "program": "chat",
           "texts": [fence.format("+"), "No.", fence.format("-"), "No.", "No.", fence.format("+")]}
    p = parse_problem(rec, "f:1")
    runner = fresh_runner()
    report = evaluate([p], resolve_policy("fixed", verifier="none", answer=default_answer([p])), [6], 4,
                      resamples=20, code=runner)
    assert runner.test_runs == 2  # the two programs; the prose samples have none
    assert report.rows[0].accuracy == 1.0  # "No." x3 does not outvote "+" x2: it does not vote
    assert report.pass_at_1 == pytest.approx(2 / 6)


@pytest.mark.sandbox
def test_cli_replays_a_generated_set(gen: Any, tasks: list[dict[str, Any]], cli: typer.Typer, tmp_path: Path) -> None:
    fresh_runner()
    data, out = tmp_path / "code.jsonl", tmp_path / "out.json"
    assert gen.write_jsonl(gen.make_records(tasks, 6, seed=3), data) == 4
    for rec in map(json.loads, data.read_text().splitlines()):
        assert "correct" not in rec and len(rec["meta"]["intent"]) == len(rec["texts"]) == 6
        assert CodeTests.model_validate(rec["tests"]).entry_point == rec["entry_point"]
    result = CliRunner().invoke(cli, ["replay", "--data", str(data), "--verifier", "code_tests", "--verifier-params",
                                      '{"score": "all"}', "--budgets", "1,3", "--seeds", "2", "--resamples", "20",
                                      "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "distinct program(s) of 4 problem(s) executed once" in result.output
    doc = json.loads(out.read_text())
    assert doc["answer"]["kind"] == "code" and doc["spec"]["verifier_params"] == {"score": "all"}
    assert doc["code"]["test_runs"] == doc["code"]["programs"] > 0
    for row in doc["rows"]:
        assert row["coverage"] >= row["accuracy"]


def test_generator_help_and_determinism(gen: Any, tasks: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]) \
        -> None:
    with pytest.raises(SystemExit):
        gen.main(["--help"])
    help_text = capsys.readouterr().out
    for option in ("--problems", "--samples", "--seed", "--out"):
        assert option in help_text
    a = gen.make_record(tasks[0], 10, seed=5)
    assert a == gen.make_record(tasks[0], 10, seed=5) != gen.make_record(tasks[0], 10, seed=6)
    assert set(a["meta"]["intent"]) <= {"canonical", "rewritten", "truncated", *gen.MUTATIONS}
