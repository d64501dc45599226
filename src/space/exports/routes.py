"""HTTP routes of exports. Thin: decode, one service call, return.

The controller is state-exempt and lets former members through: the export service applies SPEC §3's
export column and §6's download order itself.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody
from saq import Queue

from space.config import Settings
from space.exports import service
from space.exports.archive import manifest_schema, snapshot_schema
from space.exports.downloads import DownloadSlots, DownloadStream
from space.exports.schemas import Export, ExportCreate
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


def provide_settings(state: State) -> Settings:
    """The app's settings."""
    settings: Settings = state.settings
    return settings


SCHEMA_MEDIA_TYPE = "application/schema+json"
# The bytes are sent as generated (the archive carries the same bytes); the document says they are an object.
_SCHEMA_RESPONSE = {
    200: ResponseSpec(
        dict[str, Any],
        generate_examples=False,
        description="A JSON Schema (draft 2020-12)",
        media_type=SCHEMA_MEDIA_TYPE,
    )
}


@get(
    "/schemas/snapshot-v1.json", tags=["schemas"], security=[], media_type=SCHEMA_MEDIA_TYPE, responses=_SCHEMA_RESPONSE
)
async def snapshot_schema_route() -> Response[bytes]:
    """The JSON Schema (2020-12) every snapshot (and an archive's snapshot.json) validates against. Public."""
    return Response(snapshot_schema(), media_type=SCHEMA_MEDIA_TYPE)


@get(
    "/schemas/manifest-v1.json", tags=["schemas"], security=[], media_type=SCHEMA_MEDIA_TYPE, responses=_SCHEMA_RESPONSE
)
async def manifest_schema_route() -> Response[bytes]:
    """The JSON Schema (2020-12) of an archive's manifest.json. Public."""
    return Response(manifest_schema(), media_type=SCHEMA_MEDIA_TYPE)


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
        export = await service.create_export(ctx.uow, ctx.org.id, ctx.membership, data, settings, queue)
        return Response(export, status_code=202, headers={"Location": f"/orgs/{ctx.org.id}/exports/{export.id}"})

    @get("/")
    async def list_exports(self, ctx: NamedDependency[MemberContext]) -> Items[Export]:
        """The caller's exports in this org, newest first."""
        return Items(items=await service.list_exports(ctx.uow.session, ctx.org, ctx.membership))

    @get("/{export_id:str}")
    async def get_one(self, ctx: NamedDependency[MemberContext], export_id: FromPath[str]) -> Export:
        """One of the caller's exports."""
        return await service.get_export(ctx.uow.session, ctx.org, ctx.membership, parse_id(export_id))

    @delete("/{export_id:str}")
    async def remove(
        self, ctx: NamedDependency[MemberContext], export_id: FromPath[str], store: NamedDependency[ResultStore]
    ) -> None:
        """Cancel a queued/running export, or delete a finished one."""
        await service.delete_export(ctx.uow, ctx.org.id, ctx.membership, parse_id(export_id), store)

    @get("/{export_id:str}/result")
    async def result(
        self,
        ctx: NamedDependency[MemberContext],
        export_id: FromPath[str],
        store: NamedDependency[ResultStore],
        slots: NamedDependency[DownloadSlots],
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
        return DownloadStream(download.body(), slots=slots, media_type=download.media_type, headers=headers)
