"""The FastAPI dependencies, in one place: each route receives the few typed parts it uses (the
serving object, the batch manager, the model catalog, the metrics, ...), the caller (admitted within
its rate limits for inference) and the request id; never the whole :class:`~app.state.AppState`.

Domain modules (auth, rate limits, serving) know nothing of FastAPI; routes reach them through these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, RootModel

from app.answers import ParsePool
from app.auth import ANONYMOUS, Authenticator, Principal
from app.backends.base import SampleSource
from app.backends.pool import ModelCatalog
from app.batches import BatchManager
from app.config import UIConfig
from app.errors import Forbidden
from app.metrics import Metrics
from app.middleware import request_id_of
from app.protocol import parse_json
from app.serving import OpenAIServing
from app.state import Admin, AppState

B = TypeVar("B", bound=BaseModel)


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.ttc
    return state


# Async on purpose: FastAPI runs sync dependencies in a worker thread.
async def _batches(request: Request) -> BatchManager:
    return _state(request).batches


async def _catalog(request: Request) -> ModelCatalog:
    return _state(request).catalog


async def _metrics(request: Request) -> Metrics:
    return _state(request).metrics


async def _source(request: Request) -> SampleSource:
    return _state(request).source


async def _parse_pool(request: Request) -> ParsePool:
    return _state(request).parse_pool


async def _auth(request: Request) -> Authenticator | None:
    return _state(request).auth


async def _admin(request: Request) -> Admin:
    return _state(request).admin


async def _ui(request: Request) -> UIConfig:
    return _state(request).settings.ui


BatchesDep = Annotated[BatchManager, Depends(_batches)]
CatalogDep = Annotated[ModelCatalog, Depends(_catalog)]
MetricsDep = Annotated[Metrics, Depends(_metrics)]
SourceDep = Annotated[SampleSource, Depends(_source)]
ParsePoolDep = Annotated[ParsePool, Depends(_parse_pool)]
AuthDep = Annotated[Authenticator | None, Depends(_auth)]
AdminToolsDep = Annotated[Admin, Depends(_admin)]
UIConfigDep = Annotated[UIConfig, Depends(_ui)]


async def current_principal(request: Request) -> Principal:
    auth = _state(request).auth
    if auth is None:
        return ANONYMOUS
    return await auth.from_headers(request.headers)


async def require_user(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """Any valid key (user or admin)."""
    return principal


async def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("This route needs an admin key.", code="admin_required")
    return principal


UserDep = Annotated[Principal, Depends(require_user)]


async def reader(request: Request) -> Principal:
    """A read-only system path: open when auth is off or the path is in ``auth.public_paths``, else
    any valid key."""
    state = _state(request)
    if state.auth is None or not state.auth.enabled or request.url.path in state.settings.auth.public_paths:
        return ANONYMOUS
    return await state.auth.from_headers(request.headers)


ReaderDep = Annotated[Principal, Depends(reader)]
AdminDep = Annotated[Principal, Depends(require_admin)]


@dataclass(frozen=True, slots=True)
class Admitted:
    """A caller admitted to draw samples (authenticated, within its request rate) and the request id."""

    caller: Principal
    request_id: str


async def admitted(request: Request) -> Admitted:
    state = _state(request)
    principal = ANONYMOUS if state.auth is None else await state.auth.from_headers(request.headers)
    if state.limiter is not None:
        await state.limiter.admit(principal)
    return Admitted(principal, request_id_of(request.scope))


@dataclass(frozen=True, slots=True)
class Inference:
    """What an inference route needs, resolved in one dependency (each dependency node costs
    FastAPI's solver time on the hot path): the serving object, the admitted caller, the request id."""

    serving: OpenAIServing
    caller: Principal
    request_id: str


async def inference(request: Request) -> Inference:
    who = await admitted(request)
    return Inference(_state(request).serving, who.caller, who.request_id)


AdmittedDep = Annotated[Admitted, Depends(admitted)]
InferenceDep = Annotated[Inference, Depends(inference)]


def json_body(model: type[B], check: Callable[[Any], None] | None = None) -> Any:
    """A dependency that parses the request body as ``model`` the one way every body is parsed
    (:func:`~app.protocol.parse_json`); pair it with ``openapi_extra=request_body(model)``."""
    async def parse(request: Request) -> B:
        return parse_json(await request.body(), model, check)

    return Depends(parse)


class JSONObject(RootModel[dict[str, Any]]):
    """Any JSON object (a body the route validates itself, e.g. a policy spec with its meta fields)."""


async def _json_object(request: Request) -> dict[str, Any]:
    return parse_json(await request.body(), JSONObject).root


JSONObjectDep = Annotated[dict[str, Any], Depends(_json_object)]
