"""Admin commands read a store whose schema is current without taking its write lock (a running
service's writes no longer hold ``ttc policy list`` up), and still migrate a store that is behind."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import typer
from typer.testing import CliRunner

from tests.support.cli import app_of


def _cli() -> typer.Typer:
    from app.admin_cli import register

    return app_of(register)


def test_policy_list_does_not_wait_for_the_write_lock(tmp_path: Path) -> None:
    db = tmp_path / "ttc.db"
    url = ["--store-url", f"sqlite+aiosqlite:///{db}"]
    cli = _cli()
    created = CliRunner().invoke(cli, ["policy", "create", "two", "--spec", '{"allocator": "fixed"}', *url])
    assert created.exit_code == 0, created.output  # a fresh file: migrated to head on first use
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # as a service in the middle of a write transaction
    try:
        t = time.monotonic()
        listed = CliRunner().invoke(cli, ["policy", "list", *url])
        elapsed = time.monotonic() - t
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert listed.exit_code == 0, listed.output
    assert "two v1" in listed.output
    assert elapsed < 10  # an upgrade would have waited for the lock (busy timeout 30 s), then failed
