"""Real servers for the store / Redis / crash / topology tests, started and stopped by the test setup.

They come from :mod:`ttc_tools.bench.topology` (the local scale-out topology's parts):

* PostgreSQL: a private cluster (``initdb`` + ``pg_ctl``) in a temporary folder on a free loopback
  port, trust auth; as root it runs as the ``postgres`` system user (``runuser``).
* Redis: a private ``redis-server`` on a free loopback port, no persistence.
* Service processes: ``ttc serve`` subprocesses on free ports (for SIGKILL and multi-replica tests).

Binaries missing (``scripts/test-services.sh`` installs them) -> the tests are skipped, saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ttc_tools.bench import procs, topology
from ttc_tools.bench.procs import free_port, wait_port
from ttc_tools.bench.topology import MissingBinary, Postgres, Service

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "Postgres", "Service", "free_port", "wait_port"]


def _require(check: Any) -> None:
    try:
        check()
    except MissingBinary as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    _require(topology.postgres_bindir)
    with topology.postgres_cluster() as pg:  # its own temporary folder: not under pytest's 0700 root-only tree
        yield pg


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _require(topology.redis_exe)
    with topology.redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Any]:
    """``services(config, env=None)``: a :class:`Service` (not started) whose YAML is ``config``; all are
    stopped after the test."""
    started: list[Service] = []

    def make(config: dict[str, Any], env: dict[str, str] | None = None) -> Service:
        svc = Service(tmp_path, config, env, cwd=REPO)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def fake_backend() -> Iterator[str]:
    with procs.fake_backend(1) as url:
        yield str(url)
