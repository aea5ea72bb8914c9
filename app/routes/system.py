"""Liveness, readiness, models and Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.state import StateDep

router = APIRouter(tags=["system"])


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/ready")
async def ready(state: StateDep) -> Any:
    """Readiness: at least one backend answers its health check now."""
    check = getattr(state.source, "ready", None)
    ok = bool(await check()) if check is not None else True
    if ok:
        return {"status": "ready"}
    return JSONResponse(
        {"error": {"message": "No backend answers its health check.", "type": "service_unavailable",
                   "param": None, "code": "not_ready"}},
        status_code=503,
    )


@router.get("/v1/models")
async def models(state: StateDep) -> dict[str, Any]:
    names = list(dict.fromkeys([*(state.models or []), *([state.default_model()] if state.default_model() else [])]))
    found = getattr(state.source, "models", None)
    if callable(found):
        names = list(dict.fromkeys([*found(), *names]))
    now = int(time.time())
    return {"object": "list",
            "data": [{"id": n, "object": "model", "created": now, "owned_by": "ttc"} for n in names]}


@router.get("/metrics")
async def metrics(state: StateDep) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
