"""Admin commands: ``ttc policy list|show|create|set-default``, ``ttc key create|list|revoke``,
``ttc export``.

They work on the store directly (the URL from ``--store-url``, else the config file / ``TTC_STORE__URL``,
else the default SQLite file), running its migrations first when the schema is behind (only then do
they take the store's write lock for it), so they need no running service and
work when it is down. A running service sees a change at once for its own writes and within
``store.cache_ttl_s`` (1 s by default) for writes made here.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

T = TypeVar("T")

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file (also TTC_CONFIG).")]
StoreOpt = Annotated[str | None, typer.Option("--store-url", help="Store URL (overrides the config).")]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: float | None = None) -> float:
    """``7d`` / ``12h`` / ``30m`` ago, an ISO date or datetime (UTC unless it says), or epoch seconds."""
    text = text.strip()
    m = _RELATIVE.match(text)
    if m:
        return (now if now is not None else time.time()) - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use e.g. 7d, 12h, 30m, 2025-01-31 or 2025-01-31T12:00") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


async def _schema_ready(db: Any) -> None:
    """Migrate the store only when its schema is behind: reading the revision takes no write lock,
    where an upgrade, even a no-op one, waits for SQLite's (behind a running service's writes)."""
    from app.store.migrate import current_revision, head_revision, upgrade

    if await current_revision(db) != head_revision():
        await upgrade(db)  # takes the lock, and finds the schema at head if another process got there first


def _run(config: Path | None, store_url: str | None, work: Callable[[Any], Awaitable[T]]) -> T:
    from app.config import load_settings
    from app.errors import TTCError
    from app.store import open_store

    async def main() -> T:
        settings = load_settings(config)
        store = await open_store(store_url or settings.store.resolved_url(), migrate=False)
        try:
            await _schema_ready(store.db)
            return await work(store)
        finally:
            await store.db.close()

    try:
        return asyncio.run(main())
    except TTCError as exc:
        typer.echo(f"error: {exc.message}" + (f" [{exc.param}]" if exc.param else ""), err=True)
        raise typer.Exit(1) from None


def _echo(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _load_spec(spec: str | None, file: Path | None) -> dict[str, Any]:
    if (spec is None) == (file is None):
        raise typer.BadParameter("give exactly one of --spec JSON or --file FILE (JSON or YAML)")
    import yaml

    text = spec if spec is not None else Path(str(file)).read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise typer.BadParameter("the policy spec must be a mapping")
    return data


def policy_list(config: ConfigOpt = None, store_url: StoreOpt = None) -> None:
    """Every live policy at its latest version (* marks the default)."""
    from app.store import DEFAULT_POLICY_KEY

    async def work(store: Any) -> None:
        default = await store.get_setting(DEFAULT_POLICY_KEY)
        for pv in await store.list_policies():
            mark = "*" if pv.name == default else " "
            typer.echo(f"{mark} {pv.name} v{pv.version} ({pv.source}): {json.dumps(pv.spec)}")

    _run(config, store_url, work)

def policy_show(name: str, version: Annotated[int | None, typer.Option(help="A past version.")] = None,
                config: ConfigOpt = None, store_url: StoreOpt = None) -> None:
    """One policy (latest version unless --version) as JSON."""
    async def work(store: Any) -> None:
        _echo((await store.get_policy(name, version)).view())

    _run(config, store_url, work)

def policy_create(
    name: str,
    spec: Annotated[str | None, typer.Option(help='Spec as JSON, e.g. \'{"allocator": "fixed", '
                                                  '"params": {"n": 4}}\'.')] = None,
    file: Annotated[Path | None, typer.Option(help="Spec file (JSON or YAML).")] = None,
    description: Annotated[str | None, typer.Option(help="Free text.")] = None,
    update: Annotated[bool, typer.Option(help="Add a version when the policy exists.")] = False,
    config: ConfigOpt = None, store_url: StoreOpt = None,
) -> None:
    """Create a policy (validated like the API; --update adds a new version to an existing one)."""
    from app.routes.policies import check_name, validated_spec

    data = _load_spec(spec, file)
    description = description or data.pop("description", None)

    async def work(store: Any) -> None:
        pv = await store.put_policy(check_name(name), validated_spec(data), description=description,
                                    created_by="cli", create_only=not update)
        _echo(pv.view())

    _run(config, store_url, work)

def policy_set_default(name: str, config: ConfigOpt = None, store_url: StoreOpt = None) -> None:
    """Make NAME the policy of requests that name none."""
    from app.store import DEFAULT_POLICY_KEY

    async def work(store: Any) -> None:
        await store.get_policy(name)
        await store.set_setting(DEFAULT_POLICY_KEY, name)
        typer.echo(f"default policy: {name}")

    _run(config, store_url, work)

def key_create(
    role: Annotated[str, typer.Option(help="user (inference) or admin (also manages policies/keys).")] = "user",
    name: Annotated[str | None, typer.Option(help="A label.")] = None,
    default_policy: Annotated[str | None, typer.Option(help="Policy of this key's requests.")] = None,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute.", min=1)] = None,
    spm: Annotated[int | None, typer.Option(help="Samples per minute.", min=1)] = None,
    config: ConfigOpt = None, store_url: StoreOpt = None,
) -> None:
    """Create a key and print it (the only time the plaintext is shown)."""
    from app.auth import ROLES, new_api_key

    if role not in ROLES:
        raise typer.BadParameter("role is user or admin", param_hint="--role")

    async def work(store: Any) -> None:
        if default_policy:
            await store.get_policy(default_policy)
        plain, key = new_api_key(role, name=name, default_policy=default_policy,
                                 requests_per_minute=rpm, samples_per_minute=spm)
        await store.add_key(key)
        _echo({**key.view(), "key": plain})

    _run(config, store_url, work)

def key_list(config: ConfigOpt = None, store_url: StoreOpt = None) -> None:
    """Keys that are not revoked (never their secrets)."""
    async def work(store: Any) -> None:
        _echo([k.view() for k in await store.list_keys()])

    _run(config, store_url, work)

def key_revoke(key_id: str, config: ConfigOpt = None, store_url: StoreOpt = None) -> None:
    """Revoke a key by its id (the part after ``ttc-``); effective at once."""
    async def work(store: Any) -> None:
        _echo((await store.revoke_key(key_id)).view())

    _run(config, store_url, work)

def export(
    out: Annotated[Path, typer.Option(help="Output JSONL file (the replay schema).")],
    since: Annotated[str | None, typer.Option(help="Start: 7d, 12h, 30m ago, ISO date/time or epoch.")] = None,
    until: Annotated[str | None, typer.Option(help="End (exclusive), same forms.")] = None,
    policy: Annotated[str | None, typer.Option(help="Only this policy's traffic.")] = None,
    config: ConfigOpt = None, store_url: StoreOpt = None,
) -> None:
    """Write recorded traffic as replay JSONL (one problem per served query) for `ttc replay`."""
    from app.recording import export_jsonl

    t0 = parse_time(since) if since else None
    t1 = parse_time(until) if until else None

    async def work(store: Any) -> int:
        return await export_jsonl(store, out, since=t0, until=t1, policy=policy)

    n = _run(config, store_url, work)
    typer.echo(f"wrote {n} problem(s) to {out}")


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add ``ttc policy ...``, ``ttc key ...`` and ``ttc export`` to the command line."""
    policy_app = typer.Typer(help="Manage allocation policies in the store.", no_args_is_help=True)
    key_app = typer.Typer(help="Manage API keys in the store.", no_args_is_help=True)
    app.add_typer(policy_app, name="policy")
    app.add_typer(key_app, name="key")
    policy_app.command("list", short_help="Every live policy at its latest version.")(policy_list)
    policy_app.command("show")(policy_show)
    policy_app.command("create", short_help="Create a policy (--update: add a version).")(policy_create)
    policy_app.command("set-default", short_help="Make NAME the default policy.")(policy_set_default)
    key_app.command("create", short_help="Create a key and print it (shown once).")(key_create)
    key_app.command("list", short_help="Keys that are not revoked (never their secrets).")(key_list)
    key_app.command("revoke", short_help="Revoke a key by its id; effective at once.")(key_revoke)
    app.command("export", short_help="Write recorded traffic as replay JSONL.")(export)
