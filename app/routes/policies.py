"""Policies as managed resources (admin keys): create, list, read (any version), update (a new
version each time), delete, and the default policy.

* ``POST /v1/policies`` ``{name, allocator, params, aggregator, verifier, budget, record, description}``
  -> 201, version 1 (409 if the name is taken);
* ``GET /v1/policies`` -> every live policy at its latest version, and the default;
* ``GET /v1/policies/{name}[?version=N]``, ``GET /v1/policies/{name}/versions``;
* ``GET /v1/policies/{name}/state[?version=N]`` -> the allocator's learned state (``state_dict``) as
  this replica holds it after pulling the shared log, and the log position it stands at;
* ``PUT /v1/policies/{name}`` (whole spec) / ``PATCH`` (JSON merge patch of the latest spec) -> a
  new version; ``expected_version`` in the body makes it conditional (409 when stale);
* ``DELETE /v1/policies/{name}[?force=true]`` -> refused (409) for the default policy or one that
  is some key's default, unless forced: forcing unbinds the keys, and deleting the default makes the
  config's ``default_policy`` the default again (refused if that is this very policy);
* ``GET /v1/settings/default_policy``, ``PUT /v1/settings/default_policy`` ``{"policy": name}``.

Specs are validated against the allocator / aggregator / verifier registries: a bad field is a 400
whose ``param`` names it (``params.threshold``, ``verifier.name``, ...).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, create_model

from app.auth import Principal
from app.deps import AdminDep, AdminToolsDep, JSONObjectDep
from app.errors import Conflict, InvalidRequest, NotFound
from app.policy import parse_spec
from app.protocol import PolicySpec, PolicyState, error_responses, request_body
from app.state import Admin
from app.store import DEFAULT_POLICY_KEY, PolicyVersion, Store

router = APIRouter(tags=["policies"])

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
META_FIELDS = ("name", "description", "expected_version")
VERSION_MAX = 2**63 - 1
"""The largest version a query may name: the store's integer column (SQLite, Postgres ``bigint``)."""


# The bodies of the policy writes, for the OpenAPI document only: the routes read a JSON object and
# validate it themselves (split_body, validated_spec), so that errors name the body's fields.
class PolicyCreate(PolicySpec):
    """``POST /v1/policies``: a new policy's name, its spec's fields at the top level, and a description."""

    name: str = Field(pattern=NAME.pattern, json_schema_extra={"not": {"const": "inline"}},
                      description="1-128 letters, digits, '.', '_' or '-', starting with a letter or digit ('inline' "
                                  "is reserved)")
    description: str | None = Field(None, description="What the policy is for")


class PolicyReplace(PolicySpec):
    """``PUT /v1/policies/{name}``: the whole spec of the new version (the URL names the policy; a ``name``
    in the body must be the URL's)."""

    description: str | None = Field(None, description="What the policy is for (absent: none)")
    expected_version: int | None = Field(None, ge=1, description="Write only if the latest version is this one "
                                                                 "(else 409)")


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


_PATCH_FIELDS: dict[str, Any] = {
    name: (info.annotation, Field(None, description=info.description, json_schema_extra=_drop_default))
    if info.is_required() else (info.annotation | None, Field(None, description=info.description))  # type: ignore[operator]
    for name, info in PolicySpec.model_fields.items()}
PolicyPatch = create_model(  # every spec field optional; null removes one that has a default (RFC 7386)
    "PolicyPatch", __doc__="``PATCH /v1/policies/{name}``: a JSON merge patch (RFC 7386) of the latest spec "
    "(null removes a field, back to its default); the result must be a valid spec.",
    __config__=ConfigDict(extra="forbid"), **_PATCH_FIELDS,
    description=(str | None, Field(None, description="What the policy is for (absent: kept)")),
    expected_version=(int | None, Field(None, ge=1, description="Write only if the latest version is this one "
                                                                "(else 409)")),
)


class DefaultPolicy(BaseModel):
    """``PUT /v1/settings/default_policy``: the name of an existing policy."""

    policy: str = Field(description="A policy's name (404 if there is none)")


def check_name(name: Any, param: str = "name") -> str:
    if not isinstance(name, str) or not NAME.match(name) or name == "inline":
        raise InvalidRequest(
            "A policy name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "('inline' is reserved).", param=param, code="invalid_value")
    return name


def validated_spec(data: dict[str, Any]) -> dict[str, Any]:
    """Validate a spec given at the top level of a body; errors name the body field."""
    try:
        spec = parse_spec(data, where="spec")
    except InvalidRequest as exc:
        if exc.param:
            exc.param = exc.param.removeprefix("spec").removeprefix(".") or None
            exc.message = exc.message.replace("'spec.", "'")
        raise
    return spec.model_dump(mode="json", exclude_none=True)


def split_body(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    meta = {k: body[k] for k in META_FIELDS if k in body}
    spec = {k: v for k, v in body.items() if k not in META_FIELDS}
    if "description" in meta and meta["description"] is not None and not isinstance(meta["description"], str):
        raise InvalidRequest("description must be a string.", param="description", code="invalid_value")
    ev = meta.get("expected_version")
    if isinstance(ev, float) and ev.is_integer():  # JSON says 1.0 == 1
        ev = meta["expected_version"] = int(ev)
    if ev is not None and (not isinstance(ev, int) or isinstance(ev, bool) or ev < 1):
        raise InvalidRequest("expected_version must be a positive integer.", param="expected_version",
                             code="invalid_value")
    return meta, spec


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` removes a member."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


async def default_name(store: Store) -> str | None:
    return await store.get_setting(DEFAULT_POLICY_KEY)


async def view(store: Store, pv: PolicyVersion, default: str | None = None) -> dict[str, Any]:
    default = default if default is not None else await default_name(store)
    return {**pv.view(), "default": pv.name == default}


def invalidate(admin: Admin, name: str | None = None) -> None:
    admin.policies.invalidate(name)


async def _write(admin: Admin, who: Principal, name: str, body: dict[str, Any], **mode: Any) -> PolicyVersion:
    meta, spec_data = split_body(body)
    spec = validated_spec(spec_data)
    pv = await admin.store.put_policy(
        name, spec, description=meta.get("description"), created_by=who.key_id or who.name,
        expected_version=meta.get("expected_version"), **mode)
    invalidate(admin, name)
    return pv


@router.post("/v1/policies", status_code=201, openapi_extra=request_body(PolicyCreate))
async def create_policy(body: JSONObjectDep, admin: AdminToolsDep, who: AdminDep) -> Any:
    name = check_name(body.get("name"))
    pv = await _write(admin, who, name, body, create_only=True)
    return JSONResponse(await view(admin.store, pv), status_code=201)


@router.get("/v1/policies")
async def list_policies(admin: AdminToolsDep, _who: AdminDep) -> dict[str, Any]:
    store = admin.store
    default = await default_name(store)
    data = [await view(store, pv, default or "") for pv in await store.list_policies()]
    return {"object": "list", "data": data, "default": default}


@router.get("/v1/policies/{name}")
async def get_policy(name: str, admin: AdminToolsDep, _who: AdminDep,
                     version: Annotated[int | None, Query(ge=1, le=VERSION_MAX)] = None) -> dict[str, Any]:
    store = admin.store
    return await view(store, await store.get_policy(name, version))


@router.get("/v1/policies/{name}/state", responses=error_responses(401, 403, 404))
async def policy_state(name: str, admin: AdminToolsDep, _who: AdminDep,
                       version: Annotated[int | None, Query(ge=1, le=VERSION_MAX)] = None) -> PolicyState:
    """The learned state of a policy version's allocator (the latest version by default). A learning
    allocator is the instance this replica's runs use, first brought to the end of the shared log, so
    replicas at the same ``applied`` position answer the same ``state`` (see :mod:`app.shared_stats`)."""
    try:
        snapshot = await admin.policies.get(name, version)
    except NotFound as exc:
        exc.param = "name"
        raise
    parts = await admin.preparer.parts_for(snapshot, 0)
    shared = admin.preparer.shared
    return PolicyState(name=snapshot.name, version=snapshot.version, allocator=snapshot.spec.allocator,
                       shared=parts.learns, state=parts.allocator.state_dict(),
                       applied=shared.position(parts.allocator) if parts.learns and shared is not None else None)


@router.get("/v1/policies/{name}/versions")
async def list_versions(name: str, admin: AdminToolsDep, _who: AdminDep) -> dict[str, Any]:
    store = admin.store
    default = await default_name(store) or ""
    return {"object": "list", "data": [await view(store, pv, default) for pv in await store.list_versions(name)]}


@router.put("/v1/policies/{name}", openapi_extra=request_body(PolicyReplace))
async def replace_policy(name: str, body: JSONObjectDep, admin: AdminToolsDep, who: AdminDep) -> dict[str, Any]:
    if "name" in body and body["name"] != name:
        raise InvalidRequest("The body's name differs from the URL's.", param="name", code="invalid_value")
    pv = await _write(admin, who, name, body, update_only=True)
    return await view(admin.store, pv)


@router.patch("/v1/policies/{name}", openapi_extra=request_body(PolicyPatch))
async def patch_policy(name: str, body: JSONObjectDep, admin: AdminToolsDep, who: AdminDep) -> dict[str, Any]:
    if "name" in body and body["name"] != name:
        raise InvalidRequest("A policy cannot be renamed.", param="name", code="invalid_value")
    store = admin.store
    current = await store.get_policy(name)
    meta, patch = split_body(body)
    merged = merge_patch(current.spec, patch)
    full = {**merged, **{k: v for k, v in meta.items() if k != "name"}}
    if "description" not in meta and current.description is not None:
        full["description"] = current.description
    pv = await _write(admin, who, name, full, update_only=True)
    return await view(store, pv)


@router.delete("/v1/policies/{name}")
async def delete_policy(name: str, admin: AdminToolsDep, _who: AdminDep,
                        force: Annotated[bool, Query()] = False) -> dict[str, Any]:
    store = admin.store
    await store.get_policy(name)  # 404 first
    new_default = None
    if name == await default_name(store):
        fallback = admin.default_policy
        if not force:
            raise Conflict(f"Policy {name!r} is the default policy; set another default first, or delete with "
                           f"?force=true to fall back to the configured default {fallback!r}.",
                           param="name", code="policy_is_default")
        try:
            if fallback == name:
                raise NotFound("")
            await store.get_policy(fallback)
        except NotFound:
            raise Conflict(f"Policy {name!r} is the default policy and the configured default {fallback!r} "
                           "cannot replace it; set another default first.", param="name",
                           code="policy_is_default") from None
        new_default = fallback
    bound = await store.keys_bound_to(name)
    if bound and not force:
        raise Conflict(f"Policy {name!r} is the default policy of {len(bound)} key(s) ({', '.join(bound[:5])}); "
                       "delete with ?force=true to unbind them.", param="name", code="policy_in_use")
    if new_default is not None:
        await store.set_setting(DEFAULT_POLICY_KEY, new_default)
    await store.delete_policy(name)
    invalidate(admin)
    if admin.auth is not None:
        for key_id in bound:
            admin.auth.forget(key_id)
    return {"object": "policy.deleted", "name": name, "deleted": True, "unbound_keys": bound,
            "default_policy": new_default or await default_name(store)}


@router.get("/v1/settings/default_policy")
async def get_default(admin: AdminToolsDep, _who: AdminDep) -> dict[str, Any]:
    return {"object": "setting", "key": "default_policy", "policy": await default_name(admin.store)}


@router.put("/v1/settings/default_policy", openapi_extra=request_body(DefaultPolicy))
async def set_default(body: JSONObjectDep, admin: AdminToolsDep, _who: AdminDep) -> dict[str, Any]:
    name = body.get("policy")
    if not isinstance(name, str):
        raise InvalidRequest("Give the default as {\"policy\": name}.", param="policy", code="invalid_value")
    store = admin.store
    try:
        await store.get_policy(name)
    except NotFound as exc:
        exc.param = "policy"
        raise
    await store.set_setting(DEFAULT_POLICY_KEY, name)
    invalidate(admin)
    return {"object": "setting", "key": "default_policy", "policy": name}
