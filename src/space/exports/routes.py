"""HTTP routes of exports. Thin: decode, one service call, return.

The controller is state-exempt and lets former members through: the export service applies SPEC §3's
export column and §6's download order itself.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from litestar import Controller, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody, QueryParameter
from saq import Queue

from space.audit import service as audit
from space.config import Settings
from space.db import Database
from space.exports import service
from space.exports.downloads import DownloadSlots, DownloadStream
from space.exports.schemas import Export, ExportCreate, OrgExport
from space.exports.storage import PgResultStore, ResultStore
from space.orgs.deps import MEMBER, MemberContext, parse_id
from space.schemas import Items


def provide_queue(state: State) -> Queue:
    """The API's SAQ queue (connected in the app's lifespan)."""
    queue: Queue = state.queue
    return queue


def provide_store(state: State) -> ResultStore:
    """The result store on the app's database."""
    return PgResultStore(state.db.sessionmaker)


def provide_download_slots(state: State) -> DownloadSlots:
    """This process's download slots (SPEC §11's per-process cap)."""
    slots: DownloadSlots = state.download_slots
    return slots


def provide_db(state: State) -> Database:
    """The app-role database (the download's audit row is written in a transaction of its own)."""
    db: Database = state.db
    return db


class ListScope(enum.StrEnum):
    """`own`: the caller's exports; `org`: every member's (owners and admins)."""

    own = "own"
    org = "org"


def provide_settings(state: State) -> Settings:
    """The app's settings."""
    settings: Settings = state.settings
    return settings


class ExportController(Controller):
    """Create, list, read, cancel/delete and download exports; each export is visible to its owner only."""

    path = "/orgs/{org_id:str}/exports"
    tags = ["exports"]
    dependencies = {
        **MEMBER,
        "queue": Provide(provide_queue, sync_to_thread=False),
        "store": Provide(provide_store, sync_to_thread=False),
        "settings": Provide(provide_settings, sync_to_thread=False),
        "slots": Provide(provide_download_slots, sync_to_thread=False),
        "db": Provide(provide_db, sync_to_thread=False),
    }
    opt = {"state_exempt": True, "allow_former_member": True}

    @post("/", status_code=202)
    async def create(
        self,
        ctx: NamedDependency[MemberContext],
        data: JSONBody[ExportCreate],
        settings: NamedDependency[Settings],
        queue: NamedDependency[Queue],
    ) -> Response[Export]:
        """Request an export; it is built in the background. 202 with its Location."""
        export = await service.create_export(ctx.uow, ctx.org.id, ctx.membership, data, settings, queue, ip=ctx.ip)
        return Response(export, status_code=202, headers={"Location": f"/orgs/{ctx.org.id}/exports/{export.id}"})

    @get("/")
    async def list_exports(
        self,
        ctx: NamedDependency[MemberContext],
        # `scope` is a name Litestar reserves for the ASGI scope, hence the alias.
        list_scope: Annotated[ListScope, QueryParameter(name="scope")] = ListScope.own,
    ) -> Items[Export] | Items[OrgExport]:
        """The caller's exports in this org, newest first; `scope=org`: every member's, with creators (owners and
        admins)."""
        if list_scope is ListScope.org:
            return Items(items=await service.list_org_exports(ctx.uow.session, ctx.org, ctx.membership))
        return Items(items=await service.list_exports(ctx.uow.session, ctx.org, ctx.membership))

    @get("/{export_id:str}")
    async def get_one(self, ctx: NamedDependency[MemberContext], export_id: FromPath[str]) -> Export:
        """One of the caller's exports."""
        return await service.get_export(ctx.uow.session, ctx.org, ctx.membership, parse_id(export_id))

    @delete("/{export_id:str}")
    async def remove(
        self, ctx: NamedDependency[MemberContext], export_id: FromPath[str], store: NamedDependency[ResultStore]
    ) -> None:
        """Cancel a queued/running export, or delete a finished one (owners and admins: any member's)."""
        await service.delete_export(ctx.uow, ctx.org.id, ctx.membership, parse_id(export_id), store, ip=ctx.ip)

    @get("/{export_id:str}/result")
    async def result(
        self,
        ctx: NamedDependency[MemberContext],
        export_id: FromPath[str],
        store: NamedDependency[ResultStore],
        slots: NamedDependency[DownloadSlots],
        db: NamedDependency[Database],
    ) -> DownloadStream:
        """Download the result, authorized again now (SPEC §6), streamed from storage in a download slot."""
        download = await service.open_result(
            ctx.uow.session, ctx.org, ctx.principal.user_id, ctx.membership, parse_id(export_id), store
        )
        headers: dict[str, Any] = {
            "Content-Disposition": f'attachment; filename="{download.filename}"',
            "Cache-Control": "private, no-store",
            "X-Content-Type-Options": "nosniff",
            "Content-Length": str(download.byte_size),
            "ETag": f'"{download.sha256}"',
        }

        async def started() -> None:
            # The trail says what left, as the response starts: not for a refusal or a busy server.
            await audit.record_download(
                db,
                ctx.org.id,
                ctx.principal.user_id,
                download.export_id,
                via="bearer",
                byte_range=None,
                size=download.byte_size,
                ip=ctx.ip,
            )

        return DownloadStream(
            download.body(), slots=slots, on_start=started, media_type=download.media_type, headers=headers
        )
