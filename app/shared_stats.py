"""Exact cross-replica learning of shared allocators (``shared = True``, e.g. ``difficulty``) via Redis.

**The log.** Per policy version there is one Redis stream, ``<prefix>:learn:<name>:<version>:<spec
hash>`` (capped at about ``maxlen`` entries). Each entry is the finished query states of one run and
its *position* ``n`` = 1, 2, 3, ... (``<stream>:seq``, incremented in the same Lua script as the
``XADD``, so stream order and positions agree). The stream order is the one total order of learning.

**Consistency model.** Every replica applies the log to its allocator instance with
``allocator.learn`` in that order, entry by entry, its *own* entries included: a replica never learns
its examples locally first. The state of an instance is therefore always the fold of a prefix of the
log, 1..``n`` (:meth:`SharedLearning.position`), from one origin state, so two replicas at the same
position hold bit-identical states (the allocators' ``state_dict`` contract), equal to what a single
replica fed the same runs in that order would hold. What may differ is only *how far* each has got
(lag): a replica pulls before planning with the allocator (:meth:`pull`, from
:meth:`app.prepare.Preparer.parts_for`) and, after a run, publishes its entry and then pulls up to and
including it (:meth:`learn`), so its next request sees its own run and everything ordered before it;
another replica's later entries arrive at its next pull.

**Snapshots.** Every ``snapshot_every`` positions (default 1000, at most ``maxlen / 10`` so a snapshot
always exists inside the capped stream) the replica that applies such a position writes
``{n, stream id, state_dict}`` to ``<stream>:snapshot`` unless that already holds a later position
(Lua: only newer wins). The first instance ever to pull writes the origin (position 0: its initial
state, so replicas agree even if their seeds differ). An instance that has never pulled (a fresh
process, or one rebuilt after eviction from :class:`~app.policy.PartsCache`) loads the snapshot and
pulls the rest; so does one that finds positions missing (trimmed before it got to them). Progress is
tracked per allocator *instance* (weakly), never per stream. When even the snapshot does not reach the
stream's first entry, the missing positions are lost: a warning says so and the instance goes on
without them (it then differs from replicas that applied them).

**Without Redis** nothing is shared: each process learns its own runs locally, in its own order.
**When Redis fails** at publish, the replica learns that run locally with a warning (it diverges: the
example is not in the log); at its next successful pull it rebuilds the instance from the snapshot and
the log (re-converging, and dropping what it learned alone). A failed pull after a successful
publish only delays: the entry is in the log and the next pull applies it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from allocators import Allocator, QueryState, Sample
from app.policy import PolicySnapshot

log = logging.getLogger("ttc.shared")

_APPEND = """
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('SET', KEYS[2], redis.call('XLEN', KEYS[1])) end
local n = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'n', n, 'r', ARGV[2], 's', ARGV[3])
return {n, id}
"""
"""Append one entry at the next position (a stream written before positions existed counts from XLEN)."""

_SNAPSHOT = """
local have = tonumber(redis.call('HGET', KEYS[1], 'n') or '-1')
if tonumber(ARGV[1]) <= have then return 0 end
redis.call('HSET', KEYS[1], 'n', ARGV[1], 'id', ARGV[2], 'state', ARGV[3])
return 1
"""
"""Store a snapshot unless the stored one is at the same or a later position."""


def encode_states(states: Sequence[QueryState]) -> str:
    return json.dumps([
        {"id": st.id, "cap": st.cap, "f": dict(st.features), "p": st.prior_difficulty,
         "s": [[s.answer, s.score, s.tokens, s.logprob, s.truncated, s.confidence] for s in st.samples]}
        for st in states
    ], separators=(",", ":"))


def decode_states(text: str) -> list[QueryState]:
    return [
        QueryState(id=d["id"], cap=d["cap"], features=d["f"], prior_difficulty=d["p"],
                   samples=[Sample(*s) for s in d["s"]])
        for d in json.loads(text)
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field(fields: dict[Any, Any], name: str) -> Any:
    return fields.get(name.encode(), fields.get(name))


@dataclass(eq=False)
class _Cursor:
    """How far one allocator instance has applied the log: position ``n`` (``None``: never pulled),
    at stream id ``id``; ``origin`` is its state before any learning (kept until the first pull);
    ``diverged``: it learned a run the log does not hold (Redis failed), so it must be rebuilt."""

    origin: dict[str, Any] | None
    n: int | None = None
    id: str = "0-0"
    diverged: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SharedLearning:
    """One replica's side of the shared log (see the module doc)."""

    def __init__(self, redis: Any, prefix: str = "ttc", maxlen: int = 100_000, snapshot_every: int = 1000,
                 batch: int = 500) -> None:
        self.redis = redis
        self.prefix = prefix
        self.maxlen = maxlen
        self.snapshot_every = max(1, min(snapshot_every, maxlen // 10))
        self.batch = batch
        self.replica = uuid.uuid4().hex[:12]
        """Written with each entry (who published it; informational)."""
        self._cursors: weakref.WeakKeyDictionary[Allocator, _Cursor] = weakref.WeakKeyDictionary()
        self._append = redis.register_script(_APPEND)
        self._snapshot = redis.register_script(_SNAPSHOT)

    def stream(self, snapshot: PolicySnapshot) -> str:
        digest = hashlib.sha1(snapshot.spec.model_dump_json().encode()).hexdigest()[:12]
        return f"{self.prefix}:learn:{snapshot.name}:{snapshot.version}:{digest}"

    def position(self, allocator: Allocator) -> int | None:
        """The log position ``allocator``'s state stands at (``None``: it never pulled)."""
        cursor = self._cursors.get(allocator)
        return None if cursor is None else cursor.n

    def _cursor(self, allocator: Allocator) -> _Cursor:
        cursor = self._cursors.get(allocator)
        if cursor is None:
            cursor = self._cursors[allocator] = _Cursor(origin=allocator.state_dict())
        return cursor

    async def publish(self, snapshot: PolicySnapshot, states: Sequence[QueryState]) -> int | None:
        """Append the states that have samples as one entry; its position (``None``: nothing to add)."""
        finished = [st for st in states if st.samples]
        if not finished:
            return None
        key = self.stream(snapshot)
        n, _ = await self._append(keys=[key, f"{key}:seq"], args=[self.maxlen, self.replica, encode_states(finished)])
        return int(n)

    async def learn(self, snapshot: PolicySnapshot, allocator: Allocator, states: Sequence[QueryState]) -> None:
        """What a replica does after a run: publish, then pull (which applies this run in its place in
        the log). Redis failing at publish: learn locally (see the module doc); at pull: warn only."""
        finished = [st for st in states if st.samples]
        if not finished:
            return
        cursor = self._cursor(allocator)
        try:
            await self.publish(snapshot, finished)
        except Exception as exc:
            log.warning("could not publish to the shared learning log, learning locally (this replica "
                        "diverges until its next pull): %s", exc)
            async with cursor.lock:
                allocator.learn(finished)
                cursor.diverged = True
            return
        try:
            await self.pull(snapshot, allocator)
        except Exception as exc:
            log.warning("could not pull the shared learning log (the next pull applies this run): %s", exc)

    async def pull(self, snapshot: PolicySnapshot, allocator: Allocator) -> int:
        """Bring ``allocator`` up to the end of the log; returns how many entries were applied."""
        cursor = self._cursor(allocator)
        async with cursor.lock:
            key = self.stream(snapshot)
            if cursor.n is None or cursor.diverged:
                await self._restore(key, allocator, cursor)
            return await self._apply(key, allocator, cursor)

    async def _restore(self, key: str, allocator: Allocator, cursor: _Cursor) -> None:
        stored = await self.redis.hmget(f"{key}:snapshot", ["n", "id", "state"])
        if stored[0] is None and cursor.origin is not None:
            await self._snapshot(keys=[f"{key}:snapshot"], args=[0, "0-0", json.dumps(cursor.origin)])
            stored = await self.redis.hmget(f"{key}:snapshot", ["n", "id", "state"])
        if stored[0] is None:
            raise RuntimeError(f"no snapshot of {key} to rebuild from")
        self._load(allocator, cursor, stored)

    @staticmethod
    def _load(allocator: Allocator, cursor: _Cursor, stored: Sequence[Any]) -> None:
        allocator.load_state_dict(json.loads(_text(stored[2])))
        cursor.n, cursor.id, cursor.diverged, cursor.origin = int(stored[0]), _text(stored[1]), False, None

    async def _apply(self, key: str, allocator: Allocator, cursor: _Cursor) -> int:
        assert cursor.n is not None
        applied = 0
        while True:
            start = "-" if cursor.id == "0-0" else f"({cursor.id}"
            entries = await self.redis.xrange(key, min=start, count=self.batch)
            for entry_id, fields in entries:
                raw_n = _field(fields, "n")
                n = int(raw_n) if raw_n is not None else cursor.n + 1  # an entry from before positions
                if n > cursor.n + 1 and await self._skip_gap(key, allocator, cursor, n):
                    break  # a snapshot covered the gap: read on from its stream id
                if n <= cursor.n:
                    log.warning("%s: entry %s has position %d, already applied (was the log reset?)",
                                key, _text(entry_id), n)
                    cursor.id = _text(entry_id)
                    continue
                allocator.learn(decode_states(_text(_field(fields, "s"))))
                cursor.n, cursor.id = n, _text(entry_id)
                applied += 1
                if n % self.snapshot_every == 0:
                    await self._snapshot(keys=[f"{key}:snapshot"],
                                         args=[n, cursor.id, json.dumps(allocator.state_dict())])
            else:
                if len(entries) < self.batch:
                    return applied

    async def _skip_gap(self, key: str, allocator: Allocator, cursor: _Cursor, n: int) -> bool:
        """Positions ``cursor.n + 1 .. n - 1`` are no longer in the stream: load the snapshot when it is
        ahead (True); else they are lost (a warning) and the cursor moves past them (False)."""
        assert cursor.n is not None
        stored = await self.redis.hmget(f"{key}:snapshot", ["n", "id", "state"])
        if stored[0] is not None and int(stored[0]) > cursor.n:
            self._load(allocator, cursor, stored)
            if cursor.n + 1 >= n:
                return True
        log.warning("%s: log positions %d..%d were trimmed before this replica applied them (history lost; "
                    "this replica now differs from those that applied them)", key, cursor.n + 1, n - 1)
        cursor.n = n - 1
        return False
