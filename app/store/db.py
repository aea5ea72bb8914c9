"""Engines for the store: SQLite (default, WAL, ``synchronous=FULL``) or PostgreSQL (asyncpg).

Durability contract: a write the service acknowledged has been committed, and a committed
transaction survives ``SIGKILL`` of the process (SQLite: WAL + ``synchronous=FULL`` fsyncs the WAL
at every commit; PostgreSQL: its own WAL with ``synchronous_commit`` on).

SQLite has one writer at a time. Read transactions use a plain deferred ``BEGIN``; write
transactions go through :attr:`Database.writer`, whose ``BEGIN IMMEDIATE`` takes the write lock up
front, so a read-then-write transaction never fails with ``SQLITE_BUSY`` half-way (other processes
wait up to ``busy_timeout``). On PostgreSQL both are the same engine and writers lock rows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

SQLITE_BUSY_TIMEOUT_MS = 30_000


def _sqlite_hooks(engine: AsyncEngine, begin: str) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cur = dbapi_connection.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)


class Database:
    """The store's engines. ``async with db.read() as conn`` / ``async with db.write() as conn``
    run one transaction (committed on exit, rolled back on an exception)."""

    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.is_sqlite = self.dialect == "sqlite"
        memory = self.memory = self.is_sqlite and parsed.database in (None, "", ":memory:")
        if memory:  # one shared connection (tests, throw-away runs): nothing persists
            self.engine = self.writer = create_async_engine(url, echo=echo)
            _sqlite_hooks(self.engine, "BEGIN")
        elif self.is_sqlite:
            Path(str(parsed.database)).parent.mkdir(parents=True, exist_ok=True)
            self.engine = create_async_engine(url, echo=echo)
            self.writer = create_async_engine(url, echo=echo, pool_size=1, max_overflow=0)
            _sqlite_hooks(self.engine, "BEGIN")
            _sqlite_hooks(self.writer, "BEGIN IMMEDIATE")
        else:
            self.engine = create_async_engine(url, echo=echo, pool_pre_ping=True)
            self.writer = self.engine
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        self._read_lock = self._write_lock if memory else None

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        if self._read_lock is None:
            async with self.engine.begin() as conn:
                yield conn
            return
        async with self._read_lock, self.engine.begin() as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        if self._write_lock is None:
            async with self.writer.begin() as conn:
                yield conn
            return
        async with self._write_lock, self.writer.begin() as conn:
            yield conn

    async def close(self) -> None:
        await self.engine.dispose()
        if self.writer is not self.engine:
            await self.writer.dispose()
