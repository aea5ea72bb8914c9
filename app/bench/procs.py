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


@contextlib.contextmanager
def process(cmd: list[str], health_url: str, timeout: float = 60, env: dict[str, str] | None = None,
            log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
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
def fake_backend(latency_ms: float, style: str = "number") -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with process([ttc_exe(), "fake-backend", "--port", str(port), "--latency-ms", str(latency_ms),
                  "--style", style], url + "/health"):
        yield url


@contextlib.contextmanager
def service(backends: list[str], log: Path | None = None) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"]
    for b in backends:
        cmd += ["--backend", b]
    with process(cmd, url + "/ready", log=log):
        yield url
