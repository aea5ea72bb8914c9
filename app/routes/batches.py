"""Batch API: ``POST /v1/ttc/batches`` and ``GET /v1/ttc/batches/{id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.batches import BatchManager, BatchRequest
from app.state import StateDep

router = APIRouter(tags=["batches"])


def manager(state: Any) -> BatchManager:
    return state.extras["batches"]


@router.post("/v1/ttc/batches")
async def create_batch(body: BatchRequest, state: StateDep) -> Any:
    """Run a batch with one shared budget; small batches answer at once (200), large ones 202 + id."""
    job, done = await manager(state).submit(state, body)
    return JSONResponse(job.view(), status_code=200 if done else 202)


@router.get("/v1/ttc/batches/{batch_id}")
async def get_batch(batch_id: str, state: StateDep) -> dict[str, Any]:
    return manager(state).get(batch_id).view()
