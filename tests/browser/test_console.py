"""The console's pages in chromium: each test drives the page as an operator would and checks what
it shows against what the service's APIs say (what the playground explains beside an answer:
test_playground.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.async_api import expect

from tests.browser.conftest import ADMIN_KEY, DATA, Console, open_page, screenshot, sign_in

pytestmark = pytest.mark.browser


async def fill_policy(page: Any, **fields: str) -> None:
    await page.click("#new-policy")
    for name, value in fields.items():
        await page.fill(f"#f-{name}", value)
    await page.click("#save-policy")


async def test_create_policy_through_the_form_and_see_it_listed(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/policies")
    await fill_policy(page, name="ui-made", description="made in the console", allocator="fixed",
                      params='{"n": 3}')
    row = page.locator('#policies-table tr[data-policy="ui-made"]')
    await expect(row).to_contain_text("v1")
    await expect(row).to_contain_text("fixed")
    stored = (await console.api.get("/v1/policies/ui-made")).json()
    assert stored["spec"]["params"] == {"n": 3} and stored["description"] == "made in the console"

    # edit: a new version, and the diff between the two names the changed param
    await row.locator("button.edit").click()
    await page.fill("#f-params", '{"n": 5}')
    await page.click("#save-policy")
    await expect(row).to_contain_text("v2")
    await expect(page.locator("#diff-table")).to_contain_text("params.n")
    changed = page.locator("#diff-table tr.diff-changed", has_text="params.n")
    await expect(changed).to_contain_text("3")
    await expect(changed).to_contain_text("5")

    # make it the default; a key bound to it shows in the list
    await console.user_key(name="bound-user", default_policy="ui-made")
    await row.locator("button.make-default").click()
    await expect(row.locator("td.default")).to_have_text("default")
    await page.reload()
    await expect(page.locator('#policies-table tr[data-policy="ui-made"] td.bound')).to_contain_text("bound-user")
    assert (await console.api.get("/v1/settings/default_policy")).json()["policy"] == "ui-made"
    await console.api.put("/v1/settings/default_policy", json={"policy": "default"})
    await screenshot(page, "policies")


async def test_a_bad_param_shows_the_servers_error_by_its_field(page: Any, console: Console) -> None:
    bad = {"name": "bad-one", "allocator": "fixed", "params": {"n": 3, "bogus": 1}}
    server = (await console.api.post("/v1/policies", json=bad)).json()["error"]
    assert server["param"].startswith("params.")

    await sign_in(page, ADMIN_KEY, "#/policies")
    await fill_policy(page, name="bad-one", allocator="fixed", params=json.dumps(bad["params"]))
    await expect(page.locator("#err-params")).to_have_text(f"{server['param']}: {server['message']}")
    await expect(page.locator("#f-params")).to_have_class("invalid")
    await expect(page.locator("#err-allocator")).to_be_empty()

    await page.fill("#f-params", "")
    await page.fill("#f-allocator", "no-such-allocator")
    await page.click("#save-policy")
    await expect(page.locator("#err-allocator")).to_contain_text("allocator")
    await expect(page.locator("#err-params")).to_be_empty()
    await expect(page.locator('#policies-table tr[data-policy="bad-one"]')).to_have_count(0)
    await screenshot(page, "policy-error")


async def test_a_playground_request_shows_its_samples_and_votes(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/playground")
    await page.fill("#pg-prompt", "What is 2 + 40?")
    await page.fill("#pg-policy", "self-consistency-8")
    await page.click("#pg-send")
    samples = page.locator("#samples tbody tr")
    await expect(samples).to_have_count(8)
    await expect(page.locator("#samples tbody tr.selected")).to_have_count(1)
    await expect(page.locator("#vote-growth tbody tr")).to_have_count(1)  # one round of 8
    last = await page.locator("#vote-growth tbody tr").last.locator("td").nth(2).inner_text()
    counts = {a: int(n) for a, n in (part.split(": ") for part in last.split(", "))}
    assert sum(counts.values()) == 8
    answer = await page.locator("#pg-answer").inner_text()
    assert counts[answer] == max(counts.values())  # the leader (a tie may go either way)
    await expect(page.locator("#pg-stop")).not_to_be_empty()
    await expect(page.locator("#pg-samples")).to_have_text("8")
    assert int(await page.locator("#pg-tokens").inner_text()) > 8 * 9
    await screenshot(page, "playground")

    # an adaptive policy: the votes after each of its rounds (launch waves), as many rows as rounds
    await page.fill("#pg-policy", "adaptive")
    await page.click("#pg-send")
    await expect(page.locator("#pg-stopline")).to_contain_text("policy adaptive")
    rounds = await page.locator("#samples tbody tr td:nth-child(2)").all_inner_texts()
    assert len(rounds) >= 1  # samples in the order they finished (streams of later waves may finish first)
    growth = page.locator("#vote-growth tbody tr")
    await expect(growth).to_have_count(len(set(rounds)))
    drawn = [int(t) for t in await growth.locator("td:nth-child(2)").all_inner_texts()]
    assert drawn[-1] == len(rounds) and drawn == sorted(drawn)

    # an inline spec, streamed: the votes grow one progress event at a time
    await page.check("#pg-use-inline")
    await page.fill("#pg-inline", '{"allocator": "fixed", "params": {"n": 4}, "schedule": "stream"}')
    await page.check("#pg-stream")
    await page.click("#pg-send")
    await expect(page.locator("#samples tbody tr")).to_have_count(4)
    growth = page.locator("#vote-growth tbody tr")
    assert await growth.count() >= 1
    drawn = [int(t) for t in await growth.locator("td:nth-child(2)").all_inner_texts()]
    assert drawn == sorted(drawn) and drawn[-1] <= 4
    await expect(page.locator("#pg-stopline")).to_contain_text("inline")


async def test_the_overview_numbers_move_after_traffic(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/overview")
    requests = page.locator("#stat-requests")
    await expect(requests).not_to_have_text("")
    before = int((await requests.inner_text()).replace(",", ""))
    for _ in range(5):
        resp = await console.api.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": [{"role": "user", "content": "What is 7 + 5?"}],
            "ttc": {"policy": "self-consistency-8"}})
        assert resp.status_code == 200, resp.text
    await expect(requests).to_have_text(f"{before + 5:,}", timeout=15_000)
    await expect(page.locator("#stat-samples")).not_to_have_text("–")
    await expect(page.locator("#stat-p50")).to_contain_text("ms")
    await expect(page.locator("#per-policy tbody")).to_contain_text("self-consistency-8")
    await expect(page.locator("#stop-reasons tbody tr").first).to_be_visible()
    await expect(page.locator("#backends tbody")).to_contain_text("fake0")
    await expect(page.locator("#stat-rate")).not_to_have_text("–")
    await screenshot(page, "overview")


async def test_a_replay_report_renders_its_charts(page: Any, console: Console) -> None:
    rep = json.loads((DATA / "replay-small.json").read_text())
    await sign_in(page, ADMIN_KEY, "#/reports")
    await page.locator('button.open-report[data-name="replay-small.json"]').click()
    charts = page.locator("#report-charts svg.chart")
    await expect(charts).to_have_count(2)
    accuracy = charts.nth(0)
    for series in (rep["policy"], "uniform majority", "oracle"):
        line = accuracy.locator(f'path.line[data-series="{series}"]')
        await expect(line).to_have_count(1)
        d = await line.get_attribute("d")
        assert d is not None and d.count("L") == len(rep["rows"]) - 1, d  # one vertex per budget
    assert await accuracy.locator("polygon.band").count() == 3  # the 95% intervals
    assert await accuracy.locator("circle").count() == 3 * len(rep["rows"])
    await screenshot(page, "reports-replay")

    await page.select_option("#report-axis", "tokens")
    await expect(accuracy.locator("path.line")).to_have_count(1)

    # a load-test summary opened from disk (parsed in the page)
    await page.set_input_files("#report-file", str(DATA / "loadtest" / "summary.json"))
    await expect(page.locator("#report")).to_have_attribute("data-kind", "loadtest")
    await expect(page.locator("#report-charts svg.chart")).to_have_count(2)
    lat = page.locator("#report-charts svg.chart").nth(0)
    for series in ("uniform p99", "elimination p99", "uniform p50"):
        await expect(lat.locator(f'path.line[data-series="{series}"]')).to_have_count(1)
    await screenshot(page, "reports-loadtest")


async def test_a_user_key_cannot_reach_admin_pages(page: Any, console: Console) -> None:
    key = await console.user_key(name="just-a-user")
    await sign_in(page, key, "#/overview")
    await expect(page.locator("#who")).to_contain_text("user")
    await expect(page.locator('#nav a[data-page="keys"]')).to_be_hidden()
    await expect(page.locator('#nav a[data-page="policies"]')).to_be_hidden()
    for hash_ in ("#/keys", "#/policies"):
        await page.evaluate(f"location.hash = '{hash_}'")
        await expect(page.locator("#page [role=alert]")).to_contain_text("403")
        await expect(page.locator("#page [role=alert]")).to_contain_text("admin key")
        await expect(page.locator("#keys-table, #policies-table")).to_have_count(0)
    await screenshot(page, "keys-as-user")
    # the playground works with a user key
    await page.evaluate("location.hash = '#/playground'")
    await page.fill("#pg-policy", "single")
    await page.click("#pg-send")
    await expect(page.locator("#samples tbody tr")).to_have_count(1)


async def test_keys_page_creates_lists_and_revokes(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/keys")
    await page.fill("#k-name", "made-in-ui")
    await page.fill("#k-requests_per_minute", "30")
    await page.click("#create-key")
    plain = await page.locator("#new-key").inner_text()
    assert plain.startswith("ttc-")
    key_id = plain.split("-")[1]
    row = page.locator(f'#keys-table tr[data-key="{key_id}"]')
    await expect(row).to_contain_text("made-in-ui")
    await expect(row).to_contain_text("30")
    assert (await console.api.get("/v1/ttc/whoami", headers={"Authorization": f"Bearer {plain}"})).status_code == 200
    await screenshot(page, "keys")
    await row.locator("button.revoke").click()
    await expect(row).to_have_count(0)
    await page.check("#keys-revoked")
    await expect(page.locator(f'#keys-table tr[data-key="{key_id}"]')).to_contain_text("revoked")
    assert (await console.api.get("/v1/ttc/whoami", headers={"Authorization": f"Bearer {plain}"})).status_code == 401


async def test_the_policies_page_shows_stored_params_and_says_others_are_defaults(page: Any, console: Console) -> None:
    await sign_in(page, ADMIN_KEY, "#/policies")
    stored = {p["name"]: p["spec"].get("params") or {} for p in (await console.api.get("/v1/policies")).json()["data"]}
    assert stored["elimination"] == {} and stored["default"] == {"max_samples": 4, "give_up_after": 1}
    for name, params in stored.items():
        cell = page.locator(f'#policies-table tr[data-policy="{name}"] td.params')
        if params:
            await expect(cell).to_have_text(", ".join(f"{k}={v}" for k, v in params.items()) + " · others: defaults")
        else:
            await expect(cell).to_have_text("all defaults")
    # editing a policy with no params of its own: an empty field that says so, not "{}"
    await page.locator('#policies-table tr[data-policy="elimination"] button.edit').click()
    await expect(page.locator("#f-params")).to_have_value("")
    await expect(page.locator("#f-params")).to_have_attribute("placeholder", 'all defaults, or e.g. {"max_samples": 8}')
    await screenshot(page, "policies-params")


async def test_the_keys_page_says_whether_auth_is_on(page: Any, console: Console, browser: Any,
                                                     console_auth_off: str) -> None:
    await sign_in(page, ADMIN_KEY, "#/keys")
    await expect(page.locator("#auth-state")).to_have_attribute("data-auth", "on")
    await expect(page.locator("#auth-state")).to_have_text("Auth is on: every request needs a key.")

    async with open_page(browser, console_auth_off) as off:
        await off.goto("/ui/#/keys")  # no key asked for: the service checks none
        await expect(off.locator("#who")).to_have_text("auth off")
        state = off.locator("#auth-state")
        await expect(state).to_have_attribute("data-auth", "off")
        await expect(state).to_contain_text("Auth is off (auth.enabled: false)")
        await expect(state).to_contain_text("apply only once auth is on")
        await expect(off.locator("#keys-table")).to_be_visible()
        await screenshot(off, "keys-auth-off")
