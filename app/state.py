"""Everything stateful in one object, built in the app's lifespan and reached through dependencies."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import httpx
from fastapi import Depends, Request

from allocators import Allocator
from app.backends.base import SampleSource
from app.backends.launcher import EmbeddedEngine
from app.config import Settings
from app.engine import Engine
from app.metrics import Metrics
from app.policy import PolicyParts, PolicyResolver, PolicySnapshot, build_parts

if TYPE_CHECKING:
    from app.auth import Authenticator
    from app.ratelimit import RateLimiter
    from app.recording import Recorder
    from app.shared_stats import SharedLearning
    from app.store import Store


@dataclass
class AppState:
    settings: Settings
    http: httpx.AsyncClient
    source: SampleSource
    engine: Engine
    metrics: Metrics
    policies: PolicyResolver
    models: list[str] = field(default_factory=list)
    embedded: EmbeddedEngine | None = None
    rng: random.Random = field(default_factory=random.Random)
    shared_allocators: dict[tuple[str, int, str], Allocator | None] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    store: Store | None = None
    auth: Authenticator | None = None
    limiter: RateLimiter | None = None
    recorder: Recorder | None = None
    shared_stats: SharedLearning | None = None
    redis: Any = None

    def shared_allocator(self, snapshot: PolicySnapshot) -> Allocator | None:
        """The one long-lived allocator of a policy version whose allocator learns across requests."""
        key = (snapshot.name, snapshot.version, snapshot.spec.model_dump_json())
        if key not in self.shared_allocators:
            parts = build_parts(snapshot.spec, random.Random(self.settings.seed))
            self.shared_allocators[key] = parts.allocator if parts.allocator.shared else None
        return self.shared_allocators[key]

    async def parts_for(self, snapshot: PolicySnapshot, seed: int | None) -> PolicyParts:
        """Allocator, aggregator and verifier for one run of ``snapshot``: a fresh allocator seeded by
        ``seed`` (or a random seed), or the policy's shared learning allocator, first brought up to
        date with what other replicas learned (a Redis failure only means learning locally)."""
        rng = random.Random(seed if seed is not None else self.rng.getrandbits(63))
        parts = build_parts(snapshot.spec, rng)
        shared = self.shared_allocator(snapshot)
        if shared is not None:
            parts.allocator = shared
            if self.shared_stats is not None:
                try:
                    await self.shared_stats.pull(snapshot, shared)
                except Exception as exc:
                    logging.getLogger("ttc.state").warning("could not pull shared statistics: %s", exc)
        return parts

    def default_model(self) -> str | None:
        if self.settings.default_model:
            return self.settings.default_model
        models = getattr(self.source, "models", None)
        found = models() if callable(models) else []
        return (found or self.models or [None])[0]


async def get_state(request: Request) -> AppState:
    """The app's state (async on purpose: FastAPI runs sync dependencies in a worker thread)."""
    return request.app.state.ttc


StateDep = Annotated[AppState, Depends(get_state)]
