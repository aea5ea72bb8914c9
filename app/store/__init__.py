"""The store: policies with versions, settings, API keys and recorded traffic (SQLAlchemy 2, async).

``open_store(settings)`` builds the engines and runs the migrations; the service does it in its
lifespan and the admin CLI before each command.
"""

from app.store.db import Database
from app.store.migrate import upgrade
from app.store.repo import DEFAULT_POLICY_KEY, ApiKey, PolicyVersion, Store

__all__ = ["DEFAULT_POLICY_KEY", "ApiKey", "Database", "PolicyVersion", "Store", "open_store", "upgrade"]


async def open_store(url: str, *, echo: bool = False, migrate: bool = True) -> Store:
    """Connect to ``url`` and (by default) bring its schema to the newest revision."""
    db = Database(url, echo=echo)
    try:
        if migrate:
            await upgrade(db)
    except BaseException:
        await db.close()
        raise
    return Store(db)
