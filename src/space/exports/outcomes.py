"""The one door of an ended execution: everything an export owes when it ends is decided here, in the
transaction that ends it.

Every ending comes through `ended`: completed or failed by its worker (`Lease.complete_in`, `Lease.fail_in`),
failed `worker_lost` when its attempts ran out (`lease.fail_exhausted`: a claim, the reconciler), cancelled by
its owner or an admin (`service.delete_export`), cancelled because its creator's role changed or they were
removed (`service.cancel_for_role`). It writes the audit row, then hands the outcome to each channel in
`CHANNELS`. A channel writes what it owes in the same transaction (rows of its outbox, `space.outbox`) and
enqueues after the commit, so what is sent exists exactly when the outcome committed.

Channels today: webhooks, notifications (SPEC §19: in the app and by email, to the export's creator), and
deliveries to a customer's bucket (§22: a completed scheduled run whose schedule names a destination).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from saq import Queue

from space.audit import service as audit
from space.audit.models import AuditAction
from space.db import UnitOfWork
from space.destinations import service as destinations
from space.exports import ledger
from space.exports.models import ExportState
from space.notifications import service as notifications
from space.notifications.models import NotificationType
from space.schedules import runs as schedule_runs
from space.webhooks import service as webhooks
from space.webhooks.models import EventType
from space.webhooks.schemas import EventData


@dataclass(frozen=True)
class Outcome:
    """How one export ended, and who ended it: what the audit row says and every channel is told."""

    export_id: uuid.UUID
    org_id: uuid.UUID
    kind: str
    state: ExportState
    """completed, failed or cancelled."""
    error_code: str | None = None
    actor_id: uuid.UUID | None = None
    """Who ended it; None: the system (its worker, or the reconciler)."""
    ip: str | None = None
    creator_id: uuid.UUID | None = None
    """The export's creator, named in the audit row when an owner or admin ended another member's export."""
    row_count: int | None = None
    byte_size: int | None = None


def completed(export_id: uuid.UUID, org_id: uuid.UUID, kind: str, *, row_count: int, byte_size: int) -> Outcome:
    """Published by its worker."""
    return Outcome(export_id, org_id, kind, ExportState.completed, row_count=row_count, byte_size=byte_size)


def failed(export_id: uuid.UUID, org_id: uuid.UUID, kind: str, code: str) -> Outcome:
    """Failed by the system with `code` (its worker, or `worker_lost` when its attempts ran out)."""
    return Outcome(export_id, org_id, kind, ExportState.failed, error_code=code)


def cancelled(
    export_id: uuid.UUID,
    org_id: uuid.UUID,
    kind: str,
    code: str,
    *,
    actor_id: uuid.UUID,
    ip: str | None,
    creator_id: uuid.UUID | None = None,
) -> Outcome:
    """Stopped by `actor_id` (its owner; or an owner or admin, who names the `creator_id`) with `code`."""
    return Outcome(
        export_id, org_id, kind, ExportState.cancelled, error_code=code, actor_id=actor_id, ip=ip, creator_id=creator_id
    )


Channel = Callable[[UnitOfWork, Queue | None, Outcome], Awaitable[None]]
"""What an outbound channel is: told every outcome in the ending transaction, it owes what it sends."""


async def ended(uow: UnitOfWork, queue: Queue | None, outcome: Outcome) -> None:
    """Record an export's end in the transaction that ends it (the uow's tenant is its org): the audit row, then
    what each channel owes for it (its jobs enqueued on `queue` after the commit; with None, its sweeper's)."""
    await _audit(uow, outcome)
    for channel in CHANNELS:
        await channel(uow, queue, outcome)


_ACTIONS = {
    ExportState.completed: AuditAction.export_completed,
    ExportState.failed: AuditAction.export_failed,
    ExportState.cancelled: AuditAction.export_cancelled,
}


async def _audit(uow: UnitOfWork, outcome: Outcome) -> None:
    details: dict[str, Any]
    if outcome.state is ExportState.completed:
        details = {"rows": outcome.row_count, "bytes": outcome.byte_size}
    else:
        details = {"errorCode": outcome.error_code}
        if outcome.creator_id is not None:
            details = {"creatorId": str(outcome.creator_id), **details}
    await audit.record(
        uow.session,
        outcome.org_id,
        _ACTIONS[outcome.state],
        audit.Target.export(outcome.export_id),
        actor_id=outcome.actor_id,
        ip=outcome.ip,
        details=details,
    )


async def _webhooks(uow: UnitOfWork, queue: Queue | None, outcome: Outcome) -> None:
    # SPEC §12's events are `export.completed` and `export.failed`: a cancellation has none (§19 will tell the
    # creator of one, by email and in the app).
    if outcome.state is ExportState.completed:
        event = EventType.export_completed
    elif outcome.state is ExportState.failed:
        event = EventType.export_failed
    else:
        return
    data = EventData(
        org_id=outcome.org_id,
        export_id=outcome.export_id,
        kind=outcome.kind,
        state=outcome.state.value,
        error_code=outcome.error_code,
    )
    await webhooks.emit(uow, queue, event, data)


async def _notifications(uow: UnitOfWork, queue: Queue | None, outcome: Outcome) -> None:
    # SPEC §19: the creator hears of a completion, a failure, and a cancellation by someone else (an owner or admin,
    # or a role change or removal: those outcomes name the creator); one's own cancel needs no telling.
    if outcome.state is ExportState.completed:
        type_ = NotificationType.export_completed
    elif outcome.state is ExportState.failed:
        type_ = NotificationType.export_failed
    elif outcome.creator_id is not None and outcome.creator_id != outcome.actor_id:
        type_ = NotificationType.export_cancelled
    else:
        return
    facts = await ledger.ended_facts(uow.session, outcome.org_id, outcome.export_id)
    if facts is None:
        return
    creator_id, expires_at = facts
    await notifications.export_ended(
        uow,
        queue,
        type_,
        org_id=outcome.org_id,
        export_id=outcome.export_id,
        kind=outcome.kind,
        creator_id=creator_id,
        row_count=outcome.row_count,
        byte_size=outcome.byte_size,
        expires_at=expires_at if outcome.state is ExportState.completed else None,
        error_code=outcome.error_code,
    )


async def _schedule(uow: UnitOfWork, queue: Queue | None, outcome: Outcome) -> None:
    # SPEC §21: a schedule counts its runs' failures and pauses after three, or at once on access_revoked. A run
    # cancelled by a person is neither a success nor a failure of the schedule.
    if outcome.state is ExportState.cancelled:
        return
    schedule_id = await ledger.schedule_of(uow.session, outcome.org_id, outcome.export_id)
    if schedule_id is None:
        return
    await schedule_runs.run_ended(
        uow,
        queue,
        outcome.org_id,
        schedule_id,
        completed=outcome.state is ExportState.completed,
        error_code=outcome.error_code,
    )


async def _destinations(uow: UnitOfWork, queue: Queue | None, outcome: Outcome) -> None:
    # SPEC §22: only a published export is delivered; a failed or cancelled run has nothing to copy.
    if outcome.state is ExportState.completed:
        await destinations.owe_after_publish(uow, queue, outcome.org_id, outcome.export_id)


CHANNELS: tuple[Channel, ...] = (_webhooks, _notifications, _schedule, _destinations)
"""Every outbound channel, in the order they are told."""
