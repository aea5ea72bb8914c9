"""Closed-loop runs, streaming, deadlines, errors and the backend-kill scenario over real HTTP."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ttc_tools.fakes.service import FakeTTCService, serve_in_thread
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.runner import LevelSpec, open_session, run_level
from ttc_tools.loadtest.scenario import KillPlan, KillSwitch
from ttc_tools.loadtest.session import run_session

PROBLEMS = [Problem(f"p{i}", f"Report the number {i * 7}.", str(i * 7)) for i in range(1, 6)]


@pytest.fixture(scope="module")
def fake_url() -> Iterator[str]:
    with serve_in_thread(FakeTTCService(latency_s=0.02, p_correct=1.0)) as url:
        yield url


def test_closed_loop_respects_request_bound_and_concurrency(fake_url: str) -> None:
    spec = LevelSpec(url=fake_url, policy="sc", mode="closed", load=4, duration_s=None, max_requests=20,
                     ttc={"policy": "self-consistency-8"})
    result = asyncio.run(run_level(spec, PROBLEMS))
    assert len(result.records) == 20 and sorted(r.index for r in result.records) == list(range(20))
    assert all(r.error is None and r.samples == 8 and r.rounds == 1 for r in result.records)
    assert all(r.completion_tokens == 72 and r.ttfb_s is not None for r in result.records)
    # 20 requests, 4 at a time, 20 ms each: about 5 waves
    assert result.elapsed_s > 0.09  # can't be faster than 5 waves of 20 ms


def test_closed_loop_respects_duration(fake_url: str) -> None:
    spec = LevelSpec(url=fake_url, policy="single", mode="closed", load=2, duration_s=0.5,
                     ttc={"policy": "single"})
    t = time.monotonic()
    result = asyncio.run(run_level(spec, PROBLEMS))
    assert time.monotonic() - t < 10  # stops by itself (no request starts after the duration)
    assert len(result.records) >= 2
    assert max(r.start_s for r in result.records) < 0.5


def test_streaming_records_ttc_block_and_first_byte(fake_url: str) -> None:
    spec = LevelSpec(url=fake_url, policy="sc", mode="closed", load=1, duration_s=None, max_requests=3,
                     ttc={"policy": "self-consistency-4"}, stream=True)
    recs = asyncio.run(run_level(spec, PROBLEMS)).records
    assert all(r.error is None and r.samples == 4 and r.answer == r.gold for r in recs)
    assert all(r.ttfb_s is not None and r.ttfb_s <= r.latency_s for r in recs)


def test_deadline_errors_are_typed(fake_url: str) -> None:
    spec = LevelSpec(url=fake_url, policy="sc", mode="closed", load=2, duration_s=None, max_requests=4,
                     ttc={"policy": "single", "budget": {"deadline_ms": 1}})
    recs = asyncio.run(run_level(spec, PROBLEMS)).records
    assert [r.error for r in recs] == ["http_504:deadline_exceeded"] * 4
    assert all(r.status == 504 for r in recs)


def test_refused_and_unreachable_targets() -> None:
    spec = LevelSpec(url="http://10.1.2.3:80", policy="x", mode="closed", load=1, max_requests=1)
    with pytest.raises(ValueError, match="not loopback"):
        asyncio.run(run_level(spec, PROBLEMS))
    from app.backends.launcher import free_port

    dead = LevelSpec(url=f"http://127.0.0.1:{free_port()}", policy="x", mode="closed", load=1,
                     duration_s=None, max_requests=2, timeout_s=2)
    recs = asyncio.run(run_level(dead, PROBLEMS)).records
    assert [r.error for r in recs] == ["connect_error"] * 2
    with pytest.raises(ValueError, match="--duration or --requests"):
        LevelSpec(url="http://127.0.0.1:1", policy="x", mode="closed", load=1, duration_s=None).bounds()


def test_session_scores_and_summarises_levels(fake_url: str) -> None:
    specs = [LevelSpec(url=fake_url, policy=p, mode="closed", load=c, duration_s=None, max_requests=6,
                       ttc={"policy": p}) for c in (1, 3) for p in ("single", "self-consistency-4")]
    result = asyncio.run(run_session(specs, PROBLEMS))
    assert [(s.policy, s.load) for s in result.summaries] == [
        ("single", 1), ("self-consistency-4", 1), ("single", 3), ("self-consistency-4", 3)]
    assert all(s.accuracy == 1.0 and s.scored == 6 and s.failed == 0 for s in result.summaries)
    assert [s.samples_per_query for s in result.summaries] == [1, 4, 1, 4]
    assert len(result.records) == 24 and all(r.correct for r in result.records)


def test_kill_switch_kills_a_process_during_the_session(fake_url: str) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        spec = LevelSpec(url=fake_url, policy="single", mode="closed", load=1, duration_s=0.6,
                         ttc={"policy": "single"})
        result = asyncio.run(run_session([spec], PROBLEMS, kill=KillPlan(0.2, pid=victim.pid)))
        assert victim.wait(5) == -9
        assert result.kill_outcome is not None and "pid" in result.kill_outcome
        assert result.summaries[0].failed_after_kill == 0
    finally:
        if victim.poll() is None:
            victim.kill()


def test_kill_plan_validation_and_command() -> None:
    with pytest.raises(ValueError):
        KillPlan(1.0)
    with pytest.raises(ValueError):
        KillPlan(1.0, pid=1, command="true")
    switch = KillSwitch(KillPlan(0.0, command="exit 3"))
    switch.fire()
    assert switch.fired_at is not None and "exit 3" in switch.outcome


@pytest.mark.parametrize(("mode", "load", "conns"), [("closed", 1, 1), ("closed", 64, 64), ("open", 5, 2048)])
def test_one_pool_sized_to_the_level(mode: str, load: float, conns: int) -> None:
    async def limit() -> int:
        async with open_session(LevelSpec(url="http://127.0.0.1:1", policy="x", mode=mode, load=load)) as s:  # type: ignore[arg-type]
            return s.connector.limit  # type: ignore[union-attr]

    assert asyncio.run(limit()) == conns
