"""The request context of every org route: the caller's org and membership, resolved under RLS.

Role requirements are declared once per controller or handler as `opt={"roles": ...}`; writes are refused
by org state here unless the layer says `opt={"state_exempt": True}` (exports and lifecycle decide their
own rules). Routes unpack the context and hand services what they need (session, principal, org,
membership), so a job or a CLI command calls the same service functions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath

from space.audit.service import client_ip
from space.auth.service import Principal
from space.db import Tenant, UnitOfWork
from space.errors import NotFound
from space.orgs import service
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
    ip: str | None = None
    """Where the request came from (the audit trail's `ip`): the peer, or what a trusted proxy forwarded."""

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


async def provide_member(
    request: Request[Any, Any, Any],
    uow: NamedDependency[UnitOfWork],
    principal: NamedDependency[Principal],
    org_id: FromPath[str],
) -> MemberContext:
    """Resolve org and membership under RLS; non-members and unknown orgs both get 404."""
    oid = parse_id(org_id)
    opt = request.route_handler.opt
    ip = request_ip(request)
    await uow.retenant(Tenant(org_id=oid, user_id=principal.user_id))
    org, membership = await service.org_and_membership(uow.session, oid, principal.user_id)
    if org is None or org.state == OrgState.deleted:
        raise NotFound()
    if membership is None:
        if not opt.get("allow_former_member"):
            raise NotFound()
        return MemberContext(uow, principal, org, None, ip)
    role = Role(membership.role)
    if role is Role.customer:
        # Customers see their own tickets only; RLS enforces it with this second setting.
        await uow.retenant(Tenant(org_id=oid, user_id=principal.user_id, customer_id=principal.user_id))
    roles = opt.get("roles")
    if roles is not None:
        service.ensure_role(role, roles)
    if request.method not in READ_METHODS and not opt.get("state_exempt"):
        service.ensure_writable(org)
    return MemberContext(uow, principal, org, membership, ip)


def request_ip(request: Request[Any, Any, Any]) -> str | None:
    """The caller's address: the connection's peer, or X-Forwarded-For when that peer is a trusted proxy."""
    peer = request.client.host if request.client else None
    return client_ip(peer, request.headers.getall("x-forwarded-for", []), request.app.state.trusted_proxies)


MEMBER = {"ctx": Provide(provide_member)}
