"""The sandbox's slots are shared fairly between API keys: freed slots go round-robin over the waiting
keys (one key flooding the sandbox delays another's program by turns, not by its whole queue), and a full
queue is refused at once: 429 for a key's own queue, 503 for everyone's. Counted in turns, not time."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from app.sandbox import Sandbox, SandboxConfig
from app.sandbox_queue import FairSlots, SandboxBusy, SandboxOverloaded
from tests.support.sandboxes import ready_sandbox
from tests.support.waiting import until


class Queue:
    """A :class:`FairSlots` driven by hand: :meth:`wait` queues programs, :meth:`end` ends a running one."""

    def __init__(self, **config: object) -> None:
        self.slots = FairSlots(SandboxConfig.model_validate(config))
        self.tasks: list[asyncio.Task[int]] = []
        self.order: list[str | None] = []  # owners in the order their programs started

    async def start(self, owner: str | None) -> None:
        await self.slots.acquire(owner)
        self.order.append(owner)

    async def wait(self, owners: Iterable[str | None]) -> None:
        before = self.slots.queued + self.slots.running
        owners = list(owners)
        for owner in owners:
            self.tasks.append(asyncio.create_task(self._run(owner)))
        await until(lambda: self.slots.queued + self.slots.running == before + len(owners), what="queued")

    async def _run(self, owner: str | None) -> int:
        turns = await self.slots.acquire(owner)
        self.order.append(owner)
        return turns

    def end(self, owner: str | None) -> None:
        self.slots.release(owner)

    async def settle(self) -> None:
        await asyncio.sleep(0)  # granted waiters record their start

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def queue() -> AsyncIterator[Queue]:
    q = Queue(max_concurrent=1)
    yield q
    await q.close()


async def test_freed_slots_go_round_robin_over_the_waiting_keys(queue: Queue) -> None:
    await queue.start("A")
    await queue.wait(["A", "A", "A", "B", "B", "C"])
    for owner in ["A", "B", "C", "A", "B", "A"]:
        queue.end(owner)
        await queue.settle()
    assert queue.order == ["A", "B", "C", "A", "B", "A", "A"]
    assert queue.slots.running == 1 and queue.slots.queued == 0


async def test_a_new_key_starts_at_the_next_freed_slot_however_long_the_flood(queue: Queue) -> None:
    await queue.start("flood")
    await queue.wait(["flood"] * 50 + ["other-1", "flood", "other-2"])
    queue.end("flood")
    await queue.settle()
    queue.end("other-1")
    await queue.settle()
    assert queue.order[:3] == ["flood", "other-1", "other-2"]
    turns = await asyncio.gather(*queue.tasks[50:51], *queue.tasks[52:53])
    assert turns == [0, 1]  # other-2 waited one turn: other-1's


async def test_a_full_queue_is_refused_at_once_429_for_a_key_503_for_all() -> None:
    q = Queue(max_concurrent=1, max_queued_per_key=2, max_queued=3, wall_s=7)
    try:
        await q.start("A")
        await q.wait(["A", "A"])
        with pytest.raises(SandboxBusy) as busy:
            await q.slots.acquire("A")
        assert busy.value.status_code == 429 and busy.value.code == "sandbox_queue_full"
        assert busy.value.headers == {"Retry-After": "7"}
        await q.wait(["B"])
        with pytest.raises(SandboxOverloaded) as full:
            await q.slots.acquire("C")
        assert full.value.status_code == 503 and full.value.code == "sandbox_overloaded"
        await q.wait([None, None])  # the operator's programs (no key) wait without a limit
        assert (q.slots.queued, q.slots.queued_keyed) == (5, 3)
        for owner in ["A", "B", None, "A", None, "A"]:
            q.end(owner)
            await q.settle()
        assert q.order == ["A", "B", None, "A", None, "A"] and q.slots.queued == 0
    finally:
        await q.close()


async def test_a_cancelled_waiter_leaves_and_a_granted_one_hands_its_slot_on(queue: Queue) -> None:
    await queue.start("A")
    await queue.wait(["B", "C", "D"])
    queue.tasks[0].cancel()  # B leaves the queue
    await asyncio.gather(queue.tasks[0], return_exceptions=True)
    assert queue.slots.waiting("B") == 0 and queue.slots.queued == 2
    queue.end("A")  # C is granted the slot ...
    queue.tasks[1].cancel()  # ... but gives up before it runs: D gets it
    await asyncio.gather(queue.tasks[1], return_exceptions=True)
    await queue.settle()
    assert queue.order == ["A", "D"] and queue.slots.running == 1 and queue.slots.running_for("D") == 1


async def test_a_key_may_be_capped_below_all_the_slots() -> None:
    q = Queue(max_concurrent=3, max_running_per_key=2)
    try:
        await q.wait(["A", "A", "A", "B"])
        assert (q.slots.running_for("A"), q.slots.running_for("B"), q.slots.waiting("A")) == (2, 1, 1)
        q.end("B")  # the free slot stays free rather than go to A's third program
        assert q.slots.running == 2 and q.slots.waiting("A") == 1
        q.end("A")
        await q.settle()
        assert q.slots.running_for("A") == 2 and q.slots.queued == 0
    finally:
        await q.close()


@pytest.mark.sandbox
async def test_a_flood_of_sleeping_programs_delays_another_key_by_one_turn() -> None:
    sandbox: Sandbox = ready_sandbox(SandboxConfig(max_concurrent=2, wall_s=120))
    slots = sandbox.slots
    flood = [asyncio.create_task(sandbox.run("import time\ntime.sleep(120)", owner="flood")) for _ in range(6)]
    try:
        await until(lambda: slots.running_for("flood") == 2 and slots.waiting("flood") == 4, what="the flood")
        other = asyncio.create_task(sandbox.run("print(6 * 7)", owner="other"))
        await until(lambda: slots.waiting("other") == 1, what="the other key's program to queue")
        flood[0].cancel()  # one sleeper is killed: the slot it frees is the other key's
        result = await other
        assert (result.status, result.stdout, result.turns_waited) == ("ok", "42\n", 0)
        assert slots.granted == 4  # two sleepers, the other key's program, then the next sleeper in its slot
        assert slots.running_for("flood") == 2 and slots.waiting("flood") == 3
    finally:
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, return_exceptions=True)


def marked_processes(marker: bytes) -> list[int]:
    """Live processes (not zombies) whose command line holds ``marker``, wherever they were reparented."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and marker in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.sandbox
async def test_a_run_cancelled_at_any_moment_of_its_start_leaves_no_process() -> None:
    """Cancelled while bwrap starts (asyncio still creating the process, or bwrap still making its namespace),
    a run used to leave the namespace's init and its program running, reparented, holding the run's pipes
    (its cancel then waited for the program to end). Swept over the first 80 ms of a start; without the fix
    some of these moments leaked (2 of 40 in each of two sweeps here), with it none."""
    sandbox = ready_sandbox(SandboxConfig(tmp_size_mb=61, wall_s=120))
    marker = f"--size\x00{61 * 1024 * 1024}\x00".encode()  # a tmpfs size no other sandbox uses marks ours
    leaked = []
    for step in range(40):
        task = asyncio.create_task(sandbox.run("import time\ntime.sleep(120)"))
        await asyncio.sleep(step * 0.002)  # not synchronisation: where in the start-up the cancel lands
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=30)  # a bound, not a measure: the program sleeps 120 s
        if marked_processes(marker):
            leaked.append(2 * step)
            for pid in marked_processes(marker):
                os.kill(pid, signal.SIGKILL)
        assert done, f"the run cancelled after {2 * step} ms did not end (its sandbox held its pipes)"
    assert leaked == [], f"runs cancelled after {leaked} ms left their sandbox running"
