"""Reading and placing this machine's processes through ``/proc`` (Linux): a process's children, and
moving every thread of a process onto a set of cores."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (those its main thread started); ``[]`` once it is gone."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def move_to_cpus(pid: int, cpus: set[int]) -> int:
    """Set the CPU affinity of every thread of ``pid`` to ``cpus`` (``taskset -a -p``; threads it
    starts later inherit it from theirs). Returns how many threads moved; threads that end meanwhile
    are skipped."""
    moved = 0
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return 0
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cpus)
            moved += 1
    return moved
