"""Batch API: create, list, get and cancel batches (``/v1/ttc/batches``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from app.deps import AdmittedDep, BatchesDep, UserDep
from app.protocol import (
    BatchDeleted,
    BatchList,
    BatchRequest,
    BatchView,
    JSONBytes,
    error_responses,
    parse_json,
    request_body,
)

router = APIRouter(tags=["batches"])


@router.post("/v1/ttc/batches", response_model=None, responses={
    200: {"model": BatchView, "description": "A synchronous batch, completed"},
    202: {"model": BatchView, "description": "A background batch, queued: poll GET /v1/ttc/batches/{id}"},
    **error_responses(400, 401, 404, 429, 502, 503, 504)}, openapi_extra=request_body(BatchRequest))
async def create_batch(request: Request, batches: BatchesDep, ctx: AdmittedDep) -> Any:
    """Run a batch with one shared budget; small batches answer at once (200), large ones 202 + id.
    A batch without a policy gets the key's default policy (else ``greedy``); the samples it drew are
    charged to the key's samples-per-minute limit when it finishes."""
    body = parse_json(await request.body(), BatchRequest, batches.check_raw)
    rec, done = await batches.submit(body, principal=ctx.caller, request_id=ctx.request_id)
    return JSONBytes(rec.view(), status_code=200 if done else 202)


@router.get("/v1/ttc/batches", response_model=None,
            responses={200: {"model": BatchList}, **error_responses(400, 401, 404)})
async def list_batches(batches: BatchesDep, caller: UserDep,
                       limit: int = Query(20, ge=1, le=100, description="Batches per page"),
                       after: str | None = Query(None, max_length=64,
                                                 description="The last batch id of the previous page")) -> Any:
    """The caller's batches, newest first (an admin key sees everyone's), without per-prompt results."""
    rows, more = await batches.page(caller, limit=limit, after=after)
    return JSONBytes({"object": "list", "data": [r.view(results=False) for r in rows], "has_more": more})


@router.get("/v1/ttc/batches/{batch_id}", response_model=None,
            responses={200: {"model": BatchView}, **error_responses(401, 404)})
async def get_batch(batch_id: str, batches: BatchesDep, caller: UserDep) -> Any:
    """A batch's status and progress; its results once completed (only the key that made it, or an
    admin). Any replica answers: batches live in the store."""
    return JSONBytes((await batches.get(batch_id, caller)).view())


@router.post("/v1/ttc/batches/{batch_id}/cancel", response_model=None,
             responses={200: {"model": BatchView}, **error_responses(401, 404)})
async def cancel_batch(batch_id: str, batches: BatchesDep, caller: UserDep) -> Any:
    """Cancel a queued or running batch: its backend calls stop (at once on the replica that runs it,
    else at that replica's next checkpoint: ``cancel_requested`` is true until then). The samples it
    drew stay in its progress; a finished batch is left as it is."""
    return JSONBytes((await batches.cancel(batch_id, caller)).view())


@router.delete("/v1/ttc/batches/{batch_id}", response_model=None,
               responses={200: {"model": BatchDeleted}, **error_responses(401, 404)})
async def delete_batch(batch_id: str, batches: BatchesDep, caller: UserDep) -> Any:
    """Delete a batch: cancelled first if it still runs, then removed with its samples (a later read
    is a 404)."""
    await batches.delete(batch_id, caller)
    return JSONBytes({"id": batch_id, "object": "ttc.batch.deleted", "deleted": True})
