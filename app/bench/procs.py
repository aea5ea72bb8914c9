"""Start and stop the processes a benchmark needs (fake backend, service, vLLM) on loopback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from app.backends.launcher import free_port

__all__ = ["Endpoint", "children", "cpu_seconds", "fake_backend", "free_port", "pinning", "process", "service",
           "stop_process", "ttc_exe", "wait_http"]


def ttc_exe() -> str:
    return str(Path(sys.executable).parent / "ttc")


def wait_http(url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process serving {url} exited with code {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s")


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
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
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
def fake_backend(latency_ms: float, style: str = "number", cpus: set[int] | None = None) -> Iterator[Endpoint]:
    port = free_port()
    url = Endpoint(f"http://127.0.0.1:{port}")
    with process([ttc_exe(), "fake-backend", "--port", str(port), "--latency-ms", str(latency_ms),
                  "--style", style], url + "/health", cpus=cpus) as proc:
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
