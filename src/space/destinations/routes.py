"""HTTP routes of destinations (owners and admins), and the manual delivery of an export. Thin: decode, one service
call, return."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody
from saq import Queue

from space.config import Settings
from space.destinations import manual, service
from space.destinations.schemas import Delivery, DeliveryCreate, DestinationCreate, DestinationOut
from space.destinations.sealing import Sealer
from space.errors import DestinationInUse, DestinationUnreachable
from space.exports.storage.protocol import ResultStore
from space.openapi import refusals
from space.orgs.deps import ADMINS, MEMBER, MemberContext, parse_id
from space.schemas import Items


class DestinationController(Controller):
    """An org's destinations: buckets its exports are delivered into."""

    path = "/orgs/{org_id:str}/destinations"
    tags = ["destinations"]
    dependencies = MEMBER
    # Destinations are the org's settings, not its data: they can be managed (and removed) in any live state.
    opt = {"roles": ADMINS, "state_exempt": True}

    @post("/", responses=refusals(DestinationUnreachable))
    async def create(
        self, state: State, ctx: NamedDependency[MemberContext], data: JSONBody[DestinationCreate]
    ) -> DestinationOut:
        """Register a bucket: the test write must succeed; the secret is kept sealed and never answered."""
        settings: Settings = state.settings
        sealer: Sealer = state.sealer
        return await service.create_destination(
            ctx.uow.session,
            ctx.org.id,
            ctx.principal.user_id,
            data,
            sealer,
            allow_private=settings.webhook_allow_private,
        )

    @get("/")
    async def list_destinations(self, ctx: NamedDependency[MemberContext]) -> Items[DestinationOut]:
        """The org's destinations, without secrets."""
        return Items(items=await service.list_destinations(ctx.uow.session, ctx.org.id))

    @get("/{destination_id:str}")
    async def show(self, ctx: NamedDependency[MemberContext], destination_id: FromPath[str]) -> DestinationOut:
        """One destination, with when it last delivered and its last error."""
        return await service.get_destination(ctx.uow.session, ctx.org.id, parse_id(destination_id))

    @delete("/{destination_id:str}", responses=refusals(DestinationInUse))
    async def remove(self, ctx: NamedDependency[MemberContext], destination_id: FromPath[str]) -> None:
        """Remove a destination; refused while a schedule names it."""
        await service.delete_destination(ctx.uow.session, ctx.org.id, ctx.principal.user_id, parse_id(destination_id))


class DeliveryController(Controller):
    """Delivering a completed export to one of the org's destinations, by hand."""

    path = "/orgs/{org_id:str}/exports/{export_id:str}/deliveries"
    tags = ["destinations"]
    dependencies = MEMBER
    # Like a download: allowed while suspended (portability); `open_result` refuses a deleting org with 409.
    opt = {"roles": ADMINS, "state_exempt": True}

    @post("/", status_code=202)
    async def create(
        self,
        state: State,
        ctx: NamedDependency[MemberContext],
        export_id: FromPath[str],
        data: JSONBody[DeliveryCreate],
    ) -> Delivery:
        """Owe the export to the destination; the worker's outbound lane copies it."""
        queue: Queue = state.outbound_queue
        store: ResultStore = state.store
        return await manual.request_delivery(
            ctx.uow,
            queue,
            ctx.org,
            ctx.principal.user_id,
            ctx.membership,
            store,
            parse_id(export_id),
            data.destination_id,
        )
