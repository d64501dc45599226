"""Request-scoped dependencies: the unit of work, the principal, and the caller's membership in the org.

Role requirements are declared once per controller or handler as `opt={"roles": ...}`; writes are refused
by org state here unless the layer says `opt={"state_exempt": True}` (exports and lifecycle decide their
own rules).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath
from sqlalchemy import select

from space.auth.service import Principal
from space.db import Tenant, UnitOfWork
from space.errors import Forbidden, NotFound, OrgDeleting, OrgSuspended
from space.orgs.models import Membership, Organization, OrgState, Role

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
STAFF = frozenset({Role.owner, Role.admin, Role.member})
ADMINS = frozenset({Role.owner, Role.admin})
OWNERS = frozenset({Role.owner})


@dataclass(frozen=True)
class MemberContext:
    """The caller, their org and membership, and the unit of work with the org's tenant context set."""

    uow: UnitOfWork
    principal: Principal
    org: Organization
    membership: Membership | None

    @property
    def role(self) -> Role | None:
        """The caller's role, or None for a former member (only routes that allow it see this)."""
        return Role(self.membership.role) if self.membership else None


def parse_id(value: str) -> uuid.UUID:
    """A path id; a malformed one is answered like an unknown one (404)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise NotFound() from None


async def provide_uow(state: State) -> AsyncGenerator[UnitOfWork, None]:
    """One transaction per request: commits when the handler returns, rolls back when it raises."""
    async with UnitOfWork(state.db.sessionmaker) as uow:
        yield uow


async def provide_principal(request: Request[Any, Any, Any], uow: NamedDependency[UnitOfWork]) -> Principal:
    """The caller, authenticated by the middleware; their user id becomes part of the tenant context."""
    principal: Principal = request.user  # set by the authentication middleware
    await uow.retenant(Tenant(user_id=principal.user_id))
    return principal


async def provide_member(
    request: Request[Any, Any, Any],
    uow: NamedDependency[UnitOfWork],
    principal: NamedDependency[Principal],
    org_id: FromPath[str],
) -> MemberContext:
    """Resolve org and membership under RLS; non-members and unknown orgs both get 404."""
    oid = parse_id(org_id)
    opt = request.route_handler.opt
    await uow.retenant(Tenant(org_id=oid, user_id=principal.user_id))
    org = await uow.session.get(Organization, oid)
    if org is None or org.state == OrgState.deleted:
        raise NotFound()
    membership = (
        await uow.session.execute(
            select(Membership).where(Membership.org_id == oid, Membership.user_id == principal.user_id)
        )
    ).scalar_one_or_none()
    if membership is None:
        if not opt.get("allow_former_member"):
            raise NotFound()
        return MemberContext(uow, principal, org, None)
    role = Role(membership.role)
    if role is Role.customer:
        # Customers see their own tickets only; RLS enforces it with this second setting.
        await uow.retenant(Tenant(org_id=oid, user_id=principal.user_id, customer_id=principal.user_id))
    roles = opt.get("roles")
    if roles is not None and role not in roles:
        raise Forbidden(f"This action needs one of the roles: {', '.join(sorted(r.value for r in roles))}.")
    if request.method not in READ_METHODS and not opt.get("state_exempt"):
        ensure_writable(org)
    return MemberContext(uow, principal, org, membership)


def ensure_writable(org: Organization) -> None:
    """Writes to an org's data are refused while it is suspended or being deleted (SPEC §3)."""
    if org.state == OrgState.suspended:
        raise OrgSuspended("The organization is suspended; its data is read-only.")
    if org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted.")


DEPENDENCIES = {
    "uow": Provide(provide_uow),
    "principal": Provide(provide_principal),
}
MEMBER = {"ctx": Provide(provide_member)}
