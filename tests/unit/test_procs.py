"""``app.procs`` and :func:`app.backends.launcher.pin_engine_core` on real processes: a three-level
tree shaped like vLLM's (API server -> engine core -> worker that binds itself to one core)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from app.backends.launcher import pin_engine_core
from app.procs import children, move_to_cpus

# each level starts the next and waits; the last binds itself to the lowest core it may use (as vLLM's
# CPU worker binds its OpenMP threads), starts a thread, says so on the shared stdout and waits
_BIND = "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "


def _server(bind: bool) -> str:
    worker = ("import os, threading; " + (_BIND if bind else "")
              + "threading.Thread(target=threading.Event().wait, daemon=True).start(); "
              "print('ready', flush=True); threading.Event().wait()")
    core = (f"import subprocess, sys, threading; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
            "threading.Thread(target=threading.Event().wait, daemon=True).start(); threading.Event().wait()")
    return f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {core!r}]).wait()"


@contextlib.contextmanager
def _tree(bind: bool) -> Iterator[int]:
    """The server's pid once its worker said ready (a worker that fails closes the pipe: readline ends)."""
    proc = subprocess.Popen([sys.executable, "-c", _server(bind)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def tree() -> Iterator[int]:
    with _tree(bind=True) as pid:
        yield pid


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


def test_children_lists_the_process_tree_level_by_level(tree: int) -> None:
    (core,) = children(tree)
    (worker,) = children(core)
    assert children(worker) == []
    assert children(2**22 + 1) == []  # no such process


def test_the_engine_core_moves_to_the_workers_core_and_the_server_stays(tree: int) -> None:
    free = os.sched_getaffinity(tree)
    (core,) = children(tree)
    (worker,) = children(core)
    bound = {min(free)}
    assert os.sched_getaffinity(worker) == bound
    pinned = pin_engine_core(tree)
    if len(free) == 1:  # the worker is not bound to fewer cores than the server has: nothing to move
        assert pinned is None
        return
    assert pinned == bound
    assert len(_affinities(core)) >= 2 and all(a == bound for a in _affinities(core))
    assert all(a == free for a in _affinities(tree))


def test_nothing_moves_when_the_worker_is_not_bound() -> None:
    with _tree(bind=False) as server:
        (core,) = children(server)
        before = _affinities(core)
        assert pin_engine_core(server) is None
        assert _affinities(core) == before


def test_move_to_cpus_moves_every_thread_and_skips_a_gone_process(tree: int) -> None:
    (core,) = children(tree)
    target = {max(os.sched_getaffinity(core))}
    assert move_to_cpus(core, target) == len(os.listdir(f"/proc/{core}/task")) >= 2
    assert all(a == target for a in _affinities(core))
    assert move_to_cpus(2**22 + 1, target) == 0
