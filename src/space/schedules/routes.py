"""HTTP routes of schedules (owners and admins). Thin: decode, one service call, return."""

from __future__ import annotations

from litestar import Controller, delete, get, patch, post
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from space.config import Settings
from space.errors import ScheduleLimitReached
from space.openapi import refusals
from space.orgs.deps import ADMINS, MEMBER, MemberContext, parse_id
from space.schedules import service
from space.schedules.schemas import ScheduleCreate, ScheduleOut, ScheduleRun, ScheduleUpdate
from space.schemas import Items


class ScheduleController(Controller):
    """An org's schedules and their runs."""

    path = "/orgs/{org_id:str}/schedules"
    tags = ["schedules"]
    dependencies = MEMBER
    # Settings of the org, managed in any live state (a suspended org's exports still run: data portability).
    opt = {"roles": ADMINS, "state_exempt": True}

    @post("/", responses=refusals(ScheduleLimitReached))
    async def create(
        self, state: State, ctx: NamedDependency[MemberContext], data: JSONBody[ScheduleCreate]
    ) -> ScheduleOut:
        """Create a schedule; its first run is made at its first slot."""
        settings: Settings = state.settings
        return await service.create_schedule(
            ctx.uow.session, ctx.org.id, ctx.principal.user_id, data, limit=settings.schedules_per_org
        )

    @get("/")
    async def list_schedules(self, ctx: NamedDependency[MemberContext]) -> Items[ScheduleOut]:
        """The org's schedules."""
        return Items(items=await service.list_schedules(ctx.uow.session, ctx.org.id))

    @get("/{schedule_id:str}")
    async def get_schedule(self, ctx: NamedDependency[MemberContext], schedule_id: FromPath[str]) -> ScheduleOut:
        """One schedule."""
        return await service.get_schedule(ctx.uow.session, ctx.org.id, parse_id(schedule_id))

    @patch("/{schedule_id:str}")
    async def update(
        self, ctx: NamedDependency[MemberContext], schedule_id: FromPath[str], data: JSONBody[ScheduleUpdate]
    ) -> ScheduleOut:
        """Pause, resume, or change the cadence or destination."""
        return await service.update_schedule(ctx.uow.session, ctx.org.id, parse_id(schedule_id), data)

    @delete("/{schedule_id:str}")
    async def remove(self, ctx: NamedDependency[MemberContext], schedule_id: FromPath[str]) -> None:
        """Remove a schedule; its runs stay."""
        await service.delete_schedule(ctx.uow.session, ctx.org.id, parse_id(schedule_id))

    @get("/{schedule_id:str}/runs")
    async def runs(self, ctx: NamedDependency[MemberContext], schedule_id: FromPath[str]) -> Items[ScheduleRun]:
        """The schedule's latest runs, newest first."""
        return Items(items=await service.list_runs(ctx.uow.session, ctx.org.id, parse_id(schedule_id)))
