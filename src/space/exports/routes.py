"""HTTP routes of exports. Thin: decode, one service call, return.

The controller is state-exempt and lets former members through: the export service applies SPEC §3's
export column and §6's download order itself.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody
from litestar.response import Redirect
from saq import Queue

from space.config import Settings
from space.exports import service
from space.exports.downloads import DownloadSlots, DownloadStream
from space.exports.schemas import Export, ExportCreate
from space.exports.storage import ResultStore
from space.orgs.deps import MEMBER, MemberContext, parse_id
from space.schemas import Items


def provide_queue(state: State) -> Queue:
    """The API's SAQ queue (connected in the app's lifespan)."""
    queue: Queue = state.queue
    return queue


def provide_store(state: State) -> ResultStore:
    """The app's result store (SPACE_RESULT_STORE), opened in its lifespan."""
    store: ResultStore = state.store
    return store


def provide_download_slots(state: State) -> DownloadSlots:
    """This process's download slots (SPEC §11's per-process cap)."""
    slots: DownloadSlots = state.download_slots
    return slots


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
    ) -> DownloadStream | Redirect:
        """Download the result, authorized again now (SPEC §6), streamed from storage in a download slot, or (S3
        store) a 303 to a presigned GET of it (SPEC §15)."""
        download = await service.open_result(
            ctx.uow.session, ctx.org, ctx.principal.user_id, ctx.membership, parse_id(export_id), store
        )
        if (url := await download.redirect_url()) is not None:
            return Redirect(url, status_code=303, headers=service.REDIRECT_HEADERS)
        headers: dict[str, Any] = {
            "Content-Disposition": f'attachment; filename="{download.filename}"',
            "Cache-Control": "private, no-store",
            "X-Content-Type-Options": "nosniff",
            "Content-Length": str(download.byte_size),
            "ETag": f'"{download.sha256}"',
        }
        return DownloadStream(download.body(), slots=slots, media_type=download.media_type, headers=headers)
