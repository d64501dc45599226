"""HTTP routes of imports (SPEC §23): upload an archive to restore, then follow it. Thin: spool, one service call.

The upload route takes no unit of work while the body arrives (a slow upload must not hold a database
connection): the body is spooled to a local file first, then one transaction writes the row and the upload's
pieces, the local file is removed, and the job is enqueued after the commit.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.datastructures import ResponseHeader, State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, QueryParameter
from saq import Queue

from space.auth.service import Principal
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import InvalidRequest, OrgLimitReached
from space.imports import service
from space.imports.restore import IdsInUse
from space.imports.schemas import ImportOut
from space.imports.service import TooLarge
from space.openapi import refusals
from space.orgs.deps import parse_id

log = logging.getLogger("space.imports")


def _provide_state(state: State) -> State:
    return state


class ImportController(Controller):
    """Restore an archive as a new organization; each import is visible to its importer only."""

    path = "/imports"
    tags = ["imports"]
    dependencies = {"app_state": Provide(_provide_state, sync_to_thread=False)}

    @post(
        "/",
        status_code=202,
        request_max_body_size=None,
        responses=refusals(TooLarge, IdsInUse, OrgLimitReached),
        response_headers=[ResponseHeader(name="Location", documentation_only=True, description="The import's URL.")],
    )
    async def create(
        self,
        request: Request[Any, Any, Any],
        app_state: NamedDependency[State],
        name: FromQuery[str | None] = None,
        dry_run: Annotated[bool, QueryParameter(name="dryRun")] = False,
        new_ids: Annotated[bool, QueryParameter(name="newIds")] = False,
    ) -> Response[ImportOut]:
        """Upload an archive (`application/zip`, schemaVersion 2) to restore as the organization `name`;
        `dryRun=true` checks and reports without writing, `newIds=true` gives ids in use here new ones."""
        settings: Settings = app_state.settings
        db: Database = app_state.db
        queue: Queue = app_state.queue
        principal: Principal = request.user
        org_name = service.parse_name(name)
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/zip":
            raise InvalidRequest("The body must be the archive itself, sent as Content-Type: application/zip.")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > settings.import_byte_limit:
            # Said up front: refused before a byte is read.
            raise service.TooLarge(
                f"The archive passes the limit of {settings.import_byte_limit} bytes (SPACE_IMPORT_BYTE_LIMIT)."
            )
        path, size = await service.spool(settings, request.stream())
        try:
            async with UnitOfWork(db.sessionmaker, Tenant(user_id=principal.user_id)) as uow:
                flags = {"dry_run": dry_run, "new_ids": new_ids}
                created = await service.create(uow, principal, settings, org_name, path, size, flags)

                async def enqueue() -> None:
                    try:
                        await service.enqueue(queue, settings, created.id, principal.user_id)
                    except Exception:
                        log.exception("enqueue of import %s failed", created.id)

                uow.after_commit(enqueue)
        finally:
            # Stored with the row (or refused): the local copy is not needed any more.
            service.discard(path)
        return Response(created, status_code=202, headers={"Location": f"/imports/{created.id}"})

    @get("/{import_id:str}")
    async def read(
        self, uow: NamedDependency[UnitOfWork], principal: NamedDependency[Principal], import_id: FromPath[str]
    ) -> ImportOut:
        """The import, its progress and, once done, its report (the importer's only: others 404)."""
        return await service.get(uow, principal.user_id, parse_id(import_id))
