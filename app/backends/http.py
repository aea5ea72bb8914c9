"""HTTP clients for backend calls, sharded.

httpx's connection pool does work proportional to its number of connections on every request, so a
single client holding hundreds of connections spends real CPU at high concurrency. The service
therefore holds several clients of ``per_shard`` connections each and hands them out round-robin;
each client is created once per app lifetime (never per call).

Idle connections are dropped after ``KEEPALIVE_EXPIRY_S`` (2 s), below the 5 s after which vLLM's
uvicorn server closes them: with equal timeouts a request sent on a connection the server is closing
at that moment fails with a ``ReadError`` (seen under load against the embedded engine).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator

import httpx

KEEPALIVE_EXPIRY_S = 2.0


class ClientShards:
    """``len(clients)`` = ceil(total_connections / per_shard) clients sharing one configuration."""

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        if not clients:
            raise ValueError("need at least one client")
        self.clients = clients
        self._cycle = itertools.cycle(clients)

    @property
    def primary(self) -> httpx.AsyncClient:
        """The client for health checks and verifier calls."""
        return self.clients[0]

    def next(self) -> httpx.AsyncClient:
        return next(self._cycle)


@contextlib.asynccontextmanager
async def open_shards(total_connections: int, timeout: httpx.Timeout, *, per_shard: int = 16,
                      transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[ClientShards]:
    count = max(1, -(-total_connections // per_shard))
    limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard,
                          keepalive_expiry=KEEPALIVE_EXPIRY_S)
    tls = httpx.create_ssl_context()  # one CA bundle load for all shards, not one each
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(transport=transport, limits=limits,
                                                                      timeout=timeout, verify=tls))
                   for _ in range(count)]
        yield ClientShards(clients)
