"""``/docs`` renders the service's own OpenAPI document in a real browser, offline (Swagger UI from
the service's assets; FastAPI writes OpenAPI 3.1, which Swagger UI 4 could not read)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import expect

from tests.browser.conftest import open_page, screenshot


async def test_the_api_docs_render_every_route(browser: Any, console_auth_off: str) -> None:
    async with open_page(browser, console_auth_off) as page:
        external: list[str] = []
        page.on("request", lambda r: None if r.url.startswith(console_auth_off) else external.append(r.url))
        await page.goto("/docs")
        await expect(page.locator(".swagger-ui .info .title")).to_contain_text("ttc")
        operations = page.locator(".opblock-summary-path")
        await expect(operations.first).to_be_visible()
        paths = set(await operations.all_inner_texts())
        assert {"/v1/chat/completions", "/v1/completions", "/v1/ttc/batches", "/v1/policies"} <= {
            p.replace("\u200b", "") for p in paths}
        await expect(page.get_by_text("Unable to render this definition")).to_have_count(0)
        assert not external  # everything came from the service itself
        await screenshot(page, "docs")
