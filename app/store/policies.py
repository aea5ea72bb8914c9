"""``StorePolicies``: the :class:`~app.policy.PolicyResolver` backed by the store, and the start-up
sync of built-in and config-declared policies into it.

Resolution is cached: a version, once read, is immutable and cached for good (served only while its
policy is not deleted: its "latest" is checked first); "latest" and the default name are cached for
``ttl_s`` (writes through this process invalidate at once, so only another replica's edits can be up
to ``ttl_s`` old). A request resolves its snapshot once, at arrival, so an edit never changes a
request in flight.

Conflicts at start-up (``sync_declared``), for each built-in and config-declared policy:

* not stored yet -> stored as version 1 (source ``builtin`` / ``config``);
* stored with the same spec -> nothing;
* stored with a different spec -> **the store wins** (what operators committed through the API is
  never silently replaced; a warning names the policy), unless ``policies_override: true``, in
  which case a config-declared policy is appended as a new version (old versions stay readable);
* a built-in whose latest stored version was written by the built-in itself (``created_by``
  ``builtin``: nobody edited it) and differs from this release's -> the release's is appended as a
  new version (an upgrade changed the built-in; the log says so); one an operator edited is kept;
* deleted through the API -> stays deleted, unless ``policies_override: true`` (then revived).

Built-ins never override an operator's edit. The default policy: the stored setting wins; the config's
``default_policy`` seeds it on first start, and replaces it when ``policies_override: true``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from app.config import Settings
from app.errors import NotFound
from app.policy import BUILTIN_POLICIES, PolicySnapshot, parse_spec
from app.store.repo import DEFAULT_POLICY_KEY, PolicyVersion, Store

log = logging.getLogger("ttc.policies")


def spec_json(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validate a spec and return its normal JSON form (what the store keeps)."""
    return parse_spec(dict(data), where).model_dump(mode="json", exclude_none=True)


class StorePolicies:
    """Policies from the store with a small cache (see the module docstring)."""

    def __init__(self, store: Store, ttl_s: float = 1.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._versions: dict[tuple[str, int], PolicySnapshot] = {}
        self._latest: dict[str, tuple[float, PolicySnapshot]] = {}
        self._default: tuple[float, str] | None = None
        self._loading: dict[str, asyncio.Lock] = {}
        self._generation = 0  # bumped by invalidate(): a load that raced a local write is not cached

    def _snapshot(self, pv: PolicyVersion) -> PolicySnapshot:
        key = (pv.name, pv.version)
        snap = self._versions.get(key)
        if snap is None:
            snap = PolicySnapshot(pv.name, pv.version, parse_spec(pv.spec, f"policies.{pv.name}"))
            self._versions[key] = snap
        return snap

    async def get(self, name: str, version: int | None = None) -> PolicySnapshot:
        now = time.monotonic()
        if version is None:
            hit = self._latest.get(name)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
            if len(self._loading) > 10_000:
                self._loading.clear()
            async with self._loading.setdefault(name, asyncio.Lock()):  # one reload per expiry, not per request
                hit = self._latest.get(name)
                if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
                    return hit[1]
                return await self._load(name, None, now)
        cached = self._versions.get((name, version))
        if cached is not None:
            await self.get(name)  # a deleted policy's versions go with it (another replica's delete: within ttl_s)
            return cached
        return await self._load(name, version, now)

    async def _load(self, name: str, version: int | None, now: float) -> PolicySnapshot:
        generation = self._generation
        try:
            pv = await self.store.get_policy(name, version)
        except NotFound as exc:
            self._latest.pop(name, None)
            exc.param = "ttc.policy"
            raise
        snap = self._snapshot(pv)
        if version is None and generation == self._generation:
            self._latest[name] = (now, snap)
        return snap

    async def default_name(self) -> str:
        now = time.monotonic()
        if self._default is not None and now - self._default[0] < self.ttl_s:
            return self._default[1]
        generation = self._generation
        name = await self.store.get_setting(DEFAULT_POLICY_KEY)
        if name is None:
            raise NotFound("No default policy is set.", param="ttc.policy", code="policy_not_found")
        if generation == self._generation:
            self._default = (now, name)
        return name

    def invalidate(self, name: str | None = None) -> None:
        """Forget cached "latest" entries (one policy, or all and the default name)."""
        self._generation += 1
        if name is None:
            self._latest.clear()
            self._default = None
        else:
            self._latest.pop(name, None)

    async def names(self) -> list[str]:
        return [p.name for p in await self.store.list_policies()]


async def sync_declared(store: Store, settings: Settings) -> None:
    """Load built-in and config-declared policies and the default into the store (rules above)."""
    override = settings.policies_override
    deleted = await store.deleted_policy_names()
    declared: list[tuple[str, dict[str, Any], str | None, str]] = []
    for name, data in BUILTIN_POLICIES.items():
        declared.append((name, spec_json(data, f"policies.{name}"), None, "builtin"))
    for name, raw in settings.policies.items():
        data = dict(raw)
        description = data.pop("description", None)
        declared.append((name, spec_json(data, f"policies.{name}"), description, "config"))
    by_name: dict[str, tuple[dict[str, Any], str | None, str]] = {}
    for name, spec, description, source in declared:  # config after built-ins: config wins between them
        by_name[name] = (spec, description, source)
    for name, (spec, description, source) in by_name.items():
        try:
            current = await store.get_policy(name)
        except NotFound:
            if name in deleted and not (override and source == "config"):
                log.info("policy %r was deleted through the API; not re-creating it from %s", name, source)
                continue
            await store.put_policy(name, spec, description=description, source=source, created_by=source)
            continue
        if current.spec == spec:
            continue
        if override and source == "config":
            new = await store.put_policy(name, spec, description=description, created_by="config")
            log.warning("policy %r: config replaces stored version %d with version %d (policies_override)",
                        name, current.version, new.version)
        elif source == "config":
            log.warning("policy %r: the stored version %d differs from the config file; keeping the stored "
                        "one (set policies_override: true to replace it)", name, current.version)
        elif current.created_by == "builtin":
            new = await store.put_policy(name, spec, created_by="builtin")
            log.info("built-in policy %r changed in this release: stored version %d, now version %d", name,
                     current.version, new.version)
        else:
            log.warning("built-in policy %r changed in this release; keeping the stored version %d, which "
                        "%s edited", name, current.version, current.created_by)
    stored_default = await store.get_setting(DEFAULT_POLICY_KEY)
    wanted = settings.default_policy
    if stored_default is None or (override and stored_default != wanted):
        try:
            await store.get_policy(wanted)
        except NotFound:
            raise ValueError(f"default policy {wanted!r} is not defined") from None
        await store.set_setting(DEFAULT_POLICY_KEY, wanted)
    elif stored_default != wanted:
        log.info("default policy is %r (stored); the config's %r applies only with policies_override",
                 stored_default, wanted)
