"""Member use cases: add a member, change a role, remove a member, each under the org lock, as an owner or admin.

They span two domains (a role change or a removal cancels the exports the member can no longer hold), so they
live here and not in `orgs.service`, which imports no other domain's service.
"""

from __future__ import annotations

import uuid

from saq import Queue
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.audit import service as audit
from space.audit.models import AuditAction
from space.auth.models import User
from space.auth.service import user_by_email
from space.db import UnitOfWork
from space.errors import AlreadyMember, Forbidden, LastOwner, NotFound
from space.exports import service as exports
from space.orgs.models import Membership, OrgState, Role
from space.orgs.schemas import Member, MemberCreate
from space.orgs.service import MANAGERS, authority, ensure_writable, lock_org, member_out, membership_of


async def add_member(
    session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, data: MemberCreate, *, ip: str | None = None
) -> Member:
    """Add an existing user by email, as `actor_id` (an owner or admin under the lock); only owners add owners."""
    _ensure_may_grant(await _lock_as_manager(session, org_id, actor_id), data.role)
    user = await user_by_email(session, data.email)
    if await membership_of(session, org_id, user.id) is not None:
        raise AlreadyMember(f"{user.email} is already a member.")
    m = Membership(id=uuid.uuid4(), org_id=org_id, user_id=user.id, role=data.role.value)
    session.add(m)
    await session.flush()
    await session.refresh(m)
    await audit.record(
        session,
        org_id,
        AuditAction.member_added,
        audit.Target.user(user.id),
        actor_id=actor_id,
        ip=ip,
        details={"role": m.role},
    )
    return member_out(m, user)


async def change_role(
    uow: UnitOfWork,
    org_id: uuid.UUID,
    actor_id: uuid.UUID,
    user_id: uuid.UUID,
    role: Role,
    *,
    ip: str | None = None,
    queue: Queue | None = None,
) -> Member:
    """Change a member's role under the org lock (ordered against export publishes), as `actor_id` then; their
    queued and running exports the new role can't hold are cancelled in the same transaction (what that owes is
    enqueued on `queue` after it)."""
    session = uow.session
    actor_role = await _lock_as_manager(session, org_id, actor_id)
    m = await _target(session, org_id, actor_role, user_id)
    _ensure_may_grant(actor_role, role)
    if m.role == Role.owner and role is not Role.owner:
        await _ensure_not_last_owner(session, org_id)
    before = m.role
    if before != role.value:
        m.role = role.value
        await session.flush()
        await audit.record(
            session,
            org_id,
            AuditAction.member_role_changed,
            audit.Target.user(user_id),
            actor_id=actor_id,
            ip=ip,
            details={"from": before, "to": role.value},
        )
        await exports.cancel_for_role(uow, org_id, user_id, role, actor_id=actor_id, ip=ip, queue=queue)
    user = await session.get_one(User, user_id)
    return member_out(m, user)


async def remove_member(
    uow: UnitOfWork,
    org_id: uuid.UUID,
    actor_id: uuid.UUID,
    user_id: uuid.UUID,
    *,
    ip: str | None = None,
    queue: Queue | None = None,
) -> None:
    """Remove a member under the org lock, as `actor_id` then; the last owner stays. Their queued and running
    exports are cancelled in the same transaction."""
    session = uow.session
    actor_role = await _lock_as_manager(session, org_id, actor_id)
    m = await _target(session, org_id, actor_role, user_id)
    if m.role == Role.owner:
        await _ensure_not_last_owner(session, org_id)
    await session.delete(m)
    await session.flush()
    await audit.record(
        session,
        org_id,
        AuditAction.member_removed,
        audit.Target.user(user_id),
        actor_id=actor_id,
        ip=ip,
        details={"role": m.role},
    )
    await exports.cancel_for_role(uow, org_id, user_id, None, actor_id=actor_id, ip=ip, queue=queue)


async def _lock_as_manager(session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID) -> Role:
    # The org's state and the actor's role were read before the lock; either may have changed while this
    # request waited for it (the reason the lock exists), so both are decided again here.
    org = await lock_org(session, org_id)
    if org.state == OrgState.deleted:
        raise NotFound()
    actor = await authority(session, org_id, actor_id, MANAGERS)
    ensure_writable(org)
    return Role(actor.role)


async def _target(session: AsyncSession, org_id: uuid.UUID, actor_role: Role, user_id: uuid.UUID) -> Membership:
    m = await membership_of(session, org_id, user_id)
    if m is None:
        raise NotFound()
    if m.role == Role.owner and actor_role is not Role.owner:
        raise Forbidden("Only owners can change or remove owners.")
    return m


def _ensure_may_grant(actor_role: Role, role: Role) -> None:
    if role is Role.owner and actor_role is not Role.owner:
        raise Forbidden("Only owners can make owners.")


async def _ensure_not_last_owner(session: AsyncSession, org_id: uuid.UUID) -> None:
    owners = await session.scalar(
        select(func.count())
        .select_from(Membership)
        .where(Membership.org_id == org_id, Membership.role == Role.owner.value)
    )
    if (owners or 0) <= 1:
        raise LastOwner("The last owner can't be removed or demoted.")
