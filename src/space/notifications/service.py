"""Notifications: `notify` owes one event to its recipients (an in-app row and an email row each) in the
transaction of the change it announces; what each event says and to whom (`export_ended`, `deletion_requested`,
`import_failed`); and the caller's own side, across orgs: the list, marking read, email preferences.

An event of an org is written to `notifications`; one of no org (`import.failed`: no org was made) to the
recipient's own `personal_notifications`, in the recipient's own context. The list reads both in one order.

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
from sqlalchemy import ColumnElement, Select, Uuid, func, literal, null, select, tuple_, union_all, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from space import cursors
from space.auth.models import User
from space.db import UnitOfWork
from space.errors import InvalidRequest, NotFound
from space.notifications import messages
from space.notifications.models import (
    Channel,
    Notification,
    NotificationPreference,
    NotificationType,
    PersonalNotification,
    Told,
)
from space.notifications.outbox import EMAILS, PERSONAL_EMAILS
from space.notifications.schemas import NotificationItem, NotificationPage, Preferences, PreferencesUpdate
from space.orgs import service as orgs
from space.orgs.models import Membership, Role


@dataclass(frozen=True)
class Notice:
    """One event to tell: its type, org, recipients, the line people read, and what an email adds.

    `org_id` None: an event of no org, told to its recipients' own rows (no export or schedule: those are an org's).
    """

    type: NotificationType
    org_id: uuid.UUID | None
    recipients: Sequence[uuid.UUID]
    title: str
    details: dict[str, Any] = field(default_factory=dict)
    export_id: uuid.UUID | None = None
    schedule_id: uuid.UUID | None = None
    import_id: uuid.UUID | None = None


async def notify(uow: UnitOfWork, queue: Queue | None, notice: Notice) -> int:
    """Owe `notice` to each recipient in the caller's transaction (its tenant is the org): an in-app row and an email
    row; the emails are enqueued on `queue` after the commit (None: the sweeper sends them). How many recipients.

    An event of no org (`org_id` None) is written to each recipient's own rows: the transaction's `app.user_id`
    must be the recipient's (RLS refuses another's)."""
    recipients = list(dict.fromkeys(notice.recipients))
    if not recipients:
        return 0
    table: type[Told]
    if notice.org_id is None:
        if notice.export_id is not None or notice.schedule_id is not None:
            raise ValueError("an event of no org names no export or schedule")
        table, outbox, keys = PersonalNotification, PERSONAL_EMAILS, {}
    else:
        table, outbox = Notification, EMAILS
        keys = {"org_id": notice.org_id, "export_id": notice.export_id, "schedule_id": notice.schedule_id}

    def row(user_id: uuid.UUID, channel: Channel) -> Told:
        # An in-app notification is delivered by being written.
        state = "delivered" if channel is Channel.app else "pending"
        return table(
            id=uuid.uuid4(),
            user_id=user_id,
            channel=channel.value,
            type=notice.type.value,
            import_id=notice.import_id,
            title=notice.title,
            details=notice.details,
            state=state,
            **keys,
        )

    # Whether an email goes is decided when it is sent (email on, still a member of the org if any, that type still
    # on), so each email row is owed whatever the preference says now.
    uow.session.add_all([row(u, Channel.app) for u in recipients])
    await outbox.owe(uow, queue, [row(u, Channel.email) for u in recipients])
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


async def import_failed(
    uow: UnitOfWork,
    queue: Queue | None,
    *,
    user_id: uuid.UUID,
    import_id: uuid.UUID,
    name: str,
    error_code: str,
) -> int:
    """Tell the importer their archive could not be restored (SPEC §19, §23): their own rows, as no org exists.
    The details hold the error code only: the import's `errorDetail` may quote the archive."""
    notice = Notice(
        type=NotificationType.import_failed,
        org_id=None,
        recipients=[user_id],
        title=messages.import_failed_title(name, error_code),
        details={"errorCode": error_code},
        import_id=import_id,
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


def _own_personal(user_id: uuid.UUID) -> list[Any]:
    # The caller's own rows of no org (migration 0025; RLS shows no one else's), by personal_notifications_user_idx.
    return [PersonalNotification.user_id == user_id, PersonalNotification.channel == Channel.app.value]


_NO_ID = null().cast(Uuid)


def _listed(user_id: uuid.UUID) -> tuple[Select[*tuple[Any, ...]], Select[*tuple[Any, ...]]]:
    """The caller's in-app rows of both tables as one shape: (at, id, type, org, export, schedule, import, title,
    read); a personal row names no org, export or schedule."""
    n, p = Notification, PersonalNotification
    ours = select(
        n.created_at.label("at"),
        n.id.label("id"),
        n.type.label("type"),
        n.org_id.label("org_id"),
        n.export_id.label("export_id"),
        n.schedule_id.label("schedule_id"),
        n.import_id.label("import_id"),
        n.title.label("title"),
        n.read_at.label("read_at"),
    ).where(*_own(user_id))
    personal = select(
        p.created_at.label("at"),
        p.id.label("id"),
        p.type.label("type"),
        _NO_ID.label("org_id"),
        _NO_ID.label("export_id"),
        _NO_ID.label("schedule_id"),
        p.import_id.label("import_id"),
        p.title.label("title"),
        p.read_at.label("read_at"),
    ).where(*_own_personal(user_id))
    return ours, personal


async def page(session: AsyncSession, user_id: uuid.UUID, before: str | None, limit: int) -> NotificationPage:
    """The caller's in-app notifications over every org they belong to, and their own of no org, newest first (one
    order over both: created_at, then id), `limit` older than `before`."""
    ours, personal = _listed(user_id)
    n, p = Notification, PersonalNotification
    if before is not None:
        row_id = decode_cursor(before)
        position = (
            await session.execute(
                union_all(
                    select(n.created_at, n.id).where(*_own(user_id), n.id == row_id),
                    select(p.created_at, p.id).where(*_own_personal(user_id), p.id == row_id),
                )
            )
        ).first()
        if position is None:
            raise _not_a_cursor()
        after: tuple[ColumnElement[Any], ColumnElement[Any]] = (literal(position[0]), literal(position[1], Uuid))
        ours = ours.where(tuple_(n.created_at, n.id) < tuple_(*after))
        personal = personal.where(tuple_(p.created_at, p.id) < tuple_(*after))
    # Each table's newest `limit + 1` by its own index, then the newest of both.
    parts = [
        q.order_by(order.created_at.desc(), order.id.desc()).limit(limit + 1).subquery()
        for q, order in ((ours, n), (personal, p))
    ]
    both = union_all(*(select(part) for part in parts)).subquery()
    rows = (await session.execute(select(both).order_by(both.c.at.desc(), both.c.id.desc()).limit(limit + 1))).all()
    unread = await session.scalar(
        select(
            select(func.count()).select_from(n).where(*_own(user_id), n.read_at.is_(None)).scalar_subquery()
            + select(func.count()).select_from(p).where(*_own_personal(user_id), p.read_at.is_(None)).scalar_subquery()
        )
    )
    more = len(rows) > limit
    return NotificationPage(
        items=[_item(r) for r in rows[:limit]],
        next=encode_cursor(rows[limit - 1].id) if more else None,
        unread=unread or 0,
    )


def _item(r: Any) -> NotificationItem:
    return NotificationItem(
        id=r.id,
        at=r.at,
        type=r.type,
        org_id=r.org_id,
        export_id=r.export_id,
        schedule_id=r.schedule_id,
        import_id=r.import_id,
        title=r.title,
        read_at=r.read_at,
    )


async def mark_read(session: AsyncSession, user_id: uuid.UUID, notification_id: uuid.UUID) -> None:
    """Mark one of the caller's notifications read (again: no change); 404 when it is not theirs to see."""
    for table, own in ((Notification, _own), (PersonalNotification, _own_personal)):
        found = await session.execute(
            update(table)
            .where(*own(user_id), table.id == notification_id)
            .values(read_at=func.coalesce(table.read_at, func.now()))
            .returning(table.id)
            .execution_options(synchronize_session=False)
        )
        if found.first() is not None:
            return
    raise NotFound()


async def mark_all_read(session: AsyncSession, user_id: uuid.UUID) -> None:
    """Mark every unread notification of the caller read (an org's and their own)."""
    for table, own in ((Notification, _own), (PersonalNotification, _own_personal)):
        await session.execute(
            update(table)
            .where(*own(user_id), table.read_at.is_(None))
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
