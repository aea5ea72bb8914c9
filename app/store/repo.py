"""Data access for policies (with immutable versions), settings, API keys and recordings.

Every write is one transaction; when a method returns, the write is committed (durable, see
:mod:`app.store.db`). Policy versions are never updated or removed: an update appends version
``latest + 1`` and a delete only marks the policy deleted (its versions stay in the database).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.errors import Conflict, NotFound
from app.store.batches import BatchStore
from app.store.db import Database
from app.store.models import ApiKeyRow, PolicyRow, PolicyVersionRow, RecordingRow, SettingRow

P = cast(Table, PolicyRow.__table__)
V = cast(Table, PolicyVersionRow.__table__)
S = cast(Table, SettingRow.__table__)
K = cast(Table, ApiKeyRow.__table__)
R = cast(Table, RecordingRow.__table__)

DEFAULT_POLICY_KEY = "default_policy"


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    name: str
    version: int
    spec: dict[str, Any]
    description: str | None
    created_at: float
    created_by: str | None
    latest_version: int
    source: str

    def view(self) -> dict[str, Any]:
        return {"object": "policy", "name": self.name, "version": self.version,
                "latest_version": self.latest_version, "description": self.description, "spec": self.spec,
                "source": self.source, "created_at": self.created_at, "created_by": self.created_by}


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    name: str | None
    role: str
    hash: str
    default_policy: str | None
    requests_per_minute: int | None
    samples_per_minute: int | None
    created_at: float
    revoked_at: float | None

    def view(self) -> dict[str, Any]:
        return {"object": "api_key", "id": self.id, "name": self.name, "role": self.role,
                "default_policy": self.default_policy, "requests_per_minute": self.requests_per_minute,
                "samples_per_minute": self.samples_per_minute, "created_at": self.created_at,
                "revoked": self.revoked_at is not None, "revoked_at": self.revoked_at}


def _not_found(name: str, version: int | None = None) -> NotFound:
    what = f"Policy {name!r}" + (f" version {version}" if version is not None else "")
    return NotFound(f"{what} does not exist.", param="version" if version is not None else "name",
                    code="policy_not_found")


class Store:
    """Repository over a :class:`~app.store.db.Database` (async, one transaction per method)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.batches = BatchStore(db)

    # -- policies ---------------------------------------------------------------------------------

    async def _head(self, conn: AsyncConnection, name: str, lock: bool = False) -> Any:
        q = select(P).where(P.c.name == name)
        if lock:
            q = q.with_for_update()
        return (await conn.execute(q)).first()

    async def _version(self, conn: AsyncConnection, head: Any, version: int) -> PolicyVersion | None:
        row = (await conn.execute(select(V).where(V.c.name == head.name, V.c.version == version))).first()
        if row is None:
            return None
        return PolicyVersion(row.name, row.version, row.spec, row.description, row.created_at, row.created_by,
                             head.latest_version, head.source)

    async def get_policy(self, name: str, version: int | None = None) -> PolicyVersion:
        """The latest (or the given) version of a live policy; :class:`NotFound` otherwise."""
        async with self.db.read() as conn:
            head = await self._head(conn, name)
            if head is None or head.deleted:
                raise _not_found(name)
            found = await self._version(conn, head, version or head.latest_version)
        if found is None:
            raise _not_found(name, version)
        return found

    async def list_policies(self) -> list[PolicyVersion]:
        """The latest version of every live policy, by name."""
        async with self.db.read() as conn:
            rows = (await conn.execute(
                select(V, P.c.latest_version, P.c.source)
                .join(P, (P.c.name == V.c.name) & (P.c.latest_version == V.c.version))
                .where(P.c.deleted.is_(False)).order_by(V.c.name))).all()
        return [PolicyVersion(r.name, r.version, r.spec, r.description, r.created_at, r.created_by,
                              r.latest_version, r.source) for r in rows]

    async def list_versions(self, name: str) -> list[PolicyVersion]:
        async with self.db.read() as conn:
            head = await self._head(conn, name)
            if head is None or head.deleted:
                raise _not_found(name)
            rows = (await conn.execute(select(V).where(V.c.name == name).order_by(V.c.version))).all()
        return [PolicyVersion(r.name, r.version, r.spec, r.description, r.created_at, r.created_by,
                              head.latest_version, head.source) for r in rows]

    async def put_policy(
        self, name: str, spec: dict[str, Any], *, description: str | None = None, created_by: str | None = None,
        source: str = "api", create_only: bool = False, update_only: bool = False,
        expected_version: int | None = None,
    ) -> PolicyVersion:
        """Append a version (creating the policy, or reviving a deleted one, as needed).

        ``create_only``: :class:`Conflict` when a live policy has this name. ``update_only``:
        :class:`NotFound` when none does. ``expected_version``: :class:`Conflict` unless the latest
        version is that one (optimistic concurrency for read-modify-write clients).
        """
        for attempt in range(3):  # two first writers of a new name: the loser retries (and sees the row)
            try:
                return await self._put_policy(name, spec, description, created_by, source, create_only,
                                              update_only, expected_version)
            except IntegrityError:
                if attempt == 2:
                    raise Conflict(f"Policy {name!r} is being written concurrently; retry.", param="name",
                                   code="write_conflict") from None
        raise AssertionError("unreachable")

    async def _put_policy(self, name: str, spec: dict[str, Any], description: str | None, created_by: str | None,
                          source: str, create_only: bool, update_only: bool,
                          expected_version: int | None) -> PolicyVersion:
        now = time.time()
        async with self.db.write() as conn:
            head = await self._head(conn, name, lock=True)
            live = head is not None and not head.deleted
            if create_only and live:
                raise Conflict(f"Policy {name!r} already exists; PUT or PATCH it to add a version.",
                               param="name", code="policy_exists")
            if update_only and not live:
                raise _not_found(name)
            if expected_version is not None and (not live or head.latest_version != expected_version):
                current = head.latest_version if live else None
                raise Conflict(f"Policy {name!r} is at version {current}, not {expected_version}.",
                               param="expected_version", code="version_conflict")
            version = 1 if head is None else head.latest_version + 1
            if head is None:
                await conn.execute(P.insert().values(name=name, latest_version=version, deleted=False,
                                                     source=source, created_at=now, updated_at=now))
            else:
                await conn.execute(P.update().where(P.c.name == name).values(
                    latest_version=version, deleted=False, updated_at=now,
                    **({} if live else {"source": source})))
            await conn.execute(V.insert().values(name=name, version=version, spec=spec, description=description,
                                                 created_at=now, created_by=created_by))
            src = head.source if live else source
        return PolicyVersion(name, version, spec, description, now, created_by, version, src)

    async def delete_policy(self, name: str) -> None:
        """Mark a policy deleted (its versions stay) and unbind it from keys."""
        async with self.db.write() as conn:
            head = await self._head(conn, name, lock=True)
            if head is None or head.deleted:
                raise _not_found(name)
            await conn.execute(P.update().where(P.c.name == name).values(deleted=True, updated_at=time.time()))
            await conn.execute(K.update().where(K.c.default_policy == name).values(default_policy=None))

    async def deleted_policy_names(self) -> set[str]:
        async with self.db.read() as conn:
            return set((await conn.execute(select(P.c.name).where(P.c.deleted.is_(True)))).scalars())

    # -- settings ---------------------------------------------------------------------------------

    async def get_setting(self, key: str) -> str | None:
        async with self.db.read() as conn:
            return (await conn.execute(select(S.c.value).where(S.c.key == key))).scalar()

    async def set_setting(self, key: str, value: str) -> None:
        for attempt in range(3):
            try:
                async with self.db.write() as conn:
                    done = await conn.execute(update(S).where(S.c.key == key).values(value=value))
                    if not done.rowcount:
                        await conn.execute(S.insert().values(key=key, value=value))
                return
            except IntegrityError:  # a concurrent first insert won: update it next time round
                if attempt == 2:
                    raise

    # -- API keys ---------------------------------------------------------------------------------

    async def add_key(self, key: ApiKey) -> None:
        async with self.db.write() as conn:
            await conn.execute(K.insert().values(
                id=key.id, name=key.name, role=key.role, hash=key.hash, default_policy=key.default_policy,
                requests_per_minute=key.requests_per_minute, samples_per_minute=key.samples_per_minute,
                created_at=key.created_at, revoked_at=key.revoked_at))

    async def get_key(self, key_id: str) -> ApiKey | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(K).where(K.c.id == key_id))).first()
        return None if row is None else ApiKey(**row._mapping)

    async def list_keys(self, include_revoked: bool = False) -> list[ApiKey]:
        q = select(K).order_by(K.c.created_at)
        if not include_revoked:
            q = q.where(K.c.revoked_at.is_(None))
        async with self.db.read() as conn:
            return [ApiKey(**r._mapping) for r in (await conn.execute(q)).all()]

    async def revoke_key(self, key_id: str) -> ApiKey:
        async with self.db.write() as conn:
            await conn.execute(K.update().where(K.c.id == key_id, K.c.revoked_at.is_(None))
                               .values(revoked_at=time.time()))
            row = (await conn.execute(select(K).where(K.c.id == key_id))).first()
        if row is None:
            raise NotFound(f"API key {key_id!r} does not exist.", param="key_id", code="key_not_found")
        return ApiKey(**row._mapping)

    async def keys_bound_to(self, policy: str) -> list[str]:
        async with self.db.read() as conn:
            q = select(K.c.id).where(K.c.default_policy == policy, K.c.revoked_at.is_(None))
            return list((await conn.execute(q)).scalars())

    # -- recordings -------------------------------------------------------------------------------

    async def add_recordings(self, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            async with self.db.write() as conn:
                await conn.execute(R.insert(), list(rows))

    async def recordings(self, since: float | None = None, until: float | None = None,
                         policy: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        q = select(R).order_by(R.c.id)
        if since is not None:
            q = q.where(R.c.created_at >= since)
        if until is not None:
            q = q.where(R.c.created_at < until)
        if policy is not None:
            q = q.where(R.c.policy_name == policy)
        if limit is not None:
            q = q.limit(limit)
        async with self.db.read() as conn:
            return [dict(r._mapping) for r in (await conn.execute(q)).all()]

    async def count_recordings(self) -> int:
        async with self.db.read() as conn:
            return int((await conn.execute(select(func.count()).select_from(R))).scalar() or 0)
