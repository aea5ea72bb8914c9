"""Start and stop the processes a benchmark needs (fake backend, service, vLLM) on loopback.

The servers of the scale-out topology (PostgreSQL, Redis, HAProxy, ``ttc serve`` replicas with a YAML
config) are in :mod:`ttc_tools.bench.topology`, built on these helpers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from app.backends.launcher import free_port

__all__ = ["Endpoint", "NotReady", "children", "cpu_seconds", "fake_backend", "free_port", "log_tail", "pinning",
           "process", "service", "stop_process", "ttc_exe", "wait_http", "wait_port", "wait_until"]


def ttc_exe() -> str:
    return str(Path(sys.executable).parent / "ttc")


class NotReady(TimeoutError, RuntimeError):
    """What was waited for did not happen in time (both a ``TimeoutError`` and a ``RuntimeError``)."""


def wait_until(ready: Callable[[], bool], timeout: float, proc: subprocess.Popen[Any] | None = None,
               what: str = "the condition", interval: float = 0.1) -> None:
    """Poll ``ready()`` (HTTP and socket errors count as not yet) until it holds; a ``RuntimeError`` if
    ``proc`` exits first, :class:`NotReady` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before {what}")
        with contextlib.suppress(httpx.HTTPError, OSError):
            if ready():
                return
        if time.monotonic() >= deadline:
            raise NotReady(f"{what}: not within {timeout:.0f}s")
        time.sleep(interval)


def wait_http(url: str, proc: subprocess.Popen[Any] | None = None, timeout: float = 60) -> None:
    """Until ``url`` answers 200."""
    wait_until(lambda: httpx.get(url, timeout=1).status_code == 200, timeout, proc, f"{url} answered", 0.2)


def wait_port(port: int, timeout: float, proc: subprocess.Popen[Any] | None = None, host: str = "127.0.0.1") -> None:
    """Until something accepts TCP connections on ``port``."""

    def listening() -> bool:
        with socket.create_connection((host, port), timeout=0.2):
            return True

    wait_until(listening, timeout, proc, f"something listened on {port}", 0.05)


def log_tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return ""


class Endpoint(str):
    """The base URL of a process started here; ``pid`` is that process."""

    pid: int = 0


def children(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the direct children of a process (``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append((int(entry.name), cmdline))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinning() -> tuple[set[int], set[int]] | None:
    """``(load generator + backend CPUs, service CPUs)`` for benchmarks on a machine with two or more
    CPUs: the service gets the last CPU to itself; ``None`` on one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return set(cpus[:-1]), {cpus[-1]}


@contextlib.contextmanager
def process(cmd: list[str], health_url: str, timeout: float = 60, env: dict[str, str] | None = None,
            log: Path | None = None, cpus: set[int] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd`` (on ``cpus`` when given: its children inherit them), wait for ``health_url``."""
    with contextlib.ExitStack() as files:  # the child keeps its own copy of the log's descriptor
        out = files.enter_context(open(log, "ab")) if log else subprocess.DEVNULL
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    try:
        wait_http(health_url, proc, timeout)
        yield proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``grace_s``."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@contextlib.contextmanager
def fake_backend(latency_ms: float, style: str = "number", cpus: set[int] | None = None, token_latency_ms: float = 0,
                 p_correct: float | None = None, log: Path | None = None,
                 stall_after: int | None = None) -> Iterator[Endpoint]:
    """``ttc fake-backend`` on a free port (``p_correct`` None: the fake's own default)."""
    port = free_port()
    url = Endpoint(f"http://127.0.0.1:{port}")
    cmd = [ttc_exe(), "fake-backend", "--port", str(port), "--latency-ms", str(latency_ms), "--style", style,
           "--token-latency-ms", str(token_latency_ms)]
    if p_correct is not None:
        cmd += ["--p-correct", str(p_correct)]
    if stall_after is not None:
        cmd += ["--stall-after", str(stall_after)]
    with process(cmd, url + "/health", log=log, cpus=cpus) as proc:
        url.pid = proc.pid
        yield url


@contextlib.contextmanager
def service(backends: list[str], log: Path | None = None, cpus: set[int] | None = None) -> Iterator[Endpoint]:
    port = free_port()
    url = Endpoint(f"http://127.0.0.1:{port}")
    cmd = [ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"]
    for b in backends:
        cmd += ["--backend", b]
    with process(cmd, url + "/ready", log=log, cpus=cpus) as proc:
        url.pid = proc.pid
        yield url
