"""The regex answer kind holds a client's pattern to a bounded RE2 program, and the service extracts with it
only in answer workers (hard time limit, fallbacks counted), a chunk of samples per call."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import ValidationError

import app.answers.structured as structured
from app.answers import AnswerRuntime, AnswerSpec, ParsePool, QueryCanon, kind_factory
from app.answers.structured import MAX_PROGRAM_SIZE, RegexParams
from app.backends.base import Draw, SamplingRequest
from app.verifiers import ReferenceVerifier, VerifyContext
from tests.support import held_regex

T = TypeVar("T")


class CountingPool(ParsePool):
    """Runs calls in this process and counts them (what the service would send to its workers)."""

    def __init__(self) -> None:
        super().__init__(workers=1)
        self.calls: list[tuple[Any, ...]] = []
        self.fallbacks: list[str] = []
        self.on_fallback = self.fallbacks.append

    async def run(self, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        self.calls.append(args)
        return fn(*args)


def regex(pattern: str, **params: Any) -> QueryCanon:
    return QueryCanon(kind_factory(AnswerSpec(kind="regex", params={"pattern": pattern, **params}))(""),
                      AnswerRuntime(CountingPool()))


def pool_of(canon: QueryCanon) -> CountingPool:
    assert canon.runtime is not None and isinstance(canon.runtime.pool, CountingPool)
    return canon.runtime.pool


def field_errors(pattern: str, **params: Any) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as info:
        RegexParams.model_validate({"pattern": pattern, **params})
    return [(e["loc"], e["msg"]) for e in info.value.errors()]


def test_the_compiled_program_is_bounded() -> None:
    assert MAX_PROGRAM_SIZE == 1000
    RegexParams.model_validate({"pattern": "(x{994})"})  # 1,000 instructions
    [(loc, msg)] = field_errors("(x{995})")  # 1,001
    assert loc == ("pattern",) and "the limit is 1000 RE2 instructions and it compiles to 1001" in msg
    [(loc, msg)] = field_errors(r"((?:[a-z]?){1000}[a-z]{1000})")  # 3,006: seconds per sample
    assert loc == ("pattern",) and "compiles to 3006" in msg
    [(loc, msg)] = field_errors(r"(\pL{1000})", ignore_case=True)  # RE2 gives up compiling it
    assert loc == ("pattern",) and "compiles to far more" in msg
    [(loc, msg)] = field_errors("(a")
    assert loc == ("pattern",) and "not a valid RE2 pattern" in msg
    [(loc, msg)] = field_errors("no group")
    assert loc == () and "exactly one group" in msg


async def test_extraction_runs_in_the_pool_a_chunk_of_texts_per_call() -> None:
    canon = regex(r"answer is (\d+)")
    draws = [Draw(f"so the answer is {i}.") for i in range(20)] + [Draw("so the answer is 3."), Draw("none")]
    assert await canon.extract_all(draws) == [str(i) for i in range(20)] + ["3", None]
    calls = pool_of(canon).calls
    assert [len(args[-1]) for args in calls] == [8, 8, 5]  # 21 distinct texts
    assert await canon.extract_all([Draw("so the answer is 7."), Draw("x", answer="recorded")]) == ["7", "recorded"]
    assert len(calls) == 3  # texts seen before are not matched again
    assert await canon.keys(["7", "007", None]) == ["7", "7", None]


async def test_other_kinds_extract_without_the_pool() -> None:
    canon = QueryCanon(kind_factory(AnswerSpec(kind="number"))(""), AnswerRuntime(CountingPool()))
    assert await canon.extract_all([Draw("the answer is 12"), Draw("x", answer="5")]) == ["12", "5"]
    assert pool_of(canon).calls == []


async def test_the_reference_verifier_extracts_through_the_pool() -> None:
    canon = regex(r"ANSWER=(\w+)", ignore_case=True)
    ctx = VerifyContext(request=SamplingRequest(kind="chat", model="m", messages=[]), reference="Paris", canon=canon)
    verdict = await ReferenceVerifier().score(ctx, [Draw("answer=paris"), Draw("answer=rome"), Draw("?", correct=True)])
    assert verdict.scores == [1.0, 0.0, 1.0]
    assert len(pool_of(canon).calls) == 1


@pytest.fixture
async def held_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ParsePool]:
    monkeypatch.setenv("TTC_TEST_HOLD_DIR", str(tmp_path))  # never released: each call runs to its time limit
    monkeypatch.setenv("TTC_TEST_LOOP_PID", str(os.getpid()))
    monkeypatch.setattr(structured, "regex_answers", held_regex.held_regex_answers)
    fallbacks: list[str] = []
    pool = ParsePool(workers=1, timeout_s=0.5, on_fallback=fallbacks.append)
    pool.fallbacks = fallbacks  # type: ignore[attr-defined]
    yield pool
    pool.close()


async def test_a_match_past_its_time_limit_gives_no_answer_and_is_counted(held_pool: ParsePool) -> None:
    kind = kind_factory(AnswerSpec(kind="regex", params={"pattern": r"is (\d+)"}))("")
    canon = QueryCanon(kind, AnswerRuntime(held_pool))
    assert await canon.extract_all([Draw("it is 4"), Draw("it is 5")]) == [None, None]
    assert held_pool.fallbacks == ["regex_timeout"]  # type: ignore[attr-defined]


async def test_a_full_pool_gives_no_answer_and_is_counted() -> None:
    fallbacks: list[str] = []
    pool = ParsePool(workers=1, max_pending=0, on_fallback=fallbacks.append)  # refuses every call at once
    canon = QueryCanon(kind_factory(AnswerSpec(kind="regex", params={"pattern": r"is (\d+)"}))(""), AnswerRuntime(pool))
    assert await canon.extract_all([Draw("it is 4")]) == [None]
    assert fallbacks == ["regex_busy"]
