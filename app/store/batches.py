"""Batches in the store: the row every replica reads, the samples a batch has drawn, and its lease.

A background batch is run by one replica at a time, the holder of its **lease**
(``lease_owner``, ``lease_until``: wall-clock seconds). The holder renews the lease while it runs
and writes a checkpoint after every round (every finished sample in the stream schedule): the new
samples, one row per (prompt, slot), and the progress, in one transaction that succeeds only while
it still holds the lease (a fencing check: a replica that lost its lease can write nothing more).
A batch whose lease ran out (its replica died) is claimed by another replica with a compare-and-set
on the lease; the claimer resumes from the samples in the store. The primary key of a sample row
(batch, prompt, slot) makes drawing a slot twice a constraint violation, not a silent double count.

Every method is one transaction (committed on return, see :mod:`app.store.db`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, case, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.db import Database
from app.store.models import BatchRow, BatchSampleRow

B = cast(Table, BatchRow.__table__)
BS = cast(Table, BatchSampleRow.__table__)

ACTIVE = ("queued", "in_progress")
"""Statuses of a batch that still has work to do (and a lease)."""


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    owner: str | None
    owner_role: str
    status: str
    created_at: float
    updated_at: float
    request: dict[str, Any]
    policy: dict[str, Any]
    prompts: int
    budget_samples: int
    progress: dict[str, Any]
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    lease_owner: str | None
    lease_until: float | None
    cancel_requested: bool
    takeovers: int

    def view(self, *, results: bool = True) -> dict[str, Any]:
        """The API's batch object (``results``: with the per-prompt results once completed)."""
        prog = self.progress
        out: dict[str, Any] = {
            "id": self.id, "object": "ttc.batch", "status": self.status, "created": int(self.created_at),
            "policy": self.policy,
            "progress": {"rounds": prog.get("rounds", 0), "samples_drawn": prog.get("samples_drawn", 0),
                         "samples_cancelled": prog.get("samples_cancelled", 0),
                         "budget_samples": self.budget_samples, "prompts": self.prompts},
            "cancel_requested": self.cancel_requested, "takeovers": self.takeovers,
        }
        if self.result is not None:
            out.update(self.result if results else {"summary": self.result.get("summary")})
        if self.error is not None:
            out["error"] = self.error
        return out


def _record(row: Any) -> BatchRecord:
    return BatchRecord(**row._mapping)


class BatchStore:
    """Repository of batches over a :class:`~app.store.db.Database`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def insert(self, **values: Any) -> None:
        now = time.time()
        async with self.db.write() as conn:
            await conn.execute(B.insert().values(created_at=now, updated_at=now, cancel_requested=False, takeovers=0,
                                                 **values))

    async def get(self, batch_id: str) -> BatchRecord | None:
        async with self.db.read() as conn:
            return await _get(conn, batch_id)

    async def page(self, owner: str | None, *, everyone: bool, limit: int,
                   before: float | None = None) -> list[BatchRecord]:
        """Newest first; ``everyone`` (admins) or the batches of ``owner``; ``before``: a ``created_at``
        cursor (the last one of the previous page)."""
        q = select(B).order_by(B.c.created_at.desc(), B.c.id.desc()).limit(limit)
        if not everyone:
            q = q.where(B.c.owner == owner) if owner is not None else q.where(B.c.owner.is_(None))
        if before is not None:
            q = q.where(B.c.created_at < before)
        async with self.db.read() as conn:
            return [_record(r) for r in (await conn.execute(q)).all()]

    async def active_of(self, owner: str) -> list[str]:
        """The ids of ``owner``'s batches that are queued or running."""
        q = select(B.c.id).where((B.c.owner == owner) & B.c.status.in_(ACTIVE))
        async with self.db.read() as conn:
            return [r[0] for r in (await conn.execute(q)).all()]

    async def samples(self, batch_id: str) -> dict[str, list[dict[str, Any]]]:
        """The batch's checkpointed samples per prompt, in slot order."""
        q = select(BS.c.query_id, BS.c.data).where(BS.c.batch_id == batch_id).order_by(BS.c.query_id, BS.c.seq)
        out: dict[str, list[dict[str, Any]]] = {}
        async with self.db.read() as conn:
            for qid, data in (await conn.execute(q)).all():
                out.setdefault(qid, []).append(data)
        return out

    @staticmethod
    def _held(replica: str, *ids: str) -> Any:
        """Active batches among ``ids`` whose lease ``replica`` holds."""
        return B.c.id.in_(ids) & (B.c.lease_owner == replica) & B.c.status.in_(ACTIVE)

    @staticmethod
    def _lapsed(now: float) -> Any:
        """Active batches nobody holds a live lease on (never started, or their replica is gone)."""
        return B.c.status.in_(ACTIVE) & (B.c.lease_until.is_(None) | (B.c.lease_until < now))

    async def checkpoint(self, batch_id: str, replica: str, samples: Sequence[tuple[str, int, dict[str, Any]]],
                         progress: dict[str, Any], lease_until: float) -> bool | None:
        """Write new samples and the progress, renewing the lease; only while ``replica`` holds it.
        Returns ``None`` when it does not (the batch was taken over or ended), else whether a cancel
        was requested."""
        async with self.db.write() as conn:
            done = await conn.execute(update(B).where(self._held(replica, batch_id)).values(
                status="in_progress", progress=progress, lease_until=lease_until, updated_at=time.time()))
            if not done.rowcount:
                return None
            if samples:
                await conn.execute(BS.insert(), [{"batch_id": batch_id, "query_id": q, "seq": s, "data": d}
                                                 for q, s, d in samples])
            return bool((await conn.execute(select(B.c.cancel_requested).where(B.c.id == batch_id))).scalar())

    async def finish(self, batch_id: str, replica: str, status: str, *, progress: dict[str, Any] | None = None,
                     result: dict[str, Any] | None = None, error: dict[str, Any] | None = None) -> bool:
        """End a batch the replica holds (completed, failed or cancelled); ``False``: it does not hold it."""
        values: dict[str, Any] = {"status": status, "result": result, "error": error, "lease_owner": None,
                                  "lease_until": None, "updated_at": time.time()}
        if progress is not None:
            values["progress"] = progress
        async with self.db.write() as conn:
            return bool((await conn.execute(update(B).where(self._held(replica, batch_id)).values(**values))).rowcount)

    async def renew(self, replica: str, ids: Sequence[str], lease_until: float) -> dict[str, bool]:
        """Extend the leases ``replica`` still holds among ``ids``; returns them with their cancel flags
        (an id missing from the answer was lost: taken over, or ended elsewhere)."""
        if not ids:
            return {}
        held = self._held(replica, *ids)
        async with self.db.write() as conn:
            await conn.execute(update(B).where(held).values(lease_until=lease_until))
            rows = (await conn.execute(select(B.c.id, B.c.cancel_requested).where(held))).all()
        return {r.id: bool(r.cancel_requested) for r in rows}

    async def release(self, replica: str, ids: Sequence[str]) -> None:
        """Give up leases at once (a graceful shutdown): another replica may take the batches now."""
        if ids:
            async with self.db.write() as conn:
                await conn.execute(update(B).where(self._held(replica, *ids)).values(lease_until=0.0))

    async def claim_expired(self, replica: str, now: float, lease_until: float,
                            limit: int) -> list[tuple[BatchRecord, str | None]]:
        """Take up to ``limit`` active batches whose lease ran out, or that nobody started (oldest
        first), each with the replica that held it before (``None``: a queued batch). Each claim is a
        compare-and-set on the lease, so of replicas racing for a batch exactly one wins it; taking a
        batch from a replica counts in ``takeovers``."""
        expired = self._lapsed(now)
        async with self.db.read() as conn:
            found = (await conn.execute(select(B.c.id, B.c.lease_owner).where(expired).order_by(B.c.created_at)
                                        .limit(limit))).all()
        won = []
        for batch_id, before in found:
            async with self.db.write() as conn:
                done = await conn.execute(update(B).where((B.c.id == batch_id) & expired).values(
                    lease_owner=replica, lease_until=lease_until, updated_at=time.time(),
                    takeovers=case((B.c.lease_owner.is_(None), B.c.takeovers), else_=B.c.takeovers + 1)))
                claimed = await _get(conn, batch_id) if done.rowcount else None
            if claimed is not None:
                won.append((claimed, before))
        return won

    async def delete(self, batch_id: str) -> None:
        """Remove a batch and its samples. A replica still running it finds its lease gone at its next
        checkpoint and stops without writing."""
        async with self.db.write() as conn:
            await conn.execute(BS.delete().where(BS.c.batch_id == batch_id))
            await conn.execute(B.delete().where(B.c.id == batch_id))

    async def request_cancel(self, batch_id: str, now: float) -> None:
        """Ask for a batch to stop. One that nobody runs (lease gone) is cancelled at once; the holder
        of a live lease sees the flag at its next checkpoint or renewal and stops its backend calls."""
        async with self.db.write() as conn:
            await conn.execute(update(B).where((B.c.id == batch_id) & B.c.status.in_(ACTIVE)).values(
                cancel_requested=True, updated_at=now))
            await conn.execute(update(B).where((B.c.id == batch_id) & self._lapsed(now)).values(
                status="cancelled", lease_owner=None, lease_until=None))


async def _get(conn: AsyncConnection, batch_id: str) -> BatchRecord | None:
    row = (await conn.execute(select(B).where(B.c.id == batch_id))).first()
    return None if row is None else _record(row)
