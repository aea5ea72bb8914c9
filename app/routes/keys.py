"""API keys (admin keys only): ``POST /v1/keys`` (the plaintext ``key`` is in this response only),
``GET /v1/keys[?include_revoked=true]``, ``GET /v1/keys/{id}``, ``DELETE /v1/keys/{id}`` (revoke)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from app.auth import new_api_key
from app.deps import AdminDep, AdminToolsDep, BatchesDep, json_body
from app.errors import NotFound
from app.protocol import request_body
from app.protocol.requests import IntOrNone

router = APIRouter(tags=["keys"])


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    name: str | None = Field(None, max_length=128)
    role: Literal["admin", "user"] = "user"
    default_policy: str | None = None
    requests_per_minute: IntOrNone = Field(None, ge=1, le=10**9)
    samples_per_minute: IntOrNone = Field(None, ge=1, le=10**12)


@router.post("/v1/keys", status_code=201, openapi_extra=request_body(KeyCreate))
async def create_key(body: Annotated[KeyCreate, json_body(KeyCreate)], admin: AdminToolsDep, _who: AdminDep) -> Any:
    store = admin.store
    if body.default_policy is not None:
        try:
            await store.get_policy(body.default_policy)
        except NotFound as exc:
            exc.param = "default_policy"
            raise
    plain, key = new_api_key(body.role, name=body.name, default_policy=body.default_policy,
                             requests_per_minute=body.requests_per_minute,
                             samples_per_minute=body.samples_per_minute)
    await store.add_key(key)
    return JSONResponse({**key.view(), "key": plain}, status_code=201)


@router.get("/v1/keys")
async def list_keys(admin: AdminToolsDep, _who: AdminDep,
                    include_revoked: Annotated[bool, Query()] = False) -> dict[str, Any]:
    keys = await admin.store.list_keys(include_revoked)
    return {"object": "list", "data": [k.view() for k in keys]}


@router.get("/v1/keys/{key_id}")
async def get_key(key_id: str, admin: AdminToolsDep, _who: AdminDep) -> dict[str, Any]:
    key = await admin.store.get_key(key_id)
    if key is None:
        raise NotFound(f"API key {key_id!r} does not exist.", param="key_id", code="key_not_found")
    return key.view()


@router.delete("/v1/keys/{key_id}")
async def revoke_key(key_id: str, admin: AdminToolsDep, batches: BatchesDep, _who: AdminDep) -> dict[str, Any]:
    """Revoke a key: it is refused at once, and its queued or running background batches are cancelled
    (``cancelled_batches``: their ids; a batch another replica runs stops at its next checkpoint)."""
    key = await admin.store.revoke_key(key_id)
    if admin.auth is not None:
        admin.auth.forget(key_id)
    return {**key.view(), "cancelled_batches": await batches.cancel_owned(key_id)}
