"""HTTP routes of organizations and members. Thin: decode, one service call, return."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Router, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from space.auth.service import Principal
from space.config import Settings
from space.db import UnitOfWork
from space.errors import AlreadyMember, FinalExportRecommended, InvalidTransition, LastOwner, OrgLimitReached
from space.openapi import refusals
from space.orgs import lifecycle, members, service
from space.orgs.deps import ADMINS, MEMBER, OWNERS, MemberContext, parse_id
from space.orgs.schemas import DeletionRequest, Member, MemberCreate, MemberUpdate, Org, OrgCreate
from space.schemas import Items


class OrgController(Controller):
    """Create and list orgs; read one."""

    path = "/orgs"
    tags = ["orgs"]

    @post("/", responses=refusals(OrgLimitReached))
    async def create(
        self,
        request: Request[Any, Any, Any],
        data: JSONBody[OrgCreate],
        uow: NamedDependency[UnitOfWork],
        principal: NamedDependency[Principal],
    ) -> Org:
        """Create an organization; the caller becomes its owner."""
        settings: Settings = request.app.state.settings
        return await service.create_org(uow, principal, data.name, settings.orgs_per_user)

    @get("/")
    async def list_mine(self, uow: NamedDependency[UnitOfWork], principal: NamedDependency[Principal]) -> Items[Org]:
        """Organizations where the caller is a member."""
        return Items(items=await service.list_orgs(uow))

    @get("/{org_id:str}", dependencies=MEMBER)
    async def get_one(self, ctx: NamedDependency[MemberContext]) -> Org:
        """One organization the caller belongs to."""
        return service.org_out(ctx.org)


class MemberController(Controller):
    """Members of an org. Reads: any member; changes: owners and admins (only owners touch owners)."""

    path = "/orgs/{org_id:str}/members"
    tags = ["members"]
    dependencies = MEMBER

    @get("/")
    async def list_members(self, ctx: NamedDependency[MemberContext]) -> Items[Member]:
        """Every member."""
        return Items(items=await service.list_members(ctx.uow.session, ctx.org.id))

    @post("/", opt={"roles": ADMINS}, responses=refusals(AlreadyMember))
    async def add(self, ctx: NamedDependency[MemberContext], data: JSONBody[MemberCreate]) -> Member:
        """Add an existing user by email."""
        return await members.add_member(ctx.uow.session, ctx.org.id, ctx.principal.user_id, data, ip=ctx.ip)

    @patch("/{user_id:str}", opt={"roles": ADMINS}, responses=refusals(LastOwner))
    async def change_role(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[MemberContext],
        user_id: FromPath[str],
        data: JSONBody[MemberUpdate],
    ) -> Member:
        """Change a member's role."""
        return await members.change_role(
            ctx.uow,
            ctx.org.id,
            ctx.principal.user_id,
            parse_id(user_id),
            data.role,
            ip=ctx.ip,
            queue=request.app.state.outbound_queue,
        )

    @delete("/{user_id:str}", opt={"roles": ADMINS}, responses=refusals(LastOwner))
    async def remove(
        self, request: Request[Any, Any, Any], ctx: NamedDependency[MemberContext], user_id: FromPath[str]
    ) -> None:
        """Remove a member."""
        await members.remove_member(
            ctx.uow,
            ctx.org.id,
            ctx.principal.user_id,
            parse_id(user_id),
            ip=ctx.ip,
            queue=request.app.state.outbound_queue,
        )


class LifecycleController(Controller):
    """Suspend, reactivate, request and cancel deletion: owners only, allowed in any live state."""

    path = "/orgs/{org_id:str}"
    tags = ["lifecycle"]
    dependencies = MEMBER
    # The transition table decides what each state allows; the generic write-state check must not.
    opt = {"roles": OWNERS, "state_exempt": True}

    @post("/suspend", status_code=200, responses=refusals(InvalidTransition))
    async def suspend(self, ctx: NamedDependency[MemberContext]) -> Org:
        """active -> suspended."""
        return await lifecycle.suspend(ctx.uow.session, ctx.org.id, ctx.principal.user_id, ip=ctx.ip)

    @post("/reactivate", status_code=200, responses=refusals(InvalidTransition))
    async def reactivate(self, ctx: NamedDependency[MemberContext]) -> Org:
        """suspended -> active."""
        return await lifecycle.reactivate(ctx.uow.session, ctx.org.id, ctx.principal.user_id, ip=ctx.ip)

    @post("/deletion", status_code=202, responses=refusals(FinalExportRecommended, InvalidTransition))
    async def request_deletion(
        self, request: Request[Any, Any, Any], ctx: NamedDependency[MemberContext], data: JSONBody[DeletionRequest]
    ) -> Org:
        """Start the grace period; the purge follows after deleteAfter."""
        settings: Settings = request.app.state.settings
        return await lifecycle.request_deletion(
            ctx.uow,
            ctx.org,
            ctx.principal.user_id,
            data,
            settings.deletion_grace_seconds,
            request.app.state.outbound_queue,
            ip=ctx.ip,
        )

    @delete("/deletion", status_code=200, responses=refusals(InvalidTransition))
    async def cancel_deletion(self, ctx: NamedDependency[MemberContext]) -> Org:
        """Back to the state before the deletion request."""
        return await lifecycle.cancel_deletion(ctx.uow.session, ctx.org.id, ctx.principal.user_id, ip=ctx.ip)


router = Router(path="/", route_handlers=[OrgController, MemberController, LifecycleController])
