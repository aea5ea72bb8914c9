"""API keys: roles, hashing and checking (the FastAPI dependencies are in :mod:`app.deps`).

A key looks like ``ttc-<id>-<secret>`` (``id``: 12 hex, public, the database key; ``secret``: 48
hex). The store keeps only ``sha256(key)``; a presented key is looked up by its id and compared in
constant time. Keys listed in ``auth.admin_keys`` (config, usually ``os.environ/NAME``) are admin
keys that never touch the store (the bootstrap for creating others).

Roles: ``admin`` manages policies and keys and may also call inference; ``user`` calls inference
only (an admin route answers 403). With ``auth.enabled: false`` (the default for the local embedded
service) every caller is the anonymous admin, without limits.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app.config import AuthConfig
from app.errors import Unauthorized
from app.store.repo import ApiKey, Store

Role = Literal["admin", "user"]
ROLES: tuple[Role, ...] = ("admin", "user")


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: ``key_id`` None for config admin keys and when auth is off."""

    role: Role
    key_id: str | None = None
    name: str | None = None
    default_policy: str | None = None
    requests_per_minute: int | None = None
    samples_per_minute: int | None = None

    @property
    def limited(self) -> bool:
        return self.key_id is not None and bool(self.requests_per_minute or self.samples_per_minute)


ANONYMOUS = Principal(role="admin", name="anonymous")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> tuple[str, str, str]:
    """A new key: ``(plaintext, id, hash)``. The plaintext is shown once and never stored."""
    key_id = secrets.token_hex(6)
    plain = f"ttc-{key_id}-{secrets.token_hex(24)}"
    return plain, key_id, hash_key(plain)


def new_api_key(role: Role, *, name: str | None = None, default_policy: str | None = None,
                requests_per_minute: int | None = None,
                samples_per_minute: int | None = None) -> tuple[str, ApiKey]:
    plain, key_id, digest = generate_key()
    return plain, ApiKey(key_id, name, role, digest, default_policy, requests_per_minute, samples_per_minute,
                         time.time(), None)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The key a request presents: ``Authorization: Bearer <key>``, else ``x-api-key``, else None.
    An ``Authorization`` header of another scheme (``Basic ...``) or a bare token is a 401 that says
    what to send, not a "missing key"."""
    header = headers.get("authorization")
    if header:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            shown = scheme[:20] if token else "a bare token"
            raise Unauthorized(f"The Authorization header must be 'Bearer <key>' (got {shown!r}); "
                               "or send the key as 'x-api-key: <key>'.", code="invalid_authorization_scheme")
        return token.strip() or None
    return headers.get("x-api-key") or None


class Authenticator:
    """Checks presented keys; store lookups are cached for ``ttl_s`` (revocations through this
    process take effect at once, through another replica within ``ttl_s``)."""

    def __init__(self, config: AuthConfig, store: Store | None, ttl_s: float = 1.0) -> None:
        self.enabled = config.enabled
        self.store = store
        self.ttl_s = ttl_s
        self._admin_hashes = {hash_key(k) for k in config.admin_keys if k}
        self._cache: dict[str, tuple[float, ApiKey | None]] = {}

    def forget(self, key_id: str) -> None:
        self._cache.pop(key_id, None)

    async def _lookup(self, key_id: str) -> ApiKey | None:
        now = time.monotonic()
        hit = self._cache.get(key_id)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        row = await self.store.get_key(key_id) if self.store is not None else None
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key_id] = (now, row)
        return row

    async def from_headers(self, headers: Mapping[str, str]) -> Principal:
        """Who sent a request with these headers (:func:`bearer_token`); anyone when auth is off."""
        return await self.authenticate(bearer_token(headers)) if self.enabled else ANONYMOUS

    async def authenticate(self, presented: str | None) -> Principal:
        if not self.enabled:
            return ANONYMOUS
        if not presented:
            raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.", code="missing_api_key")
        digest = hash_key(presented)
        if any(hmac.compare_digest(digest, h) for h in self._admin_hashes):
            return Principal(role="admin", name="config-admin")
        parts = presented.split("-")
        row = await self._lookup(parts[1]) if len(parts) == 3 and parts[0] == "ttc" else None
        if row is None or row.revoked_at is not None or not hmac.compare_digest(digest, row.hash):
            raise Unauthorized("Invalid or revoked API key.")
        role: Role = "admin" if row.role == "admin" else "user"
        return Principal(role=role, key_id=row.id, name=row.name, default_policy=row.default_policy,
                         requests_per_minute=row.requests_per_minute, samples_per_minute=row.samples_per_minute)
