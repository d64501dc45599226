"""What a schedule learns when one of its runs ends (told by the exports' outcome door, `exports.outcomes`):
a completed run clears its failures; a failed one counts, and the third in a row pauses it (`failing`); a run
failed `access_revoked` (its creator is no longer an owner or admin) pauses it at once. A pause is told to the
creator and the org's owners (SPEC §19, `schedule.paused`) in the same transaction. So is a run whose delivery
the customer's store refused (`destination_failed`, SPEC §22, told by `destinations.delivery`)."""

from __future__ import annotations

import uuid

from saq import Queue
from sqlalchemy import select

from space.db import UnitOfWork
from space.notifications import service as notifications
from space.orgs.models import Membership, Role
from space.schedules.models import FAILURES_TO_PAUSE, PausedReason, Schedule

ACCESS_REVOKED = "access_revoked"


async def run_ended(
    uow: UnitOfWork,
    queue: Queue | None,
    org_id: uuid.UUID,
    schedule_id: uuid.UUID,
    *,
    completed: bool,
    error_code: str | None,
) -> None:
    """Count the run's end on its schedule (locked), pausing it when SPEC §21 says so."""
    session = uow.session
    s = await session.scalar(
        select(Schedule).where(Schedule.org_id == org_id, Schedule.id == schedule_id).with_for_update()
    )
    if s is None:
        return
    if completed:
        s.consecutive_failures = 0
        return
    s.consecutive_failures += 1
    if error_code == ACCESS_REVOKED:
        reason = PausedReason.access_revoked
    elif s.consecutive_failures >= FAILURES_TO_PAUSE:
        reason = PausedReason.failing
    else:
        return
    await _pause(uow, queue, s, reason, error_code)


async def delivery_failed(
    uow: UnitOfWork, queue: Queue | None, org_id: uuid.UUID, schedule_id: uuid.UUID, error_code: str | None
) -> None:
    """A run's delivery failed for good (the customer's store refused it, SPEC §22): pause the schedule
    (`destination_failed`) and tell its creator and the owners, in the transaction that records the failure."""
    s = await uow.session.scalar(
        select(Schedule).where(Schedule.org_id == org_id, Schedule.id == schedule_id).with_for_update()
    )
    if s is not None:
        await _pause(uow, queue, s, PausedReason.destination_failed, error_code)


async def _pause(
    uow: UnitOfWork, queue: Queue | None, s: Schedule, reason: PausedReason, error_code: str | None
) -> None:
    if s.paused:
        return
    s.paused = True
    s.paused_reason = reason.value
    owners = await uow.session.scalars(
        select(Membership.user_id).where(Membership.org_id == s.org_id, Membership.role == Role.owner.value)
    )
    await notifications.schedule_paused(
        uow,
        queue,
        org_id=s.org_id,
        schedule_id=s.id,
        kind=s.kind,
        reason=reason.value,
        failures=s.consecutive_failures,
        recipients=[s.created_by, *owners],
        error_code=error_code,
    )
