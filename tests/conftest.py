"""Shared fixtures: a fake OpenAI backend in-process and the service built on it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from app.config import BackendConfig, Settings
from app.main import create_app
from ttc_tools.fakes.backend import FakeOpenAI

# Services built or spawned by tests keep their store in memory unless a test names one, so no test
# writes to the repository's var/ttc.db (the default store of `ttc serve`).
os.environ.setdefault("TTC_STORE__URL", "sqlite+aiosqlite://")


class HostRouter(httpx.AsyncBaseTransport):
    """Routes each request to the in-process ASGI app registered for its host."""

    def __init__(self, apps: dict[str, Any]) -> None:
        self.transports = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        transport = self.transports.get(request.url.host)
        if transport is None:
            raise httpx.ConnectError(f"no route to {request.url.host}", request=request)
        return await transport.handle_async_request(request)


@asynccontextmanager
async def service_client(settings: Settings, fakes: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, transport=HostRouter(fakes))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=30) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def fake_settings(hosts: list[str], **kw: Any) -> Settings:
    pool = {"cooldown_s": 30.0, "retry_backoff_s": 0.0, "health_interval_s": 3600.0, **kw.pop("pool", {})}
    kw.setdefault("store", {"url": "sqlite+aiosqlite://"})  # in memory: every test starts empty
    kw.setdefault("answers", {"prestart": False})  # answer workers start only in tests that need them
    return Settings(backends=[BackendConfig(url=f"http://{h}:8000", name=h) for h in hosts],
                    pool=pool, default_model="fake-model", **kw)


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI(keep_bodies=True)


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    async with service_client(fake_settings(["fake-a"]), {"fake-a": fake}) as c:
        yield c


@pytest.fixture
def chat() -> Callable[..., dict[str, Any]]:
    def make(content: str = "What is 2 + 40?", **ttc: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": content}]}
        if ttc:
            body["ttc"] = ttc
        return body

    return make


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests are marked so; tests marked ``stops_backend`` (they stop one of the session's
    vLLM servers) run after every other test, whatever their file is called."""
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("stops_backend") is not None)  # stable: order kept
