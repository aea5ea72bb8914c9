"""Runs last: stops vLLM server B mid-run; requests keep succeeding on A. Then all down -> 503."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.backends.launcher import free_port
from tests.integration.conftest import MODEL_NAME, Stack, _wait_http
from tests.support.metrics import sample

pytestmark = pytest.mark.stops_backend  # run after every other test (tests/conftest.py orders them)


def test_backend_stopped_mid_run(stack: Stack) -> None:
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "What is 3 + 4?"}],
            "max_tokens": 24, "ttc": {"policy": {"allocator": "fixed", "params": {"n": 2, "per_round": 1}}}}
    stopper = threading.Timer(1.5, stack.vllm_b.stop, kwargs={"grace_s": 5})
    stopper.start()
    statuses: list[int] = []

    def one() -> int:
        return httpx.post(stack.service_url + "/v1/chat/completions", json=body, timeout=120).status_code

    end = time.monotonic() + 8
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        while time.monotonic() < end:
            statuses += list(pool.map(lambda _: one(), range(4)))
    stopper.join()
    assert stack.vllm_b.proc is None  # B really is gone
    assert len(statuses) >= 8
    assert set(statuses) == {200}, statuses
    metrics = httpx.get(stack.service_url + "/metrics").text
    assert sample(metrics, "ttc_backend_errors_total", backend=stack.vllm_b.url) >= 1  # B's failures were seen


def test_all_backends_down_is_503(stack: Stack) -> None:
    port = free_port()
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ttc"), "serve", "--port", str(port),
         "--backend", dead[0], "--backend", dead[1]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc, 60)
        resp = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                          json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 503
        assert resp.json()["error"]["type"] == "service_unavailable"
        assert httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 503
    finally:
        proc.terminate()
        proc.wait(10)
