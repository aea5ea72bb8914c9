"""Liveness, readiness, models and Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.deps import CatalogDep, MetricsDep, ParsePoolDep, ReaderDep, SourceDep
from app.errors import NotFound, TTCError
from app.protocol import ModelCard, ModelList, error_responses

router = APIRouter(tags=["system"])


class NotReady(TTCError):
    status_code = 503
    type = "service_unavailable"
    code = "not_ready"


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/ready", responses=error_responses(401, 503))
async def ready(source: SourceDep, parse_pool: ParsePoolDep, _who: ReaderDep) -> dict[str, str]:
    """Readiness: at least one backend answers its health check now, and the answer workers have
    warmed up (a replica still importing them would serve its first requests slowly)."""
    if not await source.ready():
        raise NotReady("No backend answers its health check.")
    if parse_pool.warming:
        raise NotReady("The answer workers are still starting.")
    return {"status": "ready"}


def _card(name: str) -> ModelCard:
    return ModelCard(id=name, created=int(time.time()))


@router.get("/v1/models", responses=error_responses(401))
async def models(catalog: CatalogDep, _who: ReaderDep) -> ModelList:
    """The models this service answers for (OpenAI ``models.list``)."""
    return ModelList(data=[_card(n) for n in catalog.names()])


@router.get("/v1/models/{model_id:path}", responses=error_responses(401, 404))
async def model(model_id: str, catalog: CatalogDep, _who: ReaderDep) -> ModelCard:
    """One model (OpenAI ``models.retrieve``); 404 when no backend serves it."""
    if model_id not in catalog.names():
        raise NotFound(f"The model {model_id!r} does not exist.", param="model", code="model_not_found")
    return _card(model_id)


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Prometheus text"},
    **error_responses(401)})
async def metrics(metrics: MetricsDep, _who: ReaderDep) -> Any:
    """Prometheus metrics of this process."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
