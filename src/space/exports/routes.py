"""HTTP routes of exports. Thin: decode, one service call, return.

The controller is state-exempt and lets former members through: the export service applies SPEC §3's
export column and §6's download order itself.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from litestar import Controller, HttpMethod, Request, Response, delete, get, post, route
from litestar.datastructures import ResponseHeader, State
from litestar.di import NamedDependency, Provide
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from saq import Queue

from space.audit import service as audit
from space.config import Settings
from space.db import Database
from space.errors import (
    AccessRevoked,
    Busy,
    ExportExpired,
    ExportFailed,
    ExportNotReady,
    ExportQuotaExceeded,
    ExportRevoked,
    Forbidden,
    InvalidRequest,
    LinkExpired,
    LinkInvalid,
    LinkRateLimited,
    OrgDeleting,
    RangeNotSatisfiable,
    RateLimited,
    Unauthenticated,
)
from space.exports import access, service
from space.exports.downloads import DownloadSlots, first_part, no_referrer_for_links, respond
from space.exports.formats.archive import manifest_schema, manifest_v2_schema, snapshot_schema
from space.exports.formats.lines import line_schema
from space.exports.formats.registry import KINDS
from space.exports.links import LinkGrant, LinkSigner
from space.exports.schemas import Export, ExportCreate, ExportPage, Link, OrgExport
from space.exports.storage.protocol import ResultKey, ResultStore
from space.openapi import BEARER, LINK, Files, refusals
from space.orgs.deps import MEMBER, MemberContext, parse_id, request_ip


def provide_queue(state: State) -> Queue:
    """The API's SAQ queue (connected in the app's lifespan)."""
    queue: Queue = state.queue
    return queue


def provide_outbound_queue(state: State) -> Queue:
    """The API's queue of the outbound lane: what an ended export owes (webhooks, emails) is enqueued there."""
    queue: Queue = state.outbound_queue
    return queue


def provide_store(state: State) -> ResultStore:
    """The app's result store (SPACE_RESULT_STORE), opened in its lifespan."""
    store: ResultStore = state.store
    return store


def provide_download_slots(state: State) -> DownloadSlots:
    """This process's download slots (SPEC §11's per-process cap)."""
    slots: DownloadSlots = state.download_slots
    return slots


def provide_db(state: State) -> Database:
    """The app-role database (the download's audit row is written in a transaction of its own)."""
    db: Database = state.db
    return db


ListLimit = Annotated[int, QueryParameter(ge=1, le=service.LIST_LIMIT)]
"""How many exports one page of a list holds."""


class ListScope(enum.StrEnum):
    """`own`: the caller's exports; `org`: every member's (owners and admins)."""

    own = "own"
    org = "org"


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


@get(
    "/schemas/manifest-v2.json", tags=["schemas"], security=[], media_type=SCHEMA_MEDIA_TYPE, responses=_SCHEMA_RESPONSE
)
async def manifest_v2_schema_route() -> Response[bytes]:
    """The JSON Schema (2020-12) of the manifest of an archive of schemaVersion 2 (SPEC §23). Public."""
    return Response(manifest_v2_schema(), media_type=SCHEMA_MEDIA_TYPE)


@get(
    ["/schemas/members-v2.json", "/schemas/projects-v2.json", "/schemas/tasks-v2.json", "/schemas/tickets-v2.json"],
    tags=["schemas"],
    security=[],
    media_type=SCHEMA_MEDIA_TYPE,
    responses=_SCHEMA_RESPONSE,
)
async def line_schema_route(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The JSON Schema (2020-12) of one line of an archive's data file `data/<name>.jsonl` (SPEC §23). Public."""
    name = request.url.path.rsplit("/", 1)[-1].removesuffix("-v2.json")
    return Response(line_schema(name), media_type=SCHEMA_MEDIA_TYPE)


DOWNLOAD_REFUSALS = (AccessRevoked, OrgDeleting, ExportNotReady, ExportFailed, ExportExpired, ExportRevoked)
"""SPEC §6's refusals after its 404, for a download and for minting a link alike."""

_RESULT_MEDIA_TYPES = tuple(dict.fromkeys(kind.media_type for kind in KINDS.values()))
_RESULT_RESPONSES: dict[int, ResponseSpec] = {
    **refusals(
        Unauthenticated, LinkExpired, LinkInvalid, InvalidRequest, RangeNotSatisfiable, Busy, *DOWNLOAD_REFUSALS
    ),
    200: Files(None, description="The whole result (its kind's media type).", media_types=_RESULT_MEDIA_TYPES),
    206: Files(None, description="The one byte range that `Range` asked for.", media_types=_RESULT_MEDIA_TYPES),
    303: ResponseSpec(None, description="The result is in the object store: `Location` is a short-lived URL."),
    304: ResponseSpec(None, description="`If-None-Match` named the current `ETag`."),
}


def provide_signer(state: State) -> LinkSigner:
    """The deployment's link signer (its keys are read when the app starts)."""
    signer: LinkSigner = state.link_signer
    return signer


LinkToken = Annotated[
    str | None,
    # Documented as the `link` security scheme (an alternative to the bearer token), not as a parameter too.
    QueryParameter(
        description="A download link's token (from POST .../links), instead of an Authorization header.",
        include_in_schema=False,
    ),
]


def provide_link(
    request: Request[Any, Any, Any],
    state: State,
    org_id: FromPath[str],
    export_id: FromPath[str],
    token: LinkToken = None,
) -> LinkGrant | None:
    """The download link a request carries, verified against its path (SPEC §10); None for a bearer request.

    Checked before anything else of the request: a bad link is 401, whatever the path names.
    """
    if token is None or "authorization" in request.headers:
        return None  # a bearer request; with a `token=` as well, refused once the bearer token is known
    return provide_signer(state).verify(token, org_id, export_id)


class ExportController(Controller):
    """Create, list, read, cancel/delete and download exports; each export is visible to its owner only."""

    path = "/orgs/{org_id:str}/exports"
    tags = ["exports"]
    dependencies = {
        **MEMBER,
        "queue": Provide(provide_queue, sync_to_thread=False),
        "outbound": Provide(provide_outbound_queue, sync_to_thread=False),
        "store": Provide(provide_store, sync_to_thread=False),
        "settings": Provide(provide_settings, sync_to_thread=False),
        "slots": Provide(provide_download_slots, sync_to_thread=False),
        "signer": Provide(provide_signer, sync_to_thread=False),
        "db": Provide(provide_db, sync_to_thread=False),
    }
    opt = {"state_exempt": True, "allow_former_member": True}

    @post(
        "/",
        status_code=202,
        responses=refusals(Forbidden, OrgDeleting, ExportQuotaExceeded, RateLimited),
        response_headers=[ResponseHeader(name="Location", documentation_only=True, description="The export's URL.")],
    )
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

    @get("/", responses=refusals(Forbidden))
    async def list_exports(
        self,
        ctx: NamedDependency[MemberContext],
        # `scope` is a name Litestar reserves for the ASGI scope, hence the alias.
        list_scope: Annotated[ListScope, QueryParameter(name="scope")] = ListScope.own,
        before: FromQuery[str | None] = None,
        limit: ListLimit = service.LIST_LIMIT,
    ) -> ExportPage[Export] | ExportPage[OrgExport]:
        """The caller's exports in this org, newest first; `scope=org`: every member's, with creators (owners and
        admins). A page of `limit`; `next` is the cursor of the older page (pass it as `before`), null at the end."""
        session = ctx.uow.session
        if list_scope is ListScope.org:
            return await service.list_org_exports(session, ctx.org, ctx.membership, before=before, limit=limit)
        return await service.list_exports(session, ctx.org, ctx.membership, before=before, limit=limit)

    # Authorized by `access` in one round trip (a page polls this), not by the middleware and the org context.
    @get(
        "/{export_id:str}",
        opt={"exclude_from_auth": True},
        security=[{BEARER: []}],
        responses=refusals(Unauthenticated),
    )
    async def get_one(
        self,
        request: Request[Any, Any, Any],
        org_id: FromPath[str],
        export_id: FromPath[str],
        db: NamedDependency[Database],
    ) -> Export:
        """One of the caller's exports."""
        found, org = await access.by_bearer(
            db, request.headers.get("authorization"), org_id, export_id, with_delivery=True
        )
        return service.export_of(org, found.membership, found.job, found.now, found.delivery)

    @delete("/{export_id:str}")
    async def remove(
        self,
        ctx: NamedDependency[MemberContext],
        export_id: FromPath[str],
        store: NamedDependency[ResultStore],
        outbound: NamedDependency[Queue],
    ) -> None:
        """Cancel a queued/running export, or delete a finished one (owners and admins: any member's)."""
        await service.delete_export(
            ctx.uow, ctx.org.id, ctx.membership, parse_id(export_id), store, ip=ctx.ip, queue=outbound
        )

    @post("/{export_id:str}/links", status_code=201, responses=refusals(*DOWNLOAD_REFUSALS, LinkRateLimited))
    async def create_link(
        self,
        ctx: NamedDependency[MemberContext],
        export_id: FromPath[str],
        store: NamedDependency[ResultStore],
        signer: NamedDependency[LinkSigner],
        settings: NamedDependency[Settings],
    ) -> Link:
        """A short-lived download link (for a browser), minted only for what the caller could download now."""
        return await service.create_link(
            ctx.uow.session,
            ctx.org,
            ctx.principal,
            ctx.membership,
            parse_id(export_id),
            store,
            signer,
            settings,
            ip=ctx.ip,
        )

    @route(
        "/{export_id:str}/result",
        http_method=[HttpMethod.GET, HttpMethod.HEAD],
        # Authenticated and authorized by `access` in one round trip: a bearer token, or a link's `token=` (SPEC §10).
        opt={"exclude_from_auth": True},
        security=[{BEARER: []}, {LINK: []}],
        responses=_RESULT_RESPONSES,
        dependencies={"link": Provide(provide_link, sync_to_thread=False)},
        middleware=[no_referrer_for_links],
    )
    async def result(
        self,
        request: Request[Any, Any, Any],
        state: State,
        org_id: FromPath[str],
        export_id: FromPath[str],
        link: NamedDependency[LinkGrant | None],
        token: LinkToken = None,
    ) -> Response[Any]:
        """Download the result, authorized again now (SPEC §6), streamed from storage in a download slot; one byte
        range (206), If-Range, If-None-Match (304) and HEAD (SPEC §11)."""
        # The app's store, slots and database from its state, not as dependencies: Litestar resolves a batch of
        # several dependencies in an anyio task group, a task each, at every range of every download (0104).
        store, slots, db = provide_store(state), provide_download_slots(state), provide_db(state)
        # A link token is no bearer token (those are looked up by hash) and a bearer token no link (not signed).
        opening = None
        if link is None:
            found, org = await access.by_bearer(db, request.headers.get("authorization"), org_id, export_id)
            if token is not None:
                # Both at once is 400, but only once the bearer token checked out (else 401, as everywhere).
                raise InvalidRequest("token: send a download link's token or an Authorization header, not both.")
        else:
            # A range's first part comes with the authorization, in its round trip (used only if it allows it).
            key = ResultKey(link.org_id, link.export_id, link.execution_id)
            opening = first_part(store, key, request)
            found, org = await access.by_link(db, link, ranged="range" in request.headers, opening=opening)
        user_id, ip = found.principal.user_id, request_ip(request)
        download = service.downloadable(
            org,
            found.membership,
            found.job,
            found.now,
            store,
            via="bearer" if link is None else "link",
            execution_id=None if link is None else link.execution_id,
            opened=opening,
        )

        async def record(served: str | None, size: int | None, redirected: bool) -> None:
            # The trail says what left, as the response starts: not for a refusal, a 304, a HEAD or a busy server.
            await audit.record_download(
                db,
                org.id,
                user_id,
                download.export_id,
                via="bearer" if link is None else "link",
                byte_range=served,
                size=size,
                ip=ip,
                redirect=redirected,
                link_id=None if link is None else link.link_id,
                range_audited=found.range_audited,
            )

        # A HEAD is answered by the API itself, so it needs no presigned URL.
        redirect = None if request.method == "HEAD" else await download.redirect_url()
        return await respond(download, request, slots, record, redirect=redirect)
