"""Health and identity routes."""

from __future__ import annotations

import uuid

from litestar import Response, get
from litestar.datastructures import State
from litestar.di import NamedDependency
from sqlalchemy import text

from space.auth.service import Principal
from space.schemas import Output


class Health(Output):
    """GET /health."""

    status: str
    database: str


class Me(Output):
    """GET /me."""

    id: uuid.UUID
    email: str
    name: str


@get("/health", tags=["system"])
async def health(state: State) -> Response[Health]:
    """Reports whether the database answers."""
    try:
        async with state.db.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:
        return Response(Health(status="degraded", database="unreachable"), status_code=503)
    return Response(Health(status="ok", database="ok"))


@get("/me", tags=["system"])
async def me(principal: NamedDependency[Principal]) -> Me:
    """The caller."""
    return Me(id=principal.user_id, email=principal.email, name=principal.name)
