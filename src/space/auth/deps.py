"""Request-scoped dependencies of every route: the unit of work and the authenticated principal."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from space.auth.service import Principal
from space.db import Tenant, UnitOfWork


async def provide_uow(state: State) -> AsyncGenerator[UnitOfWork, None]:
    """One transaction per request: commits when the handler returns, rolls back when it raises."""
    async with UnitOfWork(state.db.sessionmaker) as uow:
        yield uow


async def provide_principal(request: Request[Any, Any, Any], uow: NamedDependency[UnitOfWork]) -> Principal:
    """The caller, authenticated by the middleware; their user id becomes part of the tenant context."""
    principal: Principal = request.user  # set by the authentication middleware
    await uow.retenant(Tenant(user_id=principal.user_id))
    return principal


DEPENDENCIES = {
    "uow": Provide(provide_uow),
    "principal": Provide(provide_principal),
}
