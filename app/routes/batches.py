"""Batch API: ``POST /v1/ttc/batches`` and ``GET /v1/ttc/batches/{id}``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.batches import BatchRequest
from app.deps import InferenceDep, StateDep, UserDep
from app.protocol import BatchView, JSONBytes, error_responses
from app.serving import check_model

router = APIRouter(tags=["batches"])


@router.post("/v1/ttc/batches", response_model=None, responses={
    200: {"model": BatchView, "description": "A synchronous batch, completed"},
    202: {"model": BatchView, "description": "A background batch, queued: poll GET /v1/ttc/batches/{id}"},
    **error_responses(400, 401, 404, 429, 502, 503, 504)})
async def create_batch(body: BatchRequest, ctx: InferenceDep) -> Any:
    """Run a batch with one shared budget; small batches answer at once (200), large ones 202 + id.
    A batch without a policy gets the key's default policy (else ``greedy``); the samples it drew are
    charged to the key's samples-per-minute limit when it finishes."""
    model = check_model(ctx.state, body.model)
    job, done = await ctx.state.batches.submit(body, model=model, principal=ctx.caller, request_id=ctx.request_id)
    return JSONBytes(job.view(), status_code=200 if done else 202)


@router.get("/v1/ttc/batches/{batch_id}", response_model=None,
            responses={200: {"model": BatchView}, **error_responses(401, 404)})
async def get_batch(batch_id: str, state: StateDep, caller: UserDep) -> Any:
    """A batch's status and progress; its results once completed (only the key that made it, or an admin)."""
    return JSONBytes(state.batches.get(batch_id, caller).view())
