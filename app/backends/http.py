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

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import httpx

KEEPALIVE_EXPIRY_S = 2.0


class TransportError(Exception):
    """The call did not complete (connection refused or reset, timeout, ...)."""

    dropped = False
    """The server closed a connection it had accepted (a kept-alive connection it had just closed, a
    reset under load): a fault of that connection more than of the server, so it counts towards
    ``errors_to_open`` instead of opening the circuit at once."""


class ConnectionDropped(TransportError):
    dropped = True


class BackendHTTP(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        """POST a JSON body; the status and the raw response body."""
        ...

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]: ...

    def stream(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float,
               read_timeout_s: float) -> contextlib.AbstractAsyncContextManager[Streamed]:
        """POST a JSON body and read the answer line by line; leaving the context closes the
        connection (for vLLM: the request is aborted). ``timeout_s`` bounds the whole call,
        ``read_timeout_s`` every wait for data (the response head included)."""
        ...


class Streamed(Protocol):
    """An open streaming response: its status, its lines, or (for an error status) its whole body;
    :meth:`abort` (callable from a timer) closes it, and a pending read then fails."""

    status: int

    def lines(self) -> AsyncIterator[bytes]: ...

    async def read(self) -> bytes: ...

    def abort(self) -> None: ...


class StreamStalled(TransportError):
    """A streamed response sent nothing for longer than allowed (a hung or overloaded backend)."""


class Watchdog:
    """Bounds the waits of a stream's reader: its first line must come within ``first_s``, every later
    one within ``idle_s`` of asking for it; else the stream is aborted and the read raises
    :class:`StreamStalled`. Only time spent *waiting* counts (not the consumer's own work between
    reads), and a read that returns at once costs two clock reads: one timer serves the whole stream,
    re-armed only when it fires early."""

    __slots__ = ("_abort", "_handle", "_loop", "_since", "expired", "first_s", "idle_s", "limit")

    def __init__(self, abort: Callable[[], None], first_s: float, idle_s: float) -> None:
        self._abort = abort
        self._loop = asyncio.get_running_loop()
        self.first_s, self.idle_s, self.limit = first_s, idle_s, first_s
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.expired = False

    def _fire(self) -> None:
        self._handle = None
        if self._since is None:
            return
        due = self._since + self.limit
        if self._loop.time() >= due:
            self.expired = True
            self._abort()
        else:
            self._handle = self._loop.call_at(due, self._fire)

    async def lines(self, source: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        it = source.__aiter__()
        try:
            while True:
                self._since = self._loop.time()
                if self._handle is None:
                    self._handle = self._loop.call_at(self._since + self.limit, self._fire)
                try:
                    line = await it.__anext__()
                except StopAsyncIteration:
                    return
                except TransportError as exc:
                    if self.expired:
                        raise StreamStalled(f"no data for {self.limit:g}s") from exc
                    raise
                finally:
                    self._since = None
                if self.expired:
                    raise StreamStalled(f"no data for {self.limit:g}s")
                self.limit = self.idle_s
                yield line
        finally:
            if self._handle is not None:
                self._handle.cancel()


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
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> TransportError:
        cls = ConnectionDropped if isinstance(exc, self._aiohttp.ServerDisconnectedError) else TransportError
        return cls(f"{type(exc).__name__}: {exc}")

    async def get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        try:
            async with self.session.get(url, headers=dict(headers),
                                        timeout=self._timeout(timeout_s)) as resp:  # type: ignore[arg-type]
                return resp.status, await resp.read()
        except self._errors as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc


    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float,
                     read_timeout_s: float) -> AsyncIterator[Streamed]:
        timeout = self._aiohttp.ClientTimeout(total=timeout_s, connect=min(timeout_s, self.connect_timeout_s),
                                              sock_read=read_timeout_s)
        try:
            async with self.session.post(url, data=body, headers={"content-type": "application/json", **headers},
                                         timeout=timeout) as resp:
                yield _AiohttpStreamed(resp, self._stream_errors)
        except self._errors as exc:
            raise self._error(exc) from exc


class _AiohttpStreamed:
    def __init__(self, resp: Any, errors: tuple[type[BaseException], ...]) -> None:
        self.status: int = resp.status
        self._resp = resp
        self._errors = errors

    def abort(self) -> None:
        self._resp.close()

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
    async def stream(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float,
                     read_timeout_s: float) -> AsyncIterator[Streamed]:
        try:
            timeout = httpx.Timeout(timeout_s, read=read_timeout_s)
            async with self.client.stream("POST", url, content=body, timeout=timeout,
                                          headers={"content-type": "application/json", **headers}) as resp:
                yield _HttpxStreamed(resp)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc


class _HttpxStreamed:
    def __init__(self, resp: httpx.Response) -> None:
        self.status = resp.status_code
        self._resp = resp
        self._reader: asyncio.Task[Any] | None = None

    async def lines(self) -> AsyncIterator[bytes]:
        try:
            async for line in self._resp.aiter_lines():
                yield line.encode()
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc

    def abort(self) -> None:
        """Close the response (tests' in-process transports); the pending read then fails."""
        self._reader = asyncio.ensure_future(self._resp.aclose())

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
