"""Everything stateful in one typed container, built once in the app's lifespan (:func:`app.main`)
and reached by routes through :mod:`app.deps`. Nothing here is created at import time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from app.answers import ParsePool
from app.auth import Authenticator
from app.backends.base import SampleSource
from app.backends.launcher import EmbeddedEngine
from app.batches import BatchManager
from app.config import Settings
from app.engine import Engine
from app.metrics import Metrics
from app.ratelimit import RateLimiter
from app.recording import Recorder
from app.runner import Runner
from app.store import Store
from app.store.policies import StorePolicies


@dataclass
class AppState:
    """The service's resources. ``models`` are the names the embedded engine serves (the pool's
    backends report their own); ``redis`` is the client when ``redis.url`` is set."""

    settings: Settings
    http: httpx.AsyncClient
    source: SampleSource
    engine: Engine
    runner: Runner
    metrics: Metrics
    policies: StorePolicies
    batches: BatchManager
    parse_pool: ParsePool
    store: Store
    auth: Authenticator | None = None
    limiter: RateLimiter | None = None
    recorder: Recorder | None = None
    embedded: EmbeddedEngine | None = None
    redis: Any = None
    models: list[str] = field(default_factory=list)

    def known_models(self) -> list[str]:
        """Model names this service answers for: the configured default, the embedded engine's and
        every backend's (empty: the backends did not say)."""
        names = [*( [self.settings.default_model] if self.settings.default_model else []), *self.models,
                 *self.source.models()]
        return list(dict.fromkeys(names))

    def default_model(self) -> str | None:
        found = self.known_models()
        return found[0] if found else None
