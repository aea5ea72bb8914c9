"""The console's routes without a browser: the switch, what the static route serves (and does
not), the headers it sends, and who may read the stats and the report folder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.routes.stats import summarise
from app.routes.ui import list_reports
from tests.browser.conftest import DATA
from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

ADMIN = {"Authorization": "Bearer admin-secret"}


def client(**kw: Any) -> Any:
    auth = {"enabled": True, "admin_keys": ["admin-secret"]}
    return service_client(fake_settings(["fake-a"], auth=auth, **kw), {"fake-a": FakeOpenAI()})


@pytest.fixture
async def api() -> AsyncIterator[httpx.AsyncClient]:
    async with client(ui={"reports_dir": DATA}) as c:
        yield c


async def user_key(api: httpx.AsyncClient) -> dict[str, str]:
    resp = await api.post("/v1/keys", json={"role": "user"}, headers=ADMIN)
    return {"Authorization": f"Bearer {resp.json()['key']}"}


async def test_the_console_is_off_when_disabled() -> None:
    async with client(ui={"enabled": False}) as c:
        for path in ("/ui", "/ui/", "/ui/app.js", "/v1/ui/reports"):
            resp = await c.get(path, headers=ADMIN)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["code"] == "ui_disabled"
        assert (await c.get("/v1/ttc/stats", headers=ADMIN)).status_code == 200  # an API, not the console


async def test_pages_need_no_key_and_carry_a_strict_policy(api: httpx.AsyncClient) -> None:
    assert (await api.get("/ui")).headers["location"] == "/ui/"
    page = await api.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "set-cookie" not in page.headers
    js = await api.get("/ui/app.js")
    assert js.headers["content-type"].startswith("text/javascript")
    for bad in ("/ui/..%2Fmain.py", "/ui/.hidden", "/ui/missing.js", "/ui/%2E%2E%2Froutes%2Fui.py"):
        assert (await api.get(bad)).status_code == 404, bad


async def test_every_data_call_checks_the_key(api: httpx.AsyncClient) -> None:
    user = await user_key(api)
    assert (await api.get("/v1/ttc/stats")).status_code == 401
    assert (await api.get("/v1/ttc/stats", headers=user)).status_code == 200
    who = (await api.get("/v1/ttc/whoami", headers=user)).json()
    assert who["role"] == "user" and who["auth_enabled"] is True
    assert (await api.get("/v1/ui/reports", headers=user)).status_code == 403
    listed = (await api.get("/v1/ui/reports", headers=ADMIN)).json()["data"]
    assert {r["name"]: r["kind"] for r in listed} == {"replay-small.json": "replay",
                                                      "loadtest/summary.json": "loadtest"}
    one = await api.get("/v1/ui/reports/loadtest/summary.json", headers=ADMIN)
    assert one.status_code == 200 and "levels" in one.json()
    assert (await api.get("/v1/ui/reports/../conftest.py", headers=ADMIN)).status_code == 404
    assert (await api.get("/v1/ui/reports/nope.json", headers=ADMIN)).status_code == 404


async def test_stats_count_what_was_served(api: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "What is 2 + 40?"}],
            "ttc": {"policy": "self-consistency-8"}}
    for _ in range(3):
        assert (await api.post("/v1/chat/completions", json=body, headers=ADMIN)).status_code == 200
    stats = (await api.get("/v1/ttc/stats", headers=ADMIN)).json()
    pol = stats["policies"]["self-consistency-8"]
    assert stats["requests"]["ok"] == 3 and pol["requests"] == 3 and pol["samples"] == 24
    assert pol["completion_tokens"] == 24 * 9 and sum(pol["stop_reasons"].values()) == 3
    assert stats["latency"]["count"] == 3 and stats["latency"]["counts"][-1] == 3
    assert stats["latency"]["le"] == sorted(stats["latency"]["le"])
    assert stats["backends"] == [{"name": "fake-a", "up": True, "outstanding": 0, "errors": 0.0, "calls": 3.0}]


def test_summarise_an_empty_registry() -> None:
    from app.metrics import Metrics

    stats = summarise(Metrics().registry, [], 1.0)
    assert stats.requests == {} and stats.policies == {} and stats.latency.count == 0


def test_only_report_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / "notes.json").write_text('{"a": 1}')
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text('{"meta": {}, "levels": []}')
    assert [r["name"] for r in list_reports(tmp_path)] == ["run/summary.json"]
    assert list_reports(tmp_path / "absent") == []


async def test_whoami_says_when_auth_is_off() -> None:
    """What the Keys page reads to say that no key is checked."""
    async with service_client(fake_settings(["fake-a"]), {"fake-a": FakeOpenAI()}) as c:
        who = (await c.get("/v1/ttc/whoami")).json()
        assert who["auth_enabled"] is False and who["role"] == "admin"
        assert (await c.get("/v1/keys")).status_code == 200  # the Keys page opens without a key
