"""Request-scoped dependencies of every route: the unit of work and the authenticated principal."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from space.auth.service import Principal
from space.db import Tenant, UnitOfWork


async def provide_uow(state: State, request: Request[Any, Any, Any]) -> AsyncGenerator[UnitOfWork, None]:
    """One transaction per request: commits when the handler returns, rolls back when it raises.

    Its tenant context starts as what the request itself says: the user the middleware authenticated and the
    org its path names, which is what the principal and the org context set next (`provide_member` narrows
    it for customers). Set once, as the transaction begins, instead of once per dependency.
    """
    async with UnitOfWork(state.db.sessionmaker, request_tenant(request)) as uow:
        yield uow


def request_tenant(request: Request[Any, Any, Any]) -> Tenant:
    """The authenticated caller (none on public routes and on the result route, which authenticates itself) and
    the path's org (none when the path names none, or nothing that is an id)."""
    principal = request.scope.get("user")
    user_id = principal.user_id if isinstance(principal, Principal) else None
    try:
        org_id = uuid.UUID(request.path_params["org_id"]) if "org_id" in request.path_params else None
    except ValueError:
        org_id = None
    return Tenant(org_id=org_id, user_id=user_id)


async def provide_principal(request: Request[Any, Any, Any], uow: NamedDependency[UnitOfWork]) -> Principal:
    """The caller, authenticated by the middleware; their user id is part of the tenant context (as the unit
    of work began)."""
    principal: Principal = request.user  # set by the authentication middleware
    await uow.retenant(Tenant(org_id=uow.tenant.org_id, user_id=principal.user_id))
    return principal


DEPENDENCIES = {
    "uow": Provide(provide_uow),
    "principal": Provide(provide_principal),
}
