"""What a web page the operator opens cannot make the service do (app.middleware), and the body and
header mistakes that get a clear error (app.protocol.body, app.auth)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.conftest import fake_settings, service_client
from ttc_tools.fakes.backend import FakeOpenAI

KEY_BODY = b'{"role": "admin", "name": "from-a-page"}'


async def keys_minted(client: httpx.AsyncClient) -> int:
    return len((await client.get("/v1/keys")).json()["data"])


def error_of(resp: httpx.Response) -> dict[str, Any]:
    return resp.json()["error"]  # type: ignore[no-any-return]


async def test_a_simple_cross_site_post_is_refused_and_mints_nothing(client: httpx.AsyncClient) -> None:
    """A form or ``fetch`` with ``text/plain`` needs no CORS preflight: JSON sent so is refused (415),
    and so is a body without any content type; no key is minted."""
    before = await keys_minted(client)
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
                    {"content-type": "multipart/form-data; boundary=x"}, {}):
        resp = await client.post("/v1/keys", content=KEY_BODY, headers=headers)
        assert resp.status_code == 415, (headers, resp.text)
        assert error_of(resp)["code"] == "unsupported_media_type" and error_of(resp)["param"] == "Content-Type"
        assert "x-request-id" in resp.headers  # the refusal carries the request id
    assert await keys_minted(client) == before
    ok = await client.post("/v1/keys", content=KEY_BODY, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 201, ok.text
    assert await keys_minted(client) == before + 1


async def test_a_foreign_origin_may_not_write_but_the_services_own_may(client: httpx.AsyncClient,
                                                                       chat: Any) -> None:
    before = await keys_minted(client)
    resp = await client.post("/v1/keys", content=KEY_BODY,
                             headers={"content-type": "application/json", "origin": "http://evil.example"})
    assert resp.status_code == 403 and error_of(resp)["code"] == "cross_origin"
    assert error_of(resp)["param"] == "Origin" and "evil.example" in error_of(resp)["message"]
    resp = await client.post("/v1/chat/completions", json=chat(), headers={"origin": "null"})  # a sandboxed frame
    assert resp.status_code == 403
    assert await keys_minted(client) == before
    # The console's own page: the same host and port as the Host header.
    own = await client.post("/v1/chat/completions", json=chat(), headers={"origin": "http://127.0.0.1"})
    assert own.status_code == 200, own.text
    # Reads are not writes: a cross-origin GET still cannot read the answer (no CORS headers).
    assert (await client.get("/health", headers={"origin": "http://evil.example"})).status_code == 200


async def test_a_rebound_host_name_is_refused_ip_addresses_and_localhost_answer(client: httpx.AsyncClient,
                                                                                chat: Any) -> None:
    """DNS rebinding: a page at ``evil.example`` re-points its name at 127.0.0.1 and is then
    same-origin to the browser; the Host header still names it."""
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io"):
        for method, path in (("GET", "/v1/keys"), ("POST", "/v1/chat/completions")):
            resp = await client.request(method, path, json=chat(), headers={"host": host,
                                                                            "origin": f"http://{host}"})
            assert resp.status_code == 421, (host, path, resp.text)
            assert error_of(resp)["code"] == "host_not_allowed" and error_of(resp)["param"] == "Host"
    for host in ("localhost:8000", "LOCALHOST", "127.0.0.1:9", "[::1]:8000", "10.1.2.3"):
        resp = await client.post("/v1/chat/completions", json=chat(), headers={"host": host})
        assert resp.status_code == 200, (host, resp.text)


@pytest.fixture
async def named(fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    settings = fake_settings(["fake-a"], host="ttc.internal",
                             server={"allowed_hosts": ["gateway.example"],
                                     "allowed_origins": ["https://console.example/"]})
    async with service_client(settings, {"fake-a": fake}) as c:
        yield c


async def test_the_bound_name_and_configured_hosts_and_origins_are_allowed(named: httpx.AsyncClient,
                                                                           chat: Any) -> None:
    for host in ("ttc.internal:8000", "gateway.example"):
        assert (await named.post("/v1/chat/completions", json=chat(), headers={"host": host})).status_code == 200
    assert (await named.get("/health", headers={"host": "other.example"})).status_code == 421
    ok = await named.post("/v1/chat/completions", json=chat(), headers={"origin": "https://console.example"})
    assert ok.status_code == 200, ok.text
    assert (await named.post("/v1/chat/completions", json=chat(),
                             headers={"origin": "http://console.example"})).status_code == 403


async def test_allowed_hosts_star_turns_the_host_check_off(fake: FakeOpenAI, chat: Any) -> None:
    settings = fake_settings(["fake-a"], server={"allowed_hosts": ["*"]})
    async with service_client(settings, {"fake-a": fake}) as c:
        resp = await c.post("/v1/chat/completions", json=chat(), headers={"host": "anything.example"})
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("member, where", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"default": float("nan")}}}]},
     "tools[0].function.parameters.default"),
    ({"messages": [{"role": "user", "content": "hi", "weight": float("inf")}]}, "messages[0].weight"),
    ({"logit_bias": {"5": float("-inf")}}, "logit_bias.5"),
])
async def test_nan_and_infinity_are_refused_inside_forwarded_free_form_members(
        client: httpx.AsyncClient, fake: FakeOpenAI, chat: Any, member: dict[str, Any], where: str) -> None:
    import json

    body = {**chat(), **member}
    raw = json.dumps(body)  # Python writes NaN / Infinity / -Infinity, as a careless client would
    resp = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert error_of(resp)["param"] == where and "not a finite number" in error_of(resp)["message"]
    assert fake.calls == 0
    # A string that merely says NaN is fine.
    ok = await client.post("/v1/chat/completions", json=chat("Is NaN a number? Infinity?"))
    assert ok.status_code == 200, ok.text


async def test_json_nested_past_the_limit_says_so(client: httpx.AsyncClient, chat: Any) -> None:
    deep = b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "tools": ' + \
        b"[" * 5000 + b"]" * 5000 + b"}"
    resp = await client.post("/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and error_of(resp)["code"] == "invalid_json"
    assert "deeper" in error_of(resp)["message"]
    broken = await client.post("/v1/chat/completions", content=b'{"model": ',
                               headers={"content-type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in error_of(broken)["message"]


@pytest.fixture
async def authed(fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    settings = fake_settings(["fake-a"], auth={"enabled": True, "admin_keys": ["admin-secret"]})
    async with service_client(settings, {"fake-a": fake}) as c:
        yield c


async def test_an_authorization_header_that_is_not_bearer_gets_a_clear_401(authed: httpx.AsyncClient,
                                                                           chat: Any) -> None:
    for header, shown in (("Basic YWRtaW46c2VjcmV0", "'Basic'"), ("admin-secret", "'a bare token'"),
                          ("Token admin-secret", "'Token'")):
        resp = await authed.post("/v1/chat/completions", json=chat(), headers={"authorization": header})
        assert resp.status_code == 401, resp.text
        err = error_of(resp)
        assert err["code"] == "invalid_authorization_scheme" and shown in err["message"]
        assert "Bearer <key>" in err["message"]
    missing = await authed.post("/v1/chat/completions", json=chat())
    assert missing.status_code == 401 and error_of(missing)["code"] == "missing_api_key"
    for headers in ({"authorization": "Bearer admin-secret"}, {"authorization": "bearer  admin-secret"},
                    {"x-api-key": "admin-secret"}):
        assert (await authed.post("/v1/chat/completions", json=chat(), headers=headers)).status_code == 200


async def test_with_auth_off_any_authorization_header_is_ignored(client: httpx.AsyncClient, chat: Any) -> None:
    resp = await client.post("/v1/chat/completions", json=chat(), headers={"authorization": "Basic abc"})
    assert resp.status_code == 200, resp.text
