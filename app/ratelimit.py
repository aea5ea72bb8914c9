"""Per-key limits: requests per minute and samples per minute, as token buckets.

Each limit ``L`` per minute is a bucket of capacity ``L`` refilled continuously at ``L / 60`` per
second (so a fresh key may burst ``L`` at once, then sustains ``L`` a minute; there is no
window edge at which ``2L`` get through). A request takes one token from its requests bucket at
arrival. Samples are only known afterwards: a request is admitted while the samples bucket holds at
least one token, and the samples it drew are then charged (the bucket may go into debt, which
delays the key's next requests until it is repaid). A refusal is a 429 with ``Retry-After``
(seconds until the bucket has enough again).

Buckets live in process memory, or in Redis when ``redis.url`` is set (one Lua script per
operation, atomic, on the Redis server's clock), so the limits hold across all replicas.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Protocol

from app.auth import Principal
from app.errors import RateLimited

log = logging.getLogger("ttc.ratelimit")

_LUA = """
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local need = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil then tokens = cap; ts = now end
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
local ok = 0
if tokens >= need then tokens = tokens - cost; ok = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil((cap - tokens) / rate) + 60)
return {ok, tostring(tokens)}
"""


class Buckets(Protocol):
    async def take(self, key: str, capacity: float, rate: float, need: float, cost: float) -> tuple[bool, float]:
        """Refill, then if ``tokens >= need`` subtract ``cost``; return (admitted, tokens left)."""
        ...


class MemoryBuckets:
    def __init__(self) -> None:
        self._state: dict[str, tuple[float, float]] = {}

    async def take(self, key: str, capacity: float, rate: float, need: float, cost: float) -> tuple[bool, float]:
        now = time.monotonic()
        tokens, ts = self._state.get(key, (capacity, now))
        tokens = min(capacity, tokens + max(0.0, now - ts) * rate)
        ok = tokens >= need
        if ok:
            tokens -= cost
        self._state[key] = (tokens, now)
        return ok, tokens


class RedisBuckets:
    def __init__(self, redis: Any, prefix: str = "ttc") -> None:
        self.redis = redis
        self.prefix = prefix
        self._script = redis.register_script(_LUA)

    async def take(self, key: str, capacity: float, rate: float, need: float, cost: float) -> tuple[bool, float]:
        ok, tokens = await self._script(keys=[f"{self.prefix}:rl:{key}"], args=[capacity, rate, need, cost])
        return bool(int(ok)), float(tokens)


class RateLimiter:
    """The limits of :class:`~app.auth.Principal` keys (keys without limits are never refused)."""

    def __init__(self, buckets: Buckets) -> None:
        self.buckets = buckets

    async def admit(self, who: Principal) -> None:
        """At arrival: one request token, and a positive samples balance; else :class:`RateLimited`."""
        if not who.limited or who.key_id is None:
            return
        if who.requests_per_minute:
            await self._take(who.key_id, "requests", who.requests_per_minute, need=1, cost=1)
        if who.samples_per_minute:
            await self._take(who.key_id, "samples", who.samples_per_minute, need=1, cost=0)

    async def charge_samples(self, who: Principal, samples: int) -> None:
        if who.key_id is not None and who.samples_per_minute and samples > 0:
            await self._take(who.key_id, "samples", who.samples_per_minute, need=-1e18, cost=samples)

    async def _take(self, key_id: str, kind: str, limit: int, need: float, cost: float) -> None:
        rate = limit / 60
        try:
            ok, tokens = await self.buckets.take(f"{key_id}:{kind}", limit, rate, need, cost)
        except Exception as exc:  # the counter store is down: serve rather than fail every request
            log.warning("rate-limit counters unavailable, not limiting: %s", exc)
            return
        if not ok:
            wait = max(1, math.ceil((need - tokens) / rate))
            raise RateLimited(
                f"Rate limit reached: {limit} {kind} per minute for this key; retry in {wait} s.",
                headers={"Retry-After": str(wait), f"x-ratelimit-limit-{kind}": str(limit),
                         f"x-ratelimit-remaining-{kind}": "0"},
            )
