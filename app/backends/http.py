"""The HTTP client of backend calls: aiohttp in production, any httpx transport in tests.

Backend calls are the service's hot path, and httpx spends several times aiohttp's CPU per request
(measured under load: httpx/httpcore/anyio were 39% of the service's CPU). :class:`BackendHTTP` is
the small surface the backends use (``post`` a JSON body, ``get``), with two implementations:

* :class:`AiohttpHTTP`: one ``aiohttp.ClientSession`` with one connection pool of
  ``max_connections``; idle connections are dropped after ``KEEPALIVE_EXPIRY_S`` (2 s), below the 5 s
  after which vLLM's uvicorn closes them (with equal timeouts a request sent on a connection the
  server is closing fails, seen under load against the embedded engine);
* :class:`HttpxHTTP`: an ``httpx.AsyncClient``, used when :func:`open_backend_http` is given an httpx
  transport (the tests route calls to in-process ASGI apps this way).

Both raise :class:`TransportError` for anything that is the network's fault (connect, read,
timeout), which the pool treats as retryable.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx

KEEPALIVE_EXPIRY_S = 2.0


class TransportError(Exception):
    """The call did not complete (connection refused or reset, timeout, ...)."""


class BackendHTTP(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        """POST a JSON body; the status and the raw response body."""
        ...

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]: ...

    def stream(self, url: str, body: bytes, headers: Mapping[str, str],
               timeout_s: float) -> contextlib.AbstractAsyncContextManager[Streamed]:
        """POST a JSON body and read the answer line by line; leaving the context closes the
        connection (for vLLM: the request is aborted)."""
        ...


class Streamed(Protocol):
    """An open streaming response: its status, its lines, or (for an error status) its whole body."""

    status: int

    def lines(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...


class AiohttpHTTP:
    def __init__(self, session: object, connect_timeout_s: float) -> None:
        import aiohttp

        self._aiohttp = aiohttp
        self.session: aiohttp.ClientSession = session  # type: ignore[assignment]
        self.connect_timeout_s = connect_timeout_s
        # aiohttp raises a bare RuntimeError("Connection closed.") when a streamed body ends mid-read
        self._errors = (aiohttp.ClientError, TimeoutError)
        self._stream_errors = (*self._errors, RuntimeError)

    def _timeout(self, timeout_s: float) -> object:
        return self._aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, self.connect_timeout_s))

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        try:
            async with self.session.post(url, data=body, headers={"content-type": "application/json", **headers},
                                         timeout=self._timeout(timeout_s)) as resp:  # type: ignore[arg-type]
                return resp.status, await resp.read()
        except self._errors as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        try:
            async with self.session.get(url, headers=dict(headers),
                                        timeout=self._timeout(timeout_s)) as resp:  # type: ignore[arg-type]
                return resp.status, await resp.read()
        except self._errors as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc


    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Mapping[str, str],
                     timeout_s: float) -> AsyncIterator[Streamed]:
        try:
            async with self.session.post(url, data=body, headers={"content-type": "application/json", **headers},
                                         timeout=self._timeout(timeout_s)) as resp:  # type: ignore[arg-type]
                yield _AiohttpStreamed(resp, self._stream_errors)
        except self._errors as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc


class _AiohttpStreamed:
    def __init__(self, resp: Any, errors: tuple[type[BaseException], ...]) -> None:
        self.status: int = resp.status
        self._resp = resp
        self._errors = errors

    async def lines(self) -> AsyncIterator[bytes]:
        try:
            async for line in self._resp.content:
                yield line
        except self._errors as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def read(self) -> bytes:
        return bytes(await self._resp.read())


class HttpxHTTP:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        try:
            resp = await self.client.post(url, content=body, headers={"content-type": "application/json", **headers},
                                          timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return resp.status_code, resp.content

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        try:
            resp = await self.client.get(url, headers=dict(headers), timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        return resp.status_code, resp.content

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Mapping[str, str],
                     timeout_s: float) -> AsyncIterator[Streamed]:
        try:
            async with self.client.stream("POST", url, content=body, timeout=timeout_s,
                                          headers={"content-type": "application/json", **headers}) as resp:
                yield _HttpxStreamed(resp)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc


class _HttpxStreamed:
    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self._resp = resp

    async def lines(self) -> AsyncIterator[bytes]:
        try:
            async for line in self._resp.aiter_lines():
                yield line.encode()
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    async def read(self) -> bytes:
        return await self._resp.aread()


@contextlib.asynccontextmanager
async def open_backend_http(max_connections: int, connect_timeout_s: float, *,
                            transport: httpx.AsyncBaseTransport | None = None) -> AsyncIterator[BackendHTTP]:
    """The backend client for the app's lifetime: aiohttp, or httpx over ``transport`` when given."""
    if transport is not None:
        limits = httpx.Limits(max_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        async with httpx.AsyncClient(transport=transport, limits=limits) as client:
            yield HttpxHTTP(client)
        return
    import aiohttp

    connector = aiohttp.TCPConnector(limit=max_connections, keepalive_timeout=KEEPALIVE_EXPIRY_S,
                                     enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=True, raise_for_status=False,
                                     skip_auto_headers=("User-Agent",)) as session:
        yield AiohttpHTTP(session, connect_timeout_s)
