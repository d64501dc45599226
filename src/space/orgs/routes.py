"""HTTP routes of organizations and members. Thin: decode, one service call, return."""

from __future__ import annotations

from litestar import Controller, Router, delete, get, patch, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from space.auth.deps import ADMINS, MEMBER, MemberContext, parse_id
from space.auth.service import Principal
from space.db import UnitOfWork
from space.orgs import service
from space.orgs.schemas import Member, MemberCreate, MemberUpdate, Org, OrgCreate
from space.schemas import Items


class OrgController(Controller):
    """Create and list orgs; read one."""

    path = "/orgs"
    tags = ["orgs"]

    @post("/")
    async def create(
        self,
        data: JSONBody[OrgCreate],
        uow: NamedDependency[UnitOfWork],
        principal: NamedDependency[Principal],
    ) -> Org:
        """Create an organization; the caller becomes its owner."""
        return await service.create_org(uow, principal, data.name)

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
        return Items(items=await service.list_members(ctx))

    @post("/", opt={"roles": ADMINS})
    async def add(self, ctx: NamedDependency[MemberContext], data: JSONBody[MemberCreate]) -> Member:
        """Add an existing user by email."""
        return await service.add_member(ctx, data)

    @patch("/{user_id:str}", opt={"roles": ADMINS})
    async def change_role(
        self, ctx: NamedDependency[MemberContext], user_id: FromPath[str], data: JSONBody[MemberUpdate]
    ) -> Member:
        """Change a member's role."""
        return await service.change_role(ctx, parse_id(user_id), data.role)

    @delete("/{user_id:str}", opt={"roles": ADMINS})
    async def remove(self, ctx: NamedDependency[MemberContext], user_id: FromPath[str]) -> None:
        """Remove a member."""
        await service.remove_member(ctx, parse_id(user_id))


router = Router(path="/", route_handlers=[OrgController, MemberController])
