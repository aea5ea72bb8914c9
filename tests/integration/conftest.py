"""Real vLLM CPU servers and a real service process, started once per test session.

Two vLLM servers (A and B) serve the bundled demo model (or ``TTC_TEST_MODEL_DIR``) on loopback;
the service runs as a real ``ttc serve`` process in front of both. B is stopped by the failover
test, which therefore runs last (``test_zz_failover.py``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.backends.launcher import EmbeddedEngine, free_port
from app.config import REPO_ROOT, EngineConfig

LOG_DIR = REPO_ROOT / ".logs"
MODEL_NAME = "arith-llama"


def model_dir() -> Path:
    return Path(os.environ.get("TTC_TEST_MODEL_DIR", REPO_ROOT / "models" / "arith-llama"))


@dataclass
class Stack:
    vllm_a: EmbeddedEngine
    vllm_b: EmbeddedEngine
    service_url: str
    service: subprocess.Popen[bytes]


def _engine(name: str) -> EmbeddedEngine:
    cfg = EngineConfig(model_dir=model_dir(), served_model_name=MODEL_NAME, max_model_len=512)
    LOG_DIR.mkdir(exist_ok=True)
    return EmbeddedEngine(cfg, log_path=LOG_DIR / f"test-vllm-{name}.log")


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not up after {timeout}s")


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    a, b = _engine("a"), _engine("b")
    a.start()
    b.start()
    try:
        started = time.monotonic()
        asyncio.run(a.wait_ready())
        asyncio.run(b.wait_ready())
        print(f"\n[integration] two vLLM CPU servers up in {time.monotonic() - started:.0f}s: "
              f"{a.url} {b.url} (model {model_dir()})", file=sys.stderr)
        port = free_port()
        env = {**os.environ, "TTC_POOL__COOLDOWN_S": "5", "TTC_POOL__HEALTH_INTERVAL_S": "1",
               "TTC_POOL__RETRY_BACKOFF_S": "0.05"}
        log = open(LOG_DIR / "test-service.log", "ab")  # noqa: SIM115
        service = subprocess.Popen(
            [str(Path(sys.executable).parent / "ttc"), "serve", "--port", str(port),
             "--backend", a.url, "--backend", b.url, "--log-level", "info"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        url = f"http://127.0.0.1:{port}"
        _wait_http(url + "/health", service, 60)
        yield Stack(a, b, url, service)
        service.terminate()
        service.wait(15)
    finally:
        a.stop()
        b.stop()


def vllm_counter(url: str, name: str) -> float:
    """Sum of one vLLM Prometheus series (e.g. ``vllm:request_success_total``)."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
