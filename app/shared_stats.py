"""Cross-replica statistics of shared allocators (``shared = True``, e.g. ``difficulty``) via Redis.

Allocators expose no state export, so replicas share what they *learn from* instead of the state:
after a request, a replica appends the finished query states it fed to ``allocator.learn`` to a
Redis stream per policy version (``<prefix>:learn:<name>:<version>:<spec hash>``, capped at
``maxlen`` entries); before planning with a shared allocator, a replica applies the entries other
replicas appended since it last looked (its own are skipped: the engine already learned them).
Every replica thus trains on the same examples (the order may differ between replicas, and a new
replica replays the stream's history on its first request). Without Redis nothing is shared.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from allocators import Allocator, QueryState, Sample
from app.policy import PolicySnapshot

log = logging.getLogger("ttc.shared")


def encode_states(states: Sequence[QueryState]) -> str:
    return json.dumps([
        {"id": st.id, "cap": st.cap, "f": dict(st.features), "p": st.prior_difficulty,
         "s": [[s.answer, s.score, s.tokens, s.logprob] for s in st.samples]}
        for st in states
    ], separators=(",", ":"))


def decode_states(text: str) -> list[QueryState]:
    return [
        QueryState(id=d["id"], cap=d["cap"], features=d["f"], prior_difficulty=d["p"],
                   samples=[Sample(answer=a, score=sc, tokens=t, logprob=lp) for a, sc, t, lp in d["s"]])
        for d in json.loads(text)
    ]


class SharedLearning:
    def __init__(self, redis: Any, prefix: str = "ttc", maxlen: int = 100_000) -> None:
        self.redis = redis
        self.prefix = prefix
        self.maxlen = maxlen
        self.replica = uuid.uuid4().hex[:12]
        self._seen: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.applied = 0

    def stream(self, snapshot: PolicySnapshot) -> str:
        digest = hashlib.sha1(snapshot.spec.model_dump_json().encode()).hexdigest()[:12]
        return f"{self.prefix}:learn:{snapshot.name}:{snapshot.version}:{digest}"

    async def publish(self, snapshot: PolicySnapshot, states: Sequence[QueryState]) -> None:
        finished = [st for st in states if st.samples]
        if finished:
            await self.redis.xadd(self.stream(snapshot), {"r": self.replica, "s": encode_states(finished)},
                                  maxlen=self.maxlen, approximate=True)

    async def pull(self, snapshot: PolicySnapshot, allocator: Allocator) -> int:
        """Apply other replicas' new examples to ``allocator``; returns how many states were applied."""
        key = self.stream(snapshot)
        async with self._locks.setdefault(key, asyncio.Lock()):
            return await self._pull(key, allocator)

    async def _pull(self, key: str, allocator: Allocator) -> int:
        last = self._seen.get(key, "0")
        applied = 0
        while True:
            entries = await self.redis.xrange(key, min=f"({last}" if last != "0" else "-", count=500)
            if not entries:
                break
            for entry_id, fields in entries:
                last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                replica = fields.get(b"r", fields.get("r"))
                replica = replica.decode() if isinstance(replica, bytes) else replica
                if replica == self.replica:
                    continue
                raw = fields.get(b"s", fields.get("s"))
                states = decode_states(raw.decode() if isinstance(raw, bytes) else raw)
                allocator.learn(states)
                applied += len(states)
            if len(entries) < 500:
                break
        self._seen[key] = last
        self.applied += applied
        return applied
