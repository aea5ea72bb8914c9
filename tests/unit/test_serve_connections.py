"""``ttc serve``'s connections, against the real process on a loopback port (fake backend): a request
head that never completes is closed within ``server.header_timeout_s``, idle connections beyond
``server.max_connections`` are closed oldest first so that a new client is still served, and what
``ttc serve`` says while it starts."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.config import ServerConfig, Settings
from app.serve import ConnectionGuard, install_guard, ready_line, say_starting
from ttc_tools.bench import procs


@contextlib.contextmanager
def serve(tmp_path: Path, backend: str, name: str, **server: object) -> Iterator[tuple[str, Path]]:
    """``ttc serve`` on a free loopback port with ``server`` settings; yields (URL, its output file)."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / f"{name}.log"
    env = {"TTC_STORE__URL": f"sqlite+aiosqlite:///{tmp_path}/{name}.db",
           **{f"TTC_SERVER__{k.upper()}": str(v) for k, v in server.items()}}
    cmd = [procs.ttc_exe(), "serve", "--port", str(port), "--backend", backend, "--log-level", "warning"]
    with procs.process(cmd, url + "/ready", env=env, log=log):
        yield url, log


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    with procs.fake_backend(1.0) as url:
        yield url


def _closed_within(sock: socket.socket, limit_s: float) -> float:
    """Seconds until the server closes ``sock`` (EOF or reset); fails past ``limit_s``."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    try:
        data = sock.recv(1024)
    except ConnectionResetError:
        data = b""
    assert data == b"", data
    return time.monotonic() - start


def _status(sock: socket.socket, timeout_s: float = 10) -> int:
    """Read one whole response (head and its content-length body) from ``sock``; its status code."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, body
        body += chunk
    return int(head.split(b" ", 2)[1])


def test_a_request_head_that_never_completes_is_closed(tmp_path: Path, backend: str) -> None:
    with serve(tmp_path, backend, "slow", header_timeout_s=1, keep_alive_timeout_s=5) as (url, log):
        port = int(url.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # never finished
        kept = socket.create_connection(("127.0.0.1", port))
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _status(kept) == 200
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 1")  # a second head on the kept-alive connection, stalled
        assert 0.5 < _closed_within(half, 10) < 5
        assert _closed_within(silent, 10) < 5
        assert _closed_within(kept, 10) < 5
        # an idle kept-alive connection outlives the head timeout (keep-alive is 5 s), and a request that
        # takes longer than it (the head was complete) is answered
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/health").status_code == 200
            time.sleep(1.5)  # the scenario, not a wait for something: idle past header_timeout_s (1 s)
            assert client.get("/health").status_code == 200
            assert client.get("/v1/models").status_code == 200
        with socket.create_connection(("127.0.0.1", port)) as slow_body:  # head complete, body late: not cut
            body = b'{"messages": [{"role": "user", "content": "What is 2 + 2?"}], "ttc": {"policy": "single"}}'
            slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"content-type: application/json\r\ncontent-length: " + str(len(body)).encode()
                              + b"\r\n\r\n" + body[:10])
            slow_body.settimeout(1.5)
            with pytest.raises(TimeoutError):
                slow_body.recv(1)  # still open after the head timeout
            slow_body.sendall(body[10:])
            assert _status(slow_body, 30) == 200
    assert "Traceback" not in log.read_text()


def test_idle_connections_beyond_the_cap_make_room_for_a_new_client(tmp_path: Path, backend: str) -> None:
    cap, idle = 16, 40
    with serve(tmp_path, backend, "cap", max_connections=cap, header_timeout_s=60) as (url, _log):
        port = int(url.rsplit(":", 1)[1])
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle)]
        try:
            t = time.monotonic()
            with httpx.Client(base_url=url, timeout=10) as client:
                assert client.get("/health").status_code == 200  # a fresh connection, the 41st
            assert time.monotonic() - t < 5
            # each connection beyond the cap closed the one idle longest: the oldest 25 of the 40
            evicted = idle + 1 - cap
            for s in socks[:evicted]:
                assert _closed_within(s, 10) < 10
            for s in socks[evicted:]:  # the newer ones are still open and still served
                s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert _status(s) == 200
        finally:
            for s in socks:
                s.close()


def test_websocket_upgrades_do_not_use_up_the_cap(tmp_path: Path, backend: str) -> None:
    """A connection handed to the WebSocket protocol leaves the guard's count (the service has no
    WebSocket route: each is refused), so more of them than the cap leave room for new clients."""
    cap = 16
    with serve(tmp_path, backend, "ws", max_connections=cap, header_timeout_s=60) as (url, _log):
        port = int(url.rsplit(":", 1)[1])
        for _ in range(cap + 8):
            with socket.create_connection(("127.0.0.1", port)) as ws:
                ws.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                           b"Sec-WebSocket-Version: 13\r\n\r\n")
                ws.settimeout(10)
                assert ws.recv(4096).startswith(b"HTTP/1.1 403")
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/health").status_code == 200


class _Conn:
    """Stands in for a protocol in :class:`ConnectionGuard`'s book-keeping."""

    def __init__(self) -> None:
        self.counted = False
        self.closed = False
        self.transport = self

    def close(self) -> None:
        self.closed = True


def test_the_guard_closes_the_longest_idle_first_and_refuses_when_all_are_busy() -> None:
    guard = ConnectionGuard(ServerConfig(), max_connections=2)
    a, b, c, d = _Conn(), _Conn(), _Conn(), _Conn()
    g: Any = guard
    assert g.opened(a) and g.opened(b)
    g.busy(a)
    g.busy(b)
    g.rested(a)  # a's response done: idle again
    assert g.opened(c) and a.closed and not b.closed and guard.open == 2
    g.busy(c)
    assert not g.opened(d) and d.closed and guard.refused == 1 and guard.open == 2  # b and c both busy
    g.forget(b)
    g.forget(b)  # counted once
    assert guard.open == 1


def test_the_cap_fits_under_the_open_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.serve

    monkeypatch.setattr(app.serve, "_guard", None)  # this process's guard comes back afterwards
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 1024))
    monkeypatch.setattr(resource, "setrlimit", lambda *_a: None)
    guard = install_guard(Settings())
    assert guard.max_connections == 1024 // 2  # 1024 less the reserve (768) is below half of it
    raised: list[Any] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 1 << 20))
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: raised.append(limits))
    assert install_guard(Settings()).max_connections == 4096
    assert raised == [(4096 + 512 + 256, 1 << 20)]


def test_serve_says_what_it_starts_and_where_it_serves(tmp_path: Path, backend: str) -> None:
    with serve(tmp_path, backend, "say") as (url, log):
        text = log.read_text()
    assert f"ttc: starting, backends: {backend} ..." in text
    assert f"ttc serving on {url} (console: {url}/ui, docs: {url}/docs)" in text
    assert text.index("ttc: starting") < text.index("ttc serving on")


def test_serve_names_the_engine_and_its_log_before_starting_it(tmp_path: Path) -> None:
    """No backend: the embedded engine's model and log file are said first (an engine that cannot
    start, /bin/false, ends the run at once instead of after a minute of vLLM start-up)."""
    port = procs.free_port()
    env = {**os.environ, "TTC_ENGINE__PYTHON": "/bin/false", "TTC_STORE__URL": f"sqlite+aiosqlite:///{tmp_path}/e.db"}
    done = subprocess.run([procs.ttc_exe(), "serve", "--port", str(port), "--log-level", "warning"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    first = done.stderr.splitlines()[0]
    assert first.startswith("ttc: starting the embedded vLLM engines: arith-llama (from ")
    assert f"log: {tmp_path / '.logs' / 'vllm-engine.log'})" in first


def test_the_lines_in_json_logs_and_for_workers(capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(host="::1", workers=2, ui={"enabled": False})
    line = ready_line(settings, 8123)
    assert line == f"ttc serving on http://[::1]:8123 (docs: http://[::1]:8123/docs; worker pid {os.getpid()} of 2)"
    import json
    import logging

    from app.logs import JsonFormatter

    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    saved = root.handlers[:]
    root.handlers[:] = [handler]
    try:
        say_starting(Settings(), Path("x.log"), json_logs=True)
    finally:
        root.handlers[:] = saved
    record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert record["logger"] == "ttc.serve" and record["model"] == "arith-llama"
    assert record["engine_log"] == str(Path("x.log").resolve())
