"""Health and identity routes."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from sqlalchemy import text

from space.auth.service import Principal
from space.db import Database
from space.schemas import Output

log = logging.getLogger("space")


class Health(Output):
    """GET /health."""

    status: str
    database: str


class Me(Output):
    """GET /me."""

    id: uuid.UUID
    email: str
    name: str


@get(
    "/health",
    tags=["system"],
    responses={503: ResponseSpec(Health, description="The database does not answer.", generate_examples=False)},
)
async def health(state: State) -> Response[Health]:
    """Reports whether the database answers."""
    try:
        async with state.db.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:
        return Response(Health(status="degraded", database="unreachable"), status_code=503)
    return Response(Health(status="ok", database="ok"))


READY_TIMEOUT_SECONDS = 2.0
"""How long /ready waits for the database and for the queue before it calls them unreachable."""


class Readiness(Output):
    """GET /ready."""

    status: str
    database: str
    queue: str


async def _answers(check: Awaitable[object]) -> str:
    try:
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            await check
    except Exception as exc:
        log.warning("readiness: %s", type(exc).__name__)
        return "unreachable"
    return "ok"


async def _database_answers(db: Database) -> None:
    async with db.engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


@get(
    "/ready",
    tags=["system"],
    responses={
        503: ResponseSpec(
            Readiness, description="Not ready: the database or the queue does not answer.", generate_examples=False
        )
    },
)
async def ready(state: State) -> Response[Readiness]:
    """200 when the database and the queue answer (this process may take traffic), else 503 (SPEC §16)."""
    database = await _answers(_database_answers(state.db))
    queue = await _answers(state.queue.count("queued"))
    up = database == "ok" and queue == "ok"
    body = Readiness(status="ready" if up else "unready", database=database, queue=queue)
    return Response(body, status_code=200 if up else 503, headers={"Cache-Control": "no-store"})


@get("/metrics", tags=["system"], include_in_schema=False)
async def metrics_text(state: State, request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text or OpenMetrics (as `Accept` asks): HTTP, export, lease and download metrics, the queue."""
    from space.observability.metrics import render

    body, content_type = await render(state.db, request.headers.get("accept"))
    # The type goes in as a header: as a media_type Litestar would append a second `charset` to a text/ type.
    return Response(body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


@get("/me", tags=["system"])
async def me(principal: NamedDependency[Principal]) -> Me:
    """The caller."""
    return Me(id=principal.user_id, email=principal.email, name=principal.name)
