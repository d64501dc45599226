"""Notifications: `notify` owes one event to its recipients (an in-app row and an email row each) in the
transaction of the change it announces; what each event says and to whom (`export_ended`, `deletion_requested`);
and the caller's own side, across orgs: the list, marking read, email preferences.

Rows are written, never sent, here: in-app rows are delivered by being written; the email rows are the outbox
(`outbox.EMAILS`), enqueued after the commit and sent by `sending.send_email`, which decides at send time whether
the recipient still gets it. Nothing here reads or writes an export: a notification can't change one.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from saq import Queue
from sqlalchemy import func, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from space import cursors
from space.auth.models import User
from space.db import UnitOfWork
from space.errors import InvalidRequest, NotFound
from space.notifications import messages
from space.notifications.models import Channel, Notification, NotificationPreference, NotificationType
from space.notifications.outbox import EMAILS
from space.notifications.schemas import NotificationItem, NotificationPage, Preferences, PreferencesUpdate
from space.orgs import service as orgs
from space.orgs.models import Membership, Role


@dataclass(frozen=True)
class Notice:
    """One event to tell: its type, org, recipients, the line people read, and what an email adds."""

    type: NotificationType
    org_id: uuid.UUID
    recipients: Sequence[uuid.UUID]
    title: str
    details: dict[str, Any] = field(default_factory=dict)
    export_id: uuid.UUID | None = None
    schedule_id: uuid.UUID | None = None
    import_id: uuid.UUID | None = None


async def notify(uow: UnitOfWork, queue: Queue | None, notice: Notice) -> int:
    """Owe `notice` to each recipient in the caller's transaction (its tenant is the org): an in-app row and an email
    row; the emails are enqueued on `queue` after the commit (None: the sweeper sends them). How many recipients."""
    recipients = list(dict.fromkeys(notice.recipients))
    if not recipients:
        return 0

    def row(user_id: uuid.UUID, channel: Channel) -> Notification:
        # An in-app notification is delivered by being written.
        state = "delivered" if channel is Channel.app else "pending"
        return Notification(
            id=uuid.uuid4(),
            org_id=notice.org_id,
            user_id=user_id,
            channel=channel.value,
            type=notice.type.value,
            export_id=notice.export_id,
            schedule_id=notice.schedule_id,
            import_id=notice.import_id,
            title=notice.title,
            details=notice.details,
            state=state,
        )

    # Whether an email goes is decided when it is sent (email on, still a member, that type still on), so each
    # email row is owed whatever the preference says now.
    uow.session.add_all([row(u, Channel.app) for u in recipients])
    await EMAILS.owe(uow, queue, [row(u, Channel.email) for u in recipients])
    return len(recipients)


# --- the events -----------------------------------------------------------------------------------------------


async def export_ended(
    uow: UnitOfWork,
    queue: Queue | None,
    type_: NotificationType,
    *,
    org_id: uuid.UUID,
    export_id: uuid.UUID,
    kind: str,
    creator_id: uuid.UUID,
    row_count: int | None = None,
    byte_size: int | None = None,
    expires_at: dt.datetime | None = None,
    error_code: str | None = None,
) -> int:
    """Tell an export's creator it completed, failed or was cancelled by someone else (SPEC §19)."""
    details: dict[str, Any] = {"kind": kind}
    if type_ is NotificationType.export_completed:
        details.update(rows=row_count, bytes=byte_size, expiresAt=expires_at.isoformat() if expires_at else None)
    else:
        details["errorCode"] = error_code
    name = await orgs.org_name(uow.session, org_id)
    notice = Notice(
        type=type_,
        org_id=org_id,
        recipients=[creator_id],
        title=messages.export_title(type_, kind, name),
        details=details,
        export_id=export_id,
    )
    return await notify(uow, queue, notice)


async def schedule_paused(
    uow: UnitOfWork,
    queue: Queue | None,
    *,
    org_id: uuid.UUID,
    schedule_id: uuid.UUID,
    kind: str,
    reason: str,
    failures: int,
    recipients: Sequence[uuid.UUID],
    error_code: str | None = None,
) -> int:
    """Tell a schedule's creator and the org's owners that it paused, and why (SPEC §19, §21)."""
    name = await orgs.org_name(uow.session, org_id)
    notice = Notice(
        type=NotificationType.schedule_paused,
        org_id=org_id,
        recipients=recipients,
        title=messages.schedule_paused_title(kind, name, reason),
        details={"kind": kind, "reason": reason, "failures": failures, "errorCode": error_code},
        schedule_id=schedule_id,
    )
    return await notify(uow, queue, notice)


async def deletion_requested(
    uow: UnitOfWork, queue: Queue | None, org_id: uuid.UUID, actor_id: uuid.UUID, delete_after: dt.datetime | None
) -> int:
    """Tell every owner of the org that its deletion was requested, by whom, and when it will happen."""
    session = uow.session
    owners = list(
        await session.scalars(
            select(Membership.user_id)
            .where(Membership.org_id == org_id, Membership.role == Role.owner.value)
            .order_by(Membership.created_at, Membership.id)
        )
    )
    actor = await session.scalar(select(User.name).where(User.id == actor_id))
    name = await orgs.org_name(session, org_id)
    details = {"actorName": actor, "deleteAfter": delete_after.isoformat() if delete_after else None}
    notice = Notice(
        type=NotificationType.org_deletion_requested,
        org_id=org_id,
        recipients=owners,
        title=messages.deletion_title(name),
        details=details,
    )
    return await notify(uow, queue, notice)


# --- the caller's own, across orgs ------------------------------------------------------------------------------

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_CURSOR_VERSION = 1


def encode_cursor(row_id: uuid.UUID) -> str:
    """The opaque cursor of the page after the row `row_id` (older rows): one of the caller's own rows, nothing else."""
    return cursors.encode_cursor(row_id, _CURSOR_VERSION)


def decode_cursor(cursor: str) -> uuid.UUID:
    """The row a cursor names; 400 `invalid_request` (naming `before`) for anything this service did not make."""
    row_id = cursors.decode_cursor(cursor, _CURSOR_VERSION)
    if row_id is None:
        raise _not_a_cursor()
    return row_id


def _not_a_cursor() -> InvalidRequest:
    return InvalidRequest("before: not a cursor of this list.", errors=[{"key": "before"}])


def _own(user_id: uuid.UUID) -> list[Any]:
    # RLS shows the caller only their rows of orgs they are still a member of (migration 0018); the filter is the
    # index's (notifications_user_idx), and says what is meant.
    return [Notification.user_id == user_id, Notification.channel == Channel.app.value]


async def page(session: AsyncSession, user_id: uuid.UUID, before: str | None, limit: int) -> NotificationPage:
    """The caller's in-app notifications over every org they belong to, newest first, `limit` older than `before`."""
    stmt = (
        select(Notification)
        .where(*_own(user_id))
        .order_by(Notification.created_at.desc(), Notification.id.desc())
        .limit(limit + 1)
    )
    if before is not None:
        position = (
            await session.execute(
                select(Notification.created_at, Notification.id).where(
                    *_own(user_id), Notification.id == decode_cursor(before)
                )
            )
        ).first()
        if position is None:
            raise _not_a_cursor()
        stmt = stmt.where(tuple_(Notification.created_at, Notification.id) < tuple_(position[0], position[1]))
    rows = list(await session.scalars(stmt))
    unread = await session.scalar(
        select(func.count()).select_from(Notification).where(*_own(user_id), Notification.read_at.is_(None))
    )
    more = len(rows) > limit
    return NotificationPage(
        items=[_item(n) for n in rows[:limit]],
        next=encode_cursor(rows[limit - 1].id) if more else None,
        unread=unread or 0,
    )


def _item(n: Notification) -> NotificationItem:
    return NotificationItem(
        id=n.id,
        at=n.created_at,
        type=n.type,
        org_id=n.org_id,
        export_id=n.export_id,
        schedule_id=n.schedule_id,
        import_id=n.import_id,
        title=n.title,
        read_at=n.read_at,
    )


async def mark_read(session: AsyncSession, user_id: uuid.UUID, notification_id: uuid.UUID) -> None:
    """Mark one of the caller's notifications read (again: no change); 404 when it is not theirs to see."""
    found = await session.execute(
        update(Notification)
        .where(*_own(user_id), Notification.id == notification_id)
        .values(read_at=func.coalesce(Notification.read_at, func.now()))
        .returning(Notification.id)
        .execution_options(synchronize_session=False)
    )
    if found.first() is None:
        raise NotFound()


async def mark_all_read(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Mark every unread notification of the caller read."""
    await session.execute(
        update(Notification)
        .where(*_own(user_id), Notification.read_at.is_(None))
        .values(read_at=func.now())
        .execution_options(synchronize_session=False)
    )


# --- preferences ------------------------------------------------------------------------------------------------


async def preferences(session: AsyncSession, user_id: uuid.UUID) -> Preferences:
    """Every email type and whether the caller gets it (on unless they turned it off)."""
    result = await session.execute(
        select(NotificationPreference.type, NotificationPreference.email).where(
            NotificationPreference.user_id == user_id
        )
    )
    rows = {t: on for t, on in result}
    return Preferences(email={t.value: rows.get(t.value, True) for t in NotificationType})


async def set_preferences(session: AsyncSession, user_id: uuid.UUID, data: PreferencesUpdate) -> Preferences:
    """Turn the named email types on or off (the others keep theirs); an unknown type is 400, naming it."""
    known = {t.value for t in NotificationType}
    unknown = sorted(set(data.email) - known)
    if unknown:
        raise InvalidRequest(
            f"email: unknown notification type {unknown[0]!r} (known: {', '.join(sorted(known))}).",
            errors=[{"key": f"email.{t}"} for t in unknown],
        )
    if data.email:
        stmt = insert(NotificationPreference).values(
            [{"user_id": user_id, "type": t, "email": on} for t, on in data.email.items()]
        )
        await session.execute(
            stmt.on_conflict_do_update(
                index_elements=[NotificationPreference.user_id, NotificationPreference.type],
                set_={"email": stmt.excluded.email, "updated_at": func.now()},
            )
        )
    return await preferences(session, user_id)


async def email_on(session: AsyncSession, user_id: uuid.UUID, type_: str) -> bool:
    """Whether the user gets emails of `type_` (the session's `app.user_id` must be theirs)."""
    on = await session.scalar(
        select(NotificationPreference.email).where(
            NotificationPreference.user_id == user_id, NotificationPreference.type == type_
        )
    )
    return True if on is None else bool(on)
