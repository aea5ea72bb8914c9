"""Real servers for the store / Redis / crash tests, started and stopped by the test setup.

* PostgreSQL: a private cluster (``initdb`` + ``pg_ctl``) in a temporary folder on a free loopback
  port, trust auth; as root it runs as the ``postgres`` system user (``runuser``).
* Redis: a private ``redis-server`` on a free loopback port, no persistence.
* Service processes: ``ttc serve`` subprocesses on free ports (for SIGKILL and multi-replica tests).

Binaries missing (``scripts/test-services.sh`` installs them) -> the tests are skipped, saying why.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port} after {timeout} s")


@dataclass
class Postgres:
    host: str
    port: int

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+asyncpg://postgres@{self.host}:{self.port}/{db}"

    def create_db(self) -> str:
        name = f"t_{uuid.uuid4().hex[:10]}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def psql(self, sql: str) -> None:
        subprocess.run(["psql", "-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                        "-v", "ON_ERROR_STOP=1", "-qc", sql], check=True, capture_output=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found or not shutil.which("psql"):
        pytest.skip("PostgreSQL binaries missing: run scripts/test-services.sh (apt-get install postgresql)")
    bindir = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="ttc-pg-"))  # not under pytest's 0700 root-only tree
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200"
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-o", opts,
                    "-w", "-t", "60", "start"], check=True, capture_output=True)
    try:
        yield Postgres("127.0.0.1", port)
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server missing: run scripts/test-services.sh (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 20, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


class Service:
    """A ``ttc serve`` subprocess with a YAML config."""

    def __init__(self, workdir: Path, config: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.config_path = workdir / f"ttc-{self.port}.yaml"
        self.config_path.write_text(yaml.safe_dump({**config, "port": self.port}))
        self.log = workdir / f"ttc-{self.port}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TTC_STORE__")}
        self.env.update(env or {})  # the YAML names the store: drop the in-memory default of the tests
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Service:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "from app.cli import main; main()", "serve", "--config",
                 str(self.config_path), "--log-level", "warning"],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 90) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"service not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Any]:
    started: list[Service] = []

    def make(config: dict[str, Any], env: dict[str, str] | None = None) -> Service:
        svc = Service(tmp_path, config, env)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def fake_backend() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from app.cli import main; main()", "fake-backend", "--port",
                             str(port), "--latency-ms", "1"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_port(port, 90, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)

