"""Everything stateful in one typed container, built once in the app's lifespan (:func:`app.main`).
Routes never see it: :mod:`app.deps` hands each route the few typed parts it uses. Nothing here is
created at import time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from app.answers import ParsePool
from app.auth import Authenticator
from app.backends.base import SampleSource
from app.backends.launcher import EngineSet
from app.backends.pool import ModelCatalog
from app.batches import BatchManager
from app.config import Settings
from app.engine import Engine
from app.metrics import Metrics
from app.prepare import Preparer
from app.ratelimit import RateLimiter
from app.recording import Recorder
from app.runner import Runner
from app.serving import OpenAIServing
from app.store import Store
from app.store.policies import StorePolicies


@dataclass(frozen=True, slots=True)
class Admin:
    """What the admin routes (policies, keys) use: the store, the policy cache to invalidate, the
    authenticator to forget keys, the preparer (a policy version's parts) and the config's default
    policy (the fallback when the stored default is deleted)."""

    store: Store
    policies: StorePolicies
    auth: Authenticator | None
    preparer: Preparer
    default_policy: str


@dataclass
class AppState:
    """The service's resources. ``redis`` is the client when ``redis.url`` is set."""

    settings: Settings
    http: httpx.AsyncClient
    source: SampleSource
    catalog: ModelCatalog
    engine: Engine
    preparer: Preparer
    runner: Runner
    serving: OpenAIServing
    metrics: Metrics
    policies: StorePolicies
    batches: BatchManager
    parse_pool: ParsePool
    store: Store
    admin: Admin
    auth: Authenticator | None = None
    limiter: RateLimiter | None = None
    recorder: Recorder | None = None
    engines: EngineSet | None = None
    redis: Any = None
