"""HTTP routes of the audit trail. Thin: decode, one service call, return."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import FromQuery, QueryParameter

from space.audit import service
from space.audit.schemas import AuditPage
from space.orgs.deps import ADMINS, MEMBER, MemberContext

Limit = Annotated[int, QueryParameter(ge=1, le=service.MAX_LIMIT)]


class AuditController(Controller):
    """The org's audit trail, newest first: owners and admins."""

    path = "/orgs/{org_id:str}/audit"
    tags = ["audit"]
    dependencies = MEMBER
    opt = {"roles": ADMINS}

    @get("/")
    async def trail(
        self,
        ctx: NamedDependency[MemberContext],
        before: FromQuery[str | None] = None,
        limit: Limit = service.DEFAULT_LIMIT,
    ) -> AuditPage:
        """A page of the trail; `next` is the cursor of the older page (pass it as `before`), null at the end."""
        return await service.page(ctx.uow.session, ctx.org.id, before, limit)
