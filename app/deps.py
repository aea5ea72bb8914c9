"""The FastAPI dependencies, in one place: the app's state, the caller (admitted within its rate
limits for inference), the request id.

Domain modules (auth, rate limits, serving) know nothing of FastAPI; routes reach them through these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from app.auth import ANONYMOUS, Principal, bearer_token
from app.errors import Forbidden
from app.requestid import request_id_of
from app.state import AppState


async def get_state(request: Request) -> AppState:
    """The app's state (async on purpose: FastAPI runs sync dependencies in a worker thread)."""
    state: AppState = request.app.state.ttc
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def current_principal(request: Request, state: StateDep) -> Principal:
    if state.auth is None:
        return ANONYMOUS
    return await state.auth.authenticate(bearer_token(request.headers))


async def require_user(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    """Any valid key (user or admin)."""
    return principal


async def require_admin(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
    if principal.role != "admin":
        raise Forbidden("This route needs an admin key.", code="admin_required")
    return principal


UserDep = Annotated[Principal, Depends(require_user)]


async def reader(request: Request, state: StateDep) -> Principal:
    """A read-only system path: open when auth is off or the path is in ``auth.public_paths``, else
    any valid key."""
    if state.auth is None or not state.auth.enabled or request.url.path in state.settings.auth.public_paths:
        return ANONYMOUS
    return await state.auth.authenticate(bearer_token(request.headers))


ReaderDep = Annotated[Principal, Depends(reader)]
AdminDep = Annotated[Principal, Depends(require_admin)]


@dataclass(frozen=True, slots=True)
class Inference:
    """What an inference route needs, resolved in one dependency (each dependency node costs
    FastAPI's solver time on the hot path): the state, the admitted caller and the request id."""

    state: AppState
    caller: Principal
    request_id: str


async def inference(request: Request) -> Inference:
    state: AppState = request.app.state.ttc
    principal = ANONYMOUS if state.auth is None else await state.auth.authenticate(bearer_token(request.headers))
    if state.limiter is not None:
        await state.limiter.admit(principal)
    return Inference(state, principal, request_id_of(request.scope))


InferenceDep = Annotated[Inference, Depends(inference)]
