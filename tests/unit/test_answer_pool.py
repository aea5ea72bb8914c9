"""The answer worker pool: math-verify off the event loop, hard time limits, bounded, cancellable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import app.answers.canon as canon_module
from app.answers import AnswerRuntime, AnswerSpec, ParsePool, PoolBusy, PoolTimeout, QueryCanon, kind_factory
from tests.support import slow_work
from tests.support.waiting import exited, until


@pytest.fixture
def hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TTC_TEST_HOLD_DIR", str(tmp_path))  # spawned workers inherit it
    return tmp_path


@pytest.fixture
async def pool(hold: Path) -> AsyncIterator[ParsePool]:
    fallbacks: list[str] = []
    p = ParsePool(workers=1, timeout_s=30, on_fallback=fallbacks.append)
    p.fallbacks = fallbacks  # type: ignore[attr-defined]
    yield p
    p.close()


async def started_pid(hold: Path, timeout_s: float = 60) -> int:
    """The pid a held worker call wrote once it started."""
    await until(lambda: any(hold.glob("started-*")), timeout_s=timeout_s, what="the worker call to start")
    return int(next(hold.glob("started-*")).read_text())


async def test_math_answers_share_keys_through_the_pool(pool: ParsePool) -> None:
    canon = QueryCanon(kind_factory(AnswerSpec(kind="math"))(""), AnswerRuntime(pool))
    keys = await canon.keys([r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", r"\sqrt{2}/2", r"\pi", "0.5", "1/2"])
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert keys[4] == keys[5] == "0.5"
    assert await canon.same_answer(r"\frac{2}{\sqrt{8}}", r"\frac{1}{\sqrt{2}}")
    assert not await canon.same_answer(r"\pi", "3")


async def test_numbers_and_text_never_reach_the_pool() -> None:
    class Refusing(ParsePool):
        async def run(self, *args: object, **kw: object) -> object:
            raise AssertionError("the pool was used for an inline key")

    canon = QueryCanon(kind_factory(AnswerSpec())(""), AnswerRuntime(Refusing()))
    assert await canon.keys(["1,000.5", "yajo", "the answer is a long sentence of prose", None]) == [
        "1000.5", "yajo", "the answer is a long sentence of prose", None]


async def test_a_slow_parse_does_not_block_the_loop(pool: ParsePool, hold: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canon_module, "math_key", slow_work.held_math_key)
    canon = QueryCanon(kind_factory(AnswerSpec(kind="math"))(""), AnswerRuntime(pool))
    parse = asyncio.create_task(canon.key(r"\frac{x}{2}"))
    await started_pid(hold)
    ticks = 0
    for _ in range(100):  # the loop keeps running other work while the worker is busy
        await asyncio.sleep(0)  # a yield to the loop, not a delay
        ticks += 1
    assert ticks == 100 and not parse.done()
    (hold / "release").write_text("go")
    assert await parse == r"\frac{x}{2}"


async def test_timeout_kills_the_worker_and_falls_back(hold: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canon_module, "math_key", slow_work.held_math_key)
    fallbacks: list[str] = []
    pool = ParsePool(workers=1, timeout_s=0.5, on_fallback=fallbacks.append)
    try:
        canon = QueryCanon(kind_factory(AnswerSpec(kind="math"))(""), AnswerRuntime(pool))
        assert await canon.key(r"\left( \frac{x}{2} \right)") == r"(\frac{x}{2})"  # the normalised text
        assert fallbacks == ["timeout"]
        pid = await started_pid(hold)
        assert await exited(pid), "the timed-out worker was not stopped"
        with pytest.raises(PoolTimeout):
            await pool.run(slow_work.spin, 30.0)
        assert await pool.run(slow_work.spin, 0.0) == 0.0  # a fresh worker took over
    finally:
        pool.close()


async def test_cancelled_call_stops_its_worker(pool: ParsePool, hold: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canon_module, "math_key", slow_work.held_math_key)
    canon = QueryCanon(kind_factory(AnswerSpec(kind="math"))(""), AnswerRuntime(pool))
    task = asyncio.create_task(canon.key("x^2"))
    pid = await started_pid(hold)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await exited(pid), "the abandoned parse kept running"
    assert pool.pending == 0


async def test_the_pool_is_bounded(hold: Path) -> None:
    pool = ParsePool(workers=1, timeout_s=30, max_pending=1)
    try:
        first = asyncio.create_task(pool.run(slow_work.spin, 0.2))
        await until(lambda: pool.pending == 1, what="the first call to be pending")
        with pytest.raises(PoolBusy):
            await pool.run(slow_work.spin, 0.0)
        assert await first == 0.2
    finally:
        pool.close()
