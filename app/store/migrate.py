"""Schema migrations (Alembic), run programmatically at start-up: ``await upgrade(db)``.

Several replicas may start at once: on PostgreSQL the upgrade holds a transaction-scoped advisory
lock, on SQLite the ``BEGIN IMMEDIATE`` write lock, so exactly one of them migrates and the others
then find the schema at ``head``. DDL is transactional on both, so a crash mid-upgrade leaves the
previous revision intact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from app.store.db import Database

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
_LOCK_ID = 0x7C7C_0001


def alembic_config(connection: Any = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def _upgrade(sync_conn: Any) -> None:
    command.upgrade(alembic_config(sync_conn), "head")


def _current(sync_conn: Any) -> str | None:
    return MigrationContext.configure(sync_conn).get_current_revision()


async def upgrade(db: Database) -> None:
    """Bring the schema to the newest revision (a no-op when it is already there)."""
    async with db.write() as conn:
        if db.dialect == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_ID})
        await conn.run_sync(_upgrade)


async def current_revision(db: Database) -> str | None:
    async with db.read() as conn:
        return await conn.run_sync(_current)
