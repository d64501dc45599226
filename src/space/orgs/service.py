"""Organizations and memberships: creation, listing, the org lock, and the role rules. Imports no other domain's
service: the member use cases (which cancel exports too) are `space.orgs.members`."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.auth.models import User
from space.auth.service import Principal
from space.db import Tenant, UnitOfWork
from space.db.locks import lock_user
from space.errors import Forbidden, NotFound, OrgDeleting, OrgLimitReached, OrgSuspended
from space.orgs.models import Membership, Organization, OrgState, Role
from space.orgs.schemas import Member, Org
from space.tickets.models import TicketCounter


def org_out(org: Organization) -> Org:
    """The API shape of an org."""
    return Org(
        id=org.id,
        name=org.name,
        state=OrgState(org.state),
        created_at=org.created_at,
        delete_after=org.delete_after,
    )


MANAGERS = frozenset({Role.owner, Role.admin})
"""Who adds members, changes roles and removes members (only owners touch owners; `space.orgs.members`)."""


async def lock_org(session: AsyncSession, org_id: uuid.UUID) -> Organization:
    """Take the org lock (its row, FOR NO KEY UPDATE): member changes, lifecycle and export publishes order on it."""
    # NO KEY UPDATE conflicts with itself (and with UPDATEs of the row), so everything that takes this lock is
    # ordered, but not with the FOR KEY SHARE that foreign-key checks take: inserts that reference the org
    # (tickets, exports, members) don't wait behind a role change or a publish.
    org = (
        await session.execute(
            select(Organization)
            .where(Organization.id == org_id)
            .with_for_update(key_share=True)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if org is None:
        raise NotFound()
    return org


async def create_org(uow: UnitOfWork, principal: Principal, name: str, max_owned: int) -> Org:
    """Create an org with the caller as its owner, unless they already created `max_owned` (SPEC §14, §25)."""
    # Two creations by one user are ordered by the user's lock, so both can't see room for one more.
    await lock_user(uow.session, principal.user_id)
    created = await created_orgs(uow.session, principal.user_id)
    if created >= max_owned:
        raise OrgLimitReached(f"You created {created} organizations; at most {max_owned} are allowed.")
    org_id = uuid.uuid4()
    await uow.retenant(Tenant(org_id=org_id, user_id=principal.user_id))
    org = Organization(id=org_id, name=name.strip(), state=OrgState.active.value, created_by=principal.user_id)
    uow.session.add(org)
    await uow.session.flush()
    uow.session.add(Membership(id=uuid.uuid4(), org_id=org_id, user_id=principal.user_id, role=Role.owner.value))
    uow.session.add(TicketCounter(org_id=org_id, last_number=0))
    await uow.session.flush()
    await uow.session.refresh(org)
    return org_out(org)


async def created_orgs(session: AsyncSession, user_id: uuid.UUID) -> int:
    """Orgs (not deleted) the user created, whatever their role in them now; needs the user's tenant context (RLS
    shows a user the orgs they created, policy `created_orgs`)."""
    # Counted by creator, not by owner: an owner who makes someone else owner and steps down frees no place, and
    # the person made owner is charged nothing (no consent is asked of them).
    n = await session.scalar(
        select(func.count())
        .select_from(Organization)
        .where(Organization.created_by == user_id, Organization.state != OrgState.deleted.value)
    )
    return int(n or 0)


async def list_orgs(uow: UnitOfWork) -> list[Org]:
    """Orgs where the caller (the tenant's user) is a member; RLS scopes both tables to them."""
    rows = await uow.session.execute(
        select(Organization)
        .join(Membership, Membership.org_id == Organization.id)
        .where(Membership.user_id == uow.tenant.user_id, Organization.state != OrgState.deleted.value)
        .order_by(Organization.created_at, Organization.id)
    )
    return [org_out(o) for o in rows.scalars()]


def member_out(m: Membership, u: User) -> Member:
    return Member(id=m.id, user_id=u.id, email=u.email, name=u.name, role=Role(m.role), created_at=m.created_at)


async def list_members(session: AsyncSession, org_id: uuid.UUID) -> list[Member]:
    """Every member of the org, oldest first."""
    rows = await session.execute(
        select(Membership, User)
        .join(User, User.id == Membership.user_id)
        .where(Membership.org_id == org_id)
        .order_by(Membership.created_at, Membership.id)
    )
    return [member_out(m, u) for m, u in rows.all()]


async def authority(session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, roles: frozenset[Role]) -> Membership:
    """The caller's membership as it is now (read under the org lock): 404 when gone, 403 below `roles`."""
    # A caller removed while their request waited for the lock is no longer a member: answered like any
    # non-member. One demoted meanwhile is answered as the role guard would have answered them.
    membership = await membership_of(session, org_id, user_id)
    if membership is None:
        raise NotFound()
    ensure_role(Role(membership.role), roles)
    return membership


def ensure_role(role: Role, roles: frozenset[Role]) -> None:
    """Forbidden unless `role` is one of `roles` (the role guard's one answer)."""
    if role not in roles:
        raise Forbidden(f"This action needs one of the roles: {', '.join(sorted(r.value for r in roles))}.")


async def membership_of(session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID) -> Membership | None:
    """The user's membership in the org as the database has it now, or None."""
    return (
        await session.execute(
            select(Membership)
            .where(Membership.org_id == org_id, Membership.user_id == user_id)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()


async def org_and_membership(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID
) -> tuple[Organization | None, Membership | None]:
    """The org and the user's membership in it as the database has them now, in one statement (every org route
    reads both); (None, None) when the org is not visible."""
    row = (
        await session.execute(
            select(Organization, Membership)
            .outerjoin(Membership, (Membership.org_id == Organization.id) & (Membership.user_id == user_id))
            .where(Organization.id == org_id)
            .execution_options(populate_existing=True)
        )
    ).one_or_none()
    return (None, None) if row is None else (row[0], row[1])


async def org_state(session: AsyncSession, org_id: uuid.UUID) -> str | None:
    """The org's state, or None when it is gone."""
    state: str | None = await session.scalar(select(Organization.state).where(Organization.id == org_id))
    return state


async def org_name(session: AsyncSession, org_id: uuid.UUID) -> str:
    """The org's name ("" when it is gone)."""
    name: str | None = await session.scalar(select(Organization.name).where(Organization.id == org_id))
    return name or ""


def ensure_writable(org: Organization) -> None:
    """Writes to an org's data are refused while it is suspended or being deleted (SPEC §3)."""
    if org.state == OrgState.suspended:
        raise OrgSuspended("The organization is suspended; its data is read-only.")
    if org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted.")


async def key_shared_membership(
    session: AsyncSession, org_id: uuid.UUID, membership_id: uuid.UUID
) -> Membership | None:
    """The membership, locked FOR KEY SHARE until commit (None when it is gone): it can't be removed meanwhile."""
    # A row about to reference it (a ticket's assignee) stays valid: a removal that started first is waited
    # for and then seen as gone, one that starts later waits for this transaction. Role changes don't wait.
    return (
        await session.execute(
            select(Membership)
            .where(Membership.id == membership_id, Membership.org_id == org_id)
            .with_for_update(read=True, key_share=True)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
