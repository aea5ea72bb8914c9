"""Batch API: ``POST /v1/ttc/batches`` and ``GET /v1/ttc/batches/{id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.auth import UserDep
from app.batches import BatchManager, BatchRequest
from app.ratelimit import CallerDep
from app.state import StateDep

router = APIRouter(tags=["batches"])


def manager(state: Any) -> BatchManager:
    return state.extras["batches"]


@router.post("/v1/ttc/batches")
async def create_batch(body: BatchRequest, state: StateDep, caller: CallerDep) -> Any:
    """Run a batch with one shared budget; small batches answer at once (200), large ones 202 + id.
    A batch without a policy gets the key's default policy; its whole sample budget is charged to
    the key's samples-per-minute limit at submission."""
    if body.policy is None and caller.default_policy:
        body = body.model_copy(update={"policy": caller.default_policy})
    job, done = await manager(state).submit(state, body)
    if state.limiter is not None:
        await state.limiter.charge_samples(caller, job.total_samples)
    return JSONResponse(job.view(), status_code=200 if done else 202)


@router.get("/v1/ttc/batches/{batch_id}")
async def get_batch(batch_id: str, state: StateDep, _caller: UserDep) -> dict[str, Any]:
    return manager(state).get(batch_id).view()
