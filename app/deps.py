"""The FastAPI dependencies, in one place: the app's state, the caller, admission, the request id.

Domain modules (auth, rate limits, serving) know nothing of FastAPI; routes reach them through these.
"""

from __future__ import annotations

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
AdminDep = Annotated[Principal, Depends(require_admin)]


async def admitted_caller(principal: UserDep, state: StateDep) -> Principal:
    """Inference routes: a valid key (user or admin) within its per-minute limits."""
    if state.limiter is not None:
        await state.limiter.admit(principal)
    return principal


CallerDep = Annotated[Principal, Depends(admitted_caller)]


async def request_id(request: Request) -> str:
    """The request's id (``x-request-id`` when the client sent a valid one, else generated)."""
    return request_id_of(request.scope)


RequestIdDep = Annotated[str, Depends(request_id)]
