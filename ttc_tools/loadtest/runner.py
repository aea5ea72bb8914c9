"""Drive one policy at one load level over real HTTP (async httpx) and record every request.

Two load shapes:

* ``closed``: ``load`` clients, each sending its next request as soon as the previous one answered
  (throughput is whatever the service sustains at that concurrency);
* ``open``: requests arrive as a Poisson process of rate ``load`` per second, whatever the service
  does (latency then includes any queueing the service causes).

Every level is bounded twice: no request starts after ``duration_s`` and at most ``max_requests``
are sent (hard ceilings :data:`MAX_REQUESTS`, :data:`MAX_DURATION_S`); each request is bounded by
``timeout_s``. So a level ends within ``duration_s + timeout_s``. Open-loop requests in flight are
capped at :data:`MAX_IN_FLIGHT`; an arrival over the cap is recorded as ``client_backlog`` and not
sent. The target must be loopback (see :mod:`ttc_tools.loadtest.target`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from ttc_tools.loadtest.arrivals import poisson_arrivals
from ttc_tools.loadtest.data import Problem
from ttc_tools.loadtest.records import RequestRecord, apply_json, apply_sse, clip, error_message, error_type
from ttc_tools.loadtest.target import require_loopback

MAX_REQUESTS = 100_000
MAX_DURATION_S = 3600.0
MAX_CONCURRENCY = 1024
MAX_IN_FLIGHT = 2048

Mode = Literal["closed", "open"]


@dataclass(frozen=True)
class LevelSpec:
    """One (policy, load level) run.

    ``ttc`` is the ``ttc`` object sent with each request (``None``: plain OpenAI request, as sent
    to a peer proxy or straight to a backend); ``extra_body`` is merged into every body (e.g. a
    peer's own budget field). ``prompt_suffix`` is appended to each question.
    """

    url: str
    policy: str
    mode: Mode
    load: float
    duration_s: float | None = 10.0
    max_requests: int | None = None
    timeout_s: float = 120.0
    model: str | None = None
    ttc: dict[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    stream: bool = False
    endpoint: Literal["chat", "completions"] = "chat"
    prompt_suffix: str = ""
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    def bounds(self) -> tuple[float, int]:
        """``(duration_s, max_requests)`` after applying the hard ceilings; at least one must be set."""
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("a level needs --duration or --requests")
        duration = min(self.duration_s if self.duration_s is not None else MAX_DURATION_S, MAX_DURATION_S)
        count = min(self.max_requests if self.max_requests is not None else MAX_REQUESTS, MAX_REQUESTS)
        return duration, count

    def body(self, problem: Problem) -> dict[str, Any]:
        text = problem.question + self.prompt_suffix
        body: dict[str, Any] = dict(self.extra_body)
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if self.model is not None:
            body["model"] = self.model
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.ttc is not None:
            body["ttc"] = self.ttc
        return body

    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


@dataclass
class LevelResult:
    spec: LevelSpec
    records: list[RequestRecord]
    started_at: float  # time.monotonic() at the level's start
    elapsed_s: float


def _sse_events(raw: bytes) -> list[dict[str, Any]]:
    events = []
    for line in raw.splitlines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                events.append(json.loads(data))
    return events


async def send_one(session: aiohttp.ClientSession, spec: LevelSpec, problem: Problem, index: int,
                   t0: float) -> RequestRecord:
    """Send one request and record it. ``ttfb_s`` is the time to the first body bytes (for a
    streamed request, the first SSE event); ``latency_s`` the time to the last byte."""
    start = time.monotonic()
    rec = RequestRecord(policy=spec.policy, mode=spec.mode, load=spec.load, index=index,
                        problem_id=problem.id, gold=problem.gold, start_s=start - t0)
    chunks: list[bytes] = []
    try:
        async with session.post(spec.url + spec.path(), data=json.dumps(spec.body(problem)),
                                headers={"content-type": "application/json", **spec.headers}) as resp:
            rec.status = resp.status
            async for chunk in resp.content.iter_any():
                if rec.ttfb_s is None:
                    rec.ttfb_s = time.monotonic() - start
                chunks.append(chunk)
        raw = b"".join(chunks)
        if resp.status != 200:
            rec.error, rec.error_message = error_type(resp.status, raw), error_message(raw)
        elif spec.stream:
            apply_sse(rec, _sse_events(raw))
        else:
            apply_json(rec, json.loads(raw))
    except TimeoutError:
        rec.error, rec.error_message = "timeout", f"no complete answer within {spec.timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        rec.error, rec.error_message = "connect_error", _describe(exc)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError) as exc:
        rec.error, rec.error_message = "connection_lost", _describe(exc)
    except aiohttp.ClientError as exc:
        rec.error, rec.error_message = type(exc).__name__, _describe(exc)
    except (ValueError, AttributeError, TypeError) as exc:
        rec.error, rec.error_message = "bad_response", _describe(exc)
    end = time.monotonic()
    rec.end_s, rec.latency_s = end - t0, end - start
    return rec


def _describe(exc: BaseException) -> str:
    """An exception as one short line: its type and what it says."""
    text = str(exc)
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def connections(spec: LevelSpec) -> int:
    """Connections the level needs: one per closed-loop client, :data:`MAX_IN_FLIGHT` open-loop."""
    return MAX_IN_FLIGHT if spec.mode == "open" else max(1, int(spec.load))


def open_session(spec: LevelSpec) -> aiohttp.ClientSession:
    """The level's HTTP client: one aiohttp session, one connection pool of :func:`connections`
    (aiohttp costs a fraction of httpx's CPU per request, so the load generator stays out of the
    way of what it measures), the per-request timeout, no environment proxies."""
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s, connect=min(10.0, spec.timeout_s))
    connector = aiohttp.TCPConnector(limit=connections(spec), keepalive_timeout=30)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)


async def run_level(spec: LevelSpec, problems: Sequence[Problem],
                    on_record: Callable[[RequestRecord], None] | None = None) -> LevelResult:
    """Run one level to its bounds and return every request's record (in completion order)."""
    require_loopback(spec.url)
    if not problems:
        raise ValueError("no problems to send")
    if spec.mode == "closed" and not 1 <= spec.load <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY}")
    duration, count = spec.bounds()
    records: list[RequestRecord] = []

    def done(rec: RequestRecord) -> None:
        records.append(rec)
        if on_record is not None:
            on_record(rec)

    async with open_session(spec) as session:
        t0 = time.monotonic()
        if spec.mode == "closed":
            await _closed(session, spec, problems, duration, count, t0, done)
        else:
            await _open(session, spec, problems, duration, count, t0, done)
        elapsed = time.monotonic() - t0
    return LevelResult(spec, records, t0, elapsed)


async def _closed(session: aiohttp.ClientSession, spec: LevelSpec, problems: Sequence[Problem],
                  duration: float, count: int, t0: float,
                  done: Callable[[RequestRecord], None]) -> None:
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count and time.monotonic() - t0 < duration:
            i = next_index
            next_index += 1
            done(await send_one(session, spec, problems[i % len(problems)], i, t0))

    await asyncio.gather(*(worker() for _ in range(int(spec.load))))


async def _open(session: aiohttp.ClientSession, spec: LevelSpec, problems: Sequence[Problem],
                duration: float, count: int, t0: float,
                done: Callable[[RequestRecord], None]) -> None:
    schedule = poisson_arrivals(spec.load, duration_s=duration, max_count=count,
                                rng=random.Random(spec.seed))
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        done(await send_one(session, spec, problems[i % len(problems)], i, t0))

    for i, offset in enumerate(schedule):
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= MAX_IN_FLIGHT:
            now = time.monotonic() - t0
            p = problems[i % len(problems)]
            done(RequestRecord(policy=spec.policy, mode=spec.mode, load=spec.load, index=i,
                               problem_id=p.id, gold=p.gold, start_s=now, end_s=now,
                               error="client_backlog",
                               error_message=f"not sent: {MAX_IN_FLIGHT} requests already in flight"))
            continue
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
