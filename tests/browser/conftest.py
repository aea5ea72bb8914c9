"""The console in a real browser: Debian's chromium driven by Playwright (``executable_path``, never
Playwright's own browser download), against the service under uvicorn on a loopback port, in front
of a fake backend, with auth on. ``scripts/test-browser.sh`` installs chromium.

A second service with auth off (:func:`open_console`) serves the pages that must say so.

Screenshots go to ``.artifacts/ui/`` (ignored by git; ``docs/`` keeps two for the README)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.config import BackendConfig, Settings
from app.main import create_app
from tests.support.serving import serving
from ttc_tools.fakes.backend import FakeOpenAI

ADMIN_KEY = "admin-secret-for-browser-tests"
DATA = Path(__file__).parent / "data"
ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "ui"
TIMEOUT_MS = 10_000


@dataclass
class Console:
    url: str
    api: httpx.AsyncClient
    """A client of the service over HTTP with the admin key."""
    fake: FakeOpenAI

    async def user_key(self, **body: Any) -> str:
        resp = await self.api.post("/v1/keys", json={"role": "user", **body})
        assert resp.status_code == 201, resp.text
        key: str = resp.json()["key"]
        return key


def settings(backend_url: str, **kw: Any) -> Settings:
    kw.setdefault("auth", {"enabled": True, "admin_keys": [ADMIN_KEY]})
    return Settings(backends=[BackendConfig(url=backend_url, name="fake0", serialize_seeded=False)],
                    default_model="fake-model", store={"url": "sqlite+aiosqlite://"}, answers={"prestart": False},
                    pool={"cooldown_s": 30.0, "retry_backoff_s": 0.0, "health_interval_s": 3600.0}, **kw)


@pytest_asyncio.fixture(scope="session")
async def console() -> AsyncIterator[Console]:
    fake = FakeOpenAI(p_correct=0.6, token_latency_s=0.002)
    async with contextlib.AsyncExitStack() as stack:
        backend = await stack.enter_async_context(serving(fake))
        app = create_app(settings(backend, ui={"reports_dir": DATA}))
        await stack.enter_async_context(app.router.lifespan_context(app))
        url = await stack.enter_async_context(serving(app))
        api = await stack.enter_async_context(httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30))
        yield Console(url, api, fake)


@pytest_asyncio.fixture(scope="session")
async def console_auth_off() -> AsyncIterator[str]:
    """The URL of a second service, with ``auth.enabled: false`` (its own fake backend)."""
    async with contextlib.AsyncExitStack() as stack:
        backend = await stack.enter_async_context(serving(FakeOpenAI(token_latency_s=0.002)))
        app = create_app(settings(backend, auth={"enabled": False}))
        await stack.enter_async_context(app.router.lifespan_context(app))
        yield await stack.enter_async_context(serving(app))


@pytest_asyncio.fixture(scope="session")
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run scripts/test-browser.sh (make test does)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        await b.close()


@contextlib.asynccontextmanager
async def open_page(browser: Any, url: str) -> AsyncIterator[Any]:
    """A fresh browser context on the service at ``url``; no uncaught error in the page allowed."""
    context = await browser.new_context(base_url=url, viewport={"width": 1360, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    pg = await context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    await context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


@pytest_asyncio.fixture
async def page(browser: Any, console: Console) -> AsyncIterator[Any]:
    async with open_page(browser, console.url) as pg:
        yield pg


async def sign_in(page: Any, key: str, hash_: str = "#/overview") -> None:
    """Open the console and give it ``key`` through its form; the key must end up in neither the URL
    nor a cookie."""
    from playwright.async_api import expect

    await page.goto("/ui/" + hash_)
    await page.fill("#key", key)
    await page.click("#login-form button[type=submit]")
    await expect(page.locator("#who")).not_to_be_empty()
    assert key not in page.url
    assert await page.context.cookies() == []


async def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path
