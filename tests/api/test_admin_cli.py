"""``ttc policy ...`` / ``ttc key ...`` on the store directly, and the config sections they read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.config import load_settings
from tests.support.cli import ttc_app


def cli() -> Any:
    return ttc_app()


def run(*args: str) -> Any:
    return CliRunner().invoke(cli(), list(args))


def test_policy_and_key_commands(tmp_path: Path) -> None:
    url = ["--store-url", f"sqlite+aiosqlite:///{tmp_path / 'ttc.db'}"]
    res = run("policy", "create", "quick", "--spec", '{"allocator": "fixed", "params": {"n": 2}}',
              "--description", "two", *url)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["version"] == 1
    res = run("policy", "create", "quick", "--spec", '{"allocator": "fixed"}', *url)
    assert res.exit_code == 1 and "already exists" in res.output
    spec = tmp_path / "spec.yaml"
    spec.write_text("allocator: fixed\nparams: {n: 3}\n")
    res = run("policy", "create", "quick", "--file", str(spec), "--update", *url)
    assert res.exit_code == 0 and json.loads(res.output)["version"] == 2
    res = run("policy", "create", "bad", "--spec", '{"allocator": "fixed", "params": {"n": 0}}', *url)
    assert res.exit_code == 1 and "[params.n]" in res.output
    assert run("policy", "set-default", "quick", *url).exit_code == 0
    res = run("policy", "list", *url)
    assert res.exit_code == 0 and "* quick v2" in res.output
    res = run("policy", "show", "quick", "--version", "1", *url)
    assert json.loads(res.output)["spec"]["params"] == {"n": 2}
    assert run("policy", "set-default", "ghost", *url).exit_code == 1

    res = run("key", "create", "--role", "user", "--name", "bob", "--default-policy", "quick", "--rpm", "10", *url)
    assert res.exit_code == 0, res.output
    key = json.loads(res.output)
    assert key["key"].startswith("ttc-") and key["requests_per_minute"] == 10
    listed = json.loads(run("key", "list", *url).output)
    assert [k["id"] for k in listed] == [key["id"]]
    res = run("key", "revoke", key["id"], *url)
    assert res.exit_code == 0 and json.loads(res.output)["revoked"] is True
    assert json.loads(run("key", "list", *url).output) == []


def test_config_sections_yaml_env_and_refs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "ttc.yaml"
    cfg.write_text(
        "auth:\n  enabled: true\n  admin_keys: [os.environ/MY_ADMIN_KEY]\n"
        "store:\n  url: os.environ/MY_DB_URL\n"
        "policies:\n  mine: {allocator: fixed, params: {n: 2}, description: hi}\n"
        "policies_override: true\n"
    )
    monkeypatch.delenv("TTC_STORE__URL", raising=False)
    monkeypatch.setenv("MY_ADMIN_KEY", "s3cret")
    monkeypatch.setenv("MY_DB_URL", "postgresql+asyncpg://u:p@db/ttc")
    monkeypatch.setenv("TTC_REDIS__URL", "redis://cache:6379/0")
    monkeypatch.setenv("TTC_RECORDING__ENABLED", "true")
    s = load_settings(cfg)
    assert s.auth.enabled and s.auth.admin_keys == ["s3cret"]
    assert s.store.resolved_url() == "postgresql+asyncpg://u:p@db/ttc"
    assert s.redis.url == "redis://cache:6379/0" and s.recording.enabled and s.policies_override
    monkeypatch.setenv("TTC_STORE__CACHE_TTL_S", "5")  # env overrides one field of a YAML section
    s = load_settings(cfg)
    assert s.store.cache_ttl_s == 5 and s.store.url == "postgresql+asyncpg://u:p@db/ttc"
    monkeypatch.delenv("TTC_STORE__CACHE_TTL_S")
    monkeypatch.delenv("TTC_REDIS__URL")
    monkeypatch.delenv("MY_DB_URL")
    with pytest.raises(ValueError, match="MY_DB_URL"):
        load_settings(cfg)
    default = load_settings()
    assert default.store.resolved_url().startswith("sqlite+aiosqlite:///") and not default.auth.enabled
    assert default.store.resolved_url().endswith("var/ttc.db")
