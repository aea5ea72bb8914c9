"""The Alembic revisions build exactly the schema the models declare (no drift between them)."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.store import open_store
from app.store.models import metadata


async def test_migrations_match_the_models() -> None:
    store = await open_store("sqlite+aiosqlite://")
    try:
        def diff(sync_conn: Any) -> list[Any]:
            return list(compare_metadata(MigrationContext.configure(sync_conn), metadata))

        async with store.db.read() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await store.db.close()
