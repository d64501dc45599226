"""Organization lifecycle: one transition table, one function that changes state under the org lock."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from saq import Queue
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.audit import service as audit
from space.audit.models import AuditAction
from space.db import UnitOfWork
from space.errors import FinalExportRecommended, InvalidRequest, InvalidTransition
from space.exports import service as exports
from space.notifications import service as notifications
from space.orgs.models import Organization, OrgState, Role
from space.orgs.schemas import DeletionRequest, Org
from space.orgs.service import authority, lock_org, org_out
from space.webhooks import service as webhooks
from space.webhooks.models import EventType
from space.webhooks.schemas import EventData

FINAL_EXPORT_WINDOW = dt.timedelta(hours=24)
"""How recent an owner's completed snapshot or archive must be for a deletion request without skipFinalExport."""
OWNERS = frozenset({Role.owner})


class Action(enum.StrEnum):
    """What can happen to an organization's state."""

    suspend = "suspend"
    reactivate = "reactivate"
    request_deletion = "request_deletion"
    cancel_deletion = "cancel_deletion"
    purge = "purge"


@dataclass(frozen=True)
class Transition:
    """Where an action may start, where it leads (None: the state before deletion), who may ask (None: the purge)."""

    sources: frozenset[OrgState]
    target: OrgState | None
    roles: frozenset[Role] | None = OWNERS


TRANSITIONS: Mapping[Action, Transition] = MappingProxyType(
    {
        Action.suspend: Transition(frozenset({OrgState.active}), OrgState.suspended),
        Action.reactivate: Transition(frozenset({OrgState.suspended}), OrgState.active),
        Action.request_deletion: Transition(frozenset({OrgState.active, OrgState.suspended}), OrgState.deleting),
        Action.cancel_deletion: Transition(frozenset({OrgState.deleting}), None),
        Action.purge: Transition(frozenset({OrgState.deleting}), OrgState.deleted, roles=None),
    }
)
"""The whole state machine (SPEC §3). Anything not listed here is 409 `invalid_transition`."""

Precondition = Callable[[Organization], Awaitable[None]]

AUDITED: Mapping[Action, AuditAction] = MappingProxyType(
    {
        Action.suspend: AuditAction.org_suspended,
        Action.reactivate: AuditAction.org_reactivated,
        Action.request_deletion: AuditAction.org_deletion_requested,
        Action.cancel_deletion: AuditAction.org_deletion_cancelled,
    }
)
"""What each asked-for transition writes to the audit trail (the purge removes the trail with the org)."""


async def change_state(
    session: AsyncSession,
    org_id: uuid.UUID,
    action: Action,
    *,
    actor_id: uuid.UUID | None,
    grace_seconds: int = 0,
    precondition: Precondition | None = None,
    ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> Organization:
    """Lock the org, check the actor, `action` against TRANSITIONS (and `precondition`), then move it; flushes.

    `actor_id` is the user asking; their role is read under the lock and decides (404 when they are no
    longer a member, 403 below the transition's roles). None only for the system's own transitions.
    """
    transition = TRANSITIONS[action]
    if (actor_id is None) != (transition.roles is None):
        raise ValueError(f"{action.value}: {'needs' if transition.roles else 'takes no'} actor")
    org = await lock_org(session, org_id)
    if actor_id is not None and transition.roles is not None:
        # The route's role guard ran before the lock; a removal or demotion may have committed meanwhile.
        await authority(session, org_id, actor_id, transition.roles)
    now: dt.datetime = (await session.execute(select(func.now()))).scalar_one()
    state = OrgState(org.state)
    if state not in transition.sources:
        raise InvalidTransition(f"Can't {action.value.replace('_', ' ')} an organization that is {state.value}.")
    if action is Action.cancel_deletion and not _cancellable(org, now):
        raise InvalidTransition("The grace period is over; the deletion can no longer be cancelled.")
    if action is Action.purge and not is_due(org, now):
        raise InvalidTransition("The organization is not due for purging.")
    if precondition is not None:
        await precondition(org)
    match action:
        case Action.request_deletion:
            org.previous_state = state.value
            org.delete_after = now + dt.timedelta(seconds=grace_seconds)
            org.state = OrgState.deleting.value
        case Action.cancel_deletion:
            org.state = org.previous_state or OrgState.active.value
            org.previous_state = None
            org.delete_after = None
        case Action.purge:
            org.state = OrgState.deleted.value
            org.previous_state = None
            org.deleted_at = now
            # The tombstone keeps id, timestamps and counts; the name is the org's data, not ours to keep.
            org.name = ""
        case _:
            assert transition.target is not None
            org.state = transition.target.value
    await session.flush()
    if action in AUDITED:
        await audit.record(
            session,
            org_id,
            AUDITED[action],
            audit.Target.org(org_id),
            actor_id=actor_id,
            ip=ip,
            details={"from": state.value, "to": org.state, **(details or {})},
        )
    await session.refresh(org)
    return org


def is_due(org: Organization, now: dt.datetime) -> bool:
    """The org is being deleted and its grace period is over."""
    return org.state == OrgState.deleting and org.delete_after is not None and org.delete_after <= now


def _cancellable(org: Organization, now: dt.datetime) -> bool:
    # `purged_counts` is set by the purge's first batch: once rows are gone, going back would leave a husk.
    return org.purged_counts is None and (org.delete_after is None or now < org.delete_after)


async def suspend(session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, *, ip: str | None = None) -> Org:
    """active -> suspended, asked by `actor_id` (an owner under the lock)."""
    return org_out(await change_state(session, org_id, Action.suspend, actor_id=actor_id, ip=ip))


async def reactivate(session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, *, ip: str | None = None) -> Org:
    """suspended -> active, asked by `actor_id` (an owner under the lock)."""
    return org_out(await change_state(session, org_id, Action.reactivate, actor_id=actor_id, ip=ip))


async def request_deletion(
    uow: UnitOfWork,
    org: Organization,
    owner_id: uuid.UUID,
    data: DeletionRequest,
    grace_seconds: int,
    queue: Queue | None = None,
    *,
    ip: str | None = None,
) -> Org:
    """active|suspended -> deleting, with deleteAfter = now + grace; needs the name and a recent final export.

    The org's `org.deletion_requested` webhooks and every owner's notifications are owed in the same transaction and
    enqueued on `queue` (the outbound lane's) after it.
    """
    session = uow.session
    if data.confirm != org.name:
        raise InvalidRequest("confirm: must equal the organization's name.", errors=[{"key": "confirm"}])

    async def final_export_taken(locked: Organization) -> None:
        if data.skip_final_export:
            return
        if not await exports.has_recent_final_export(session, locked.id, owner_id, FINAL_EXPORT_WINDOW):
            raise FinalExportRecommended(
                "Take a snapshot or archive export first (none completed by you in the last 24 hours is still"
                ' downloadable), or send "skipFinalExport": true.'
            )

    locked = await change_state(
        session,
        org.id,
        Action.request_deletion,
        actor_id=owner_id,
        grace_seconds=grace_seconds,
        precondition=final_export_taken,
        ip=ip,
        details={"skipFinalExport": data.skip_final_export},
    )
    await webhooks.emit(uow, queue, EventType.org_deletion_requested, EventData(org_id=locked.id))
    await notifications.deletion_requested(uow, queue, locked.id, owner_id, locked.delete_after)
    return org_out(locked)


async def cancel_deletion(
    session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, *, ip: str | None = None
) -> Org:
    """deleting -> the state before the request, during the grace period, asked by `actor_id` (an owner)."""
    return org_out(await change_state(session, org_id, Action.cancel_deletion, actor_id=actor_id, ip=ip))
