"""Real vLLM CPU servers and a real service process, started once per test session.

Two vLLM servers serve the bundled demo model (or ``TTC_TEST_MODEL_DIR``) on loopback: A is the
embedded engine of a ``ttc serve`` started with no backend (the ``make serve`` path), B is started
directly. A second ``ttc serve`` fronts both. B is stopped by the failover test, which therefore
runs last (``test_zz_failover.py``). The embedded service also starts the bundled engines beside A,
as ``make serve`` does: the thinking model (``arith-thinker``, with vLLM's reasoning parser) and the
process reward model (``arith-prm``, pooling), on ports the tests know so they can read vLLM's own
counters.
"""

from __future__ import annotations

import asyncio
import json
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
from app.config import REPO_ROOT, EngineConfig, bundled_engines

LOG_DIR = REPO_ROOT / ".logs"
MODEL_NAME = "arith-llama"


def model_dir() -> Path:
    return Path(os.environ.get("TTC_TEST_MODEL_DIR", REPO_ROOT / "models" / "arith-llama"))


@dataclass
class Stack:
    embedded_url: str  # `ttc serve` with no backend: it started vLLM A itself
    vllm_a_url: str
    vllm_b: EmbeddedEngine
    service_url: str  # `ttc serve --backend A --backend B`
    thinker_url: str  # the embedded service's arith-thinker engine
    prm_url: str  # the embedded service's arith-prm engine


def _engine(name: str) -> EmbeddedEngine:
    """A second vLLM server. It starts while the embedded one does: on a fresh machine both compile
    the model at once, and engines sharing one torch.compile cache race on it (a known vLLM failure
    mode), so this one compiles into caches of its own."""
    cfg = EngineConfig(model_dir=model_dir(), served_model_name=MODEL_NAME)
    LOG_DIR.mkdir(exist_ok=True)
    cache = LOG_DIR / f"cache-{name}"
    env = {"VLLM_CACHE_ROOT": str(cache / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    return EmbeddedEngine(cfg, log_path=LOG_DIR / f"test-vllm-{name}.log", env=env)


def _tail(*logs: Path, lines: int = 40) -> str:
    """The last lines of each log that exists (so a CI failure says why a server did not start)."""
    out = []
    for log in logs:
        if log.exists():
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name} (last {len(text)} lines) ---\n" + "\n".join(text))
    return "\n".join(out)


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float, *logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}\n{_tail(*logs)}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not up after {timeout}s\n{_tail(*logs)}")


def _serve(port: int, backends: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
    cmd = [str(Path(sys.executable).parent / "ttc"), "serve", "--port", str(port), "--log-level", "info"]
    for b in backends:
        cmd += ["--backend", b]
    log = open(LOG_DIR / log_name, "ab")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})


def _port_open(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        return True
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    LOG_DIR.mkdir(exist_ok=True)
    port_a, port_embedded, port_service = free_port(), free_port(), free_port()
    extra = {e.served_model_name: e.model_copy(update={"port": free_port()}) for e in bundled_engines()}
    started = time.monotonic()
    embedded = _serve(port_embedded, [], {"TTC_ENGINE__PORT": str(port_a), "TTC_ENGINE__MODEL_DIR": str(model_dir()),
                                          "TTC_ENGINE__SERVED_MODEL_NAME": MODEL_NAME,
                                          "TTC_EXTRA_ENGINES": json.dumps([e.model_dump(mode="json")
                                                                           for e in extra.values()])},
                      "test-service-embedded.log")
    b = _engine("b")
    b.start()
    service = None
    try:
        embedded_url = f"http://127.0.0.1:{port_embedded}"
        _wait_http(embedded_url + "/ready", embedded, 900, LOG_DIR / "test-service-embedded.log",
                   REPO_ROOT / ".logs" / "vllm-engine.log", LOG_DIR / "test-vllm-b.log")
        asyncio.run(b.wait_ready())
        a_url = f"http://127.0.0.1:{port_a}"
        print(f"\n[integration] vLLM CPU servers up in {time.monotonic() - started:.0f}s: embedded A {a_url}, "
              f"B {b.url} (model {model_dir()})", file=sys.stderr)
        env = {"TTC_POOL__COOLDOWN_S": "5", "TTC_POOL__HEALTH_INTERVAL_S": "1", "TTC_POOL__RETRY_BACKOFF_S": "0.05"}
        service = _serve(port_service, [a_url, b.url], env, "test-service.log")
        url = f"http://127.0.0.1:{port_service}"
        _wait_http(url + "/ready", service, 60, LOG_DIR / "test-service.log")  # answer workers warm too
        yield Stack(embedded_url, a_url, b, url, f"http://127.0.0.1:{extra['arith-thinker'].port}",
                    f"http://127.0.0.1:{extra['arith-prm'].port}")
    finally:
        for proc in (service, embedded):
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        b.stop()
    # the embedded engine is the service's child: stopping the service must stop it too
    assert not _port_open(port_a), "embedded vLLM engine still answering after the service stopped"


def vllm_counter(url: str, name: str, label: str = "") -> float:
    """Sum of one Prometheus series of a vLLM server, over the lines that contain ``label``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def generated_tokens(*urls: str) -> float:
    """vLLM's generation counter summed over the engines at ``urls``."""
    return sum(vllm_counter(u, "vllm:generation_tokens_total") for u in urls)


def generated_since(before: float, at_least: int, *urls: str, timeout_s: float = 10.0) -> int:
    """The tokens the engines at ``urls`` generated since their counter read ``before``, read once
    it has grown by at least ``at_least`` or after ``timeout_s`` (vLLM counts an iteration's tokens
    just after it sends them, so a finished response can be ahead of the counter for a moment)."""
    deadline = time.monotonic() + timeout_s
    while generated_tokens(*urls) - before < at_least and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the counter, not standing in for an event
    return int(generated_tokens(*urls) - before)
