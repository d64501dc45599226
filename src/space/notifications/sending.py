"""One attempt of one email, top to bottom: claim -> check the recipient again -> compose -> send -> settle.

The claim and the check are one transaction (the org's tenant, then the recipient's for their preferences): a
recipient who is no longer a member, or who turned that type off, or an installation without SPACE_SMTP_URL,
ends the row `skipped` there, and nothing is sent. No transaction is open while the SMTP session runs. The
claim, the fenced settle, the backoff and the next entry are the outbox's (`space.outbox`); an SMTP 4xx answer or
a connection that fails is tried again, a 5xx answer ends the row `failed`. Nothing here touches an export.

A user's own notification of no org (`personal_notifications`, `send_personal_email`) is claimed from its own
outbox in the user's context; with no org there is no membership to check, only SPACE_SMTP_URL and the
preference. From the claim on, both are one path: compose, send, settle.
"""

from __future__ import annotations

import email.errors
import logging
import uuid
from dataclasses import dataclass
from typing import NamedTuple

from saq import Queue
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from space.auth.models import User
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.notifications import messages, service
from space.notifications.messages import Letter
from space.notifications.models import SKIPPED, Notification, NotificationType, PersonalNotification, Skipped
from space.notifications.outbox import EMAILS, PERSONAL_EMAILS
from space.notifications.smtp import Answer, parse_mail_from, parse_smtp_url, send
from space.orgs import service as orgs
from space.outbox import Outbox

log = logging.getLogger("space.notifications")


class Recipient(NamedTuple):
    """Who an email goes to, read when it is sent."""

    name: str
    email: str


@dataclass(frozen=True)
class Claimed:
    """An attempt this worker now owns: which try, and the letter to send; `box` and `scope_id` name its row (its
    org's, or for a row of no org its user's), `tenant` is the context its settle runs in."""

    notification_id: uuid.UUID
    scope_id: uuid.UUID
    user_id: uuid.UUID
    attempt: int
    letter: Letter
    box: Outbox = EMAILS
    tenant: Tenant | None = None

    @property
    def context(self) -> Tenant:
        """The RLS context of its row: the org's, unless one was given."""
        return self.tenant if self.tenant is not None else Tenant(org_id=self.scope_id)


async def send_email(
    settings: Settings, db: Database, queue: Queue | None, notification_id: uuid.UUID, org_id: uuid.UUID
) -> str:
    """Make the email's next attempt; returns delivered, retrying, failed, skipped or not_claimed."""
    return await _send(settings, db, queue, await claim(settings, db, notification_id, org_id))


async def send_personal_email(
    settings: Settings, db: Database, queue: Queue | None, notification_id: uuid.UUID, user_id: uuid.UUID
) -> str:
    """Make the next attempt of the email of a user's own notification (no org); the same answers."""
    return await _send(settings, db, queue, await claim_personal(settings, db, notification_id, user_id))


async def _send(settings: Settings, db: Database, queue: Queue | None, claimed: Claimed | str) -> str:
    if not isinstance(claimed, Claimed):
        return claimed
    assert settings.smtp_url is not None  # claim skips every row otherwise
    target = parse_smtp_url(settings.smtp_url)
    mail_from = parse_mail_from(settings.mail_from)
    try:
        message = messages.compose(claimed.letter, public_base=settings.public_base, mail_from=mail_from)
    except (ValueError, email.errors.MessageError) as exc:
        # An address the email package can't write (users' addresses are only loosely checked): no retry helps.
        answer = Answer(ok=False, error=f"not sendable: {exc}"[:500], final=True)
    else:
        answer = await send(target, message, mail_from[1], claimed.letter.recipient_email)
    return await settle(settings, db, queue, claimed, answer, shown=target.shown)


async def claim(settings: Settings, db: Database, notification_id: uuid.UUID, org_id: uuid.UUID) -> Claimed | str:
    """Take the next attempt (`EMAILS.claim`) and check the recipient again: a Claimed to send, else what became of
    the row (not_claimed: done, or another worker has it; skipped)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        row = await EMAILS.claim(
            session,
            notification_id,
            org_id,
            Notification.user_id,
            Notification.type,
            Notification.export_id,
            Notification.title,
            Notification.details,
            Notification.created_at,
            org_concurrency=settings.outbound_org_concurrency,
        )
        if row is None:
            return "not_claimed"
        attempt, user_id, type_, export_id, title, details, created_at = row
        # The recipient's own context: their preferences are theirs to read (migration 0018).
        await uow.retenant(Tenant(org_id=org_id, user_id=user_id))
        user = await _recipient(settings, session, EMAILS, notification_id, org_id, org_id, user_id, attempt, type_)
        if not isinstance(user, Skipped):
            org_name = await orgs.org_name(session, org_id)
    if isinstance(user, Skipped):
        return _skipped(EMAILS, notification_id, user_id, user)
    letter = Letter(
        notification_id=notification_id,
        type=NotificationType(type_),
        org_id=org_id,
        org_name=org_name,
        export_id=export_id,
        title=title,
        details=details,
        at=created_at,
        recipient_name=user.name,
        recipient_email=user.email,
    )
    return Claimed(notification_id, org_id, user_id, attempt, letter)


async def claim_personal(
    settings: Settings, db: Database, notification_id: uuid.UUID, user_id: uuid.UUID
) -> Claimed | str:
    """Take the next attempt of a user's own email (`PERSONAL_EMAILS.claim`, in the user's context) and check again
    that email is on and that type is still on (there is no org, so no membership): a Claimed, or what became of
    the row."""
    tenant = Tenant(user_id=user_id)
    p = PersonalNotification
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        session = uow.session
        row = await PERSONAL_EMAILS.claim(
            session,
            notification_id,
            user_id,
            p.type,
            p.import_id,
            p.title,
            p.details,
            p.created_at,
            org_concurrency=settings.outbound_org_concurrency,
        )
        if row is None:
            return "not_claimed"
        attempt, type_, import_id, title, details, created_at = row
        user = await _recipient(
            settings, session, PERSONAL_EMAILS, notification_id, user_id, None, user_id, attempt, type_
        )
    if isinstance(user, Skipped):
        return _skipped(PERSONAL_EMAILS, notification_id, user_id, user)
    letter = Letter(
        notification_id=notification_id,
        type=NotificationType(type_),
        org_id=None,
        org_name="",
        export_id=None,
        title=title,
        details=details,
        at=created_at,
        recipient_name=user.name,
        recipient_email=user.email,
        import_id=import_id,
    )
    return Claimed(notification_id, user_id, user_id, attempt, letter, box=PERSONAL_EMAILS, tenant=tenant)


async def _recipient(
    settings: Settings,
    session: AsyncSession,
    box: Outbox,
    notification_id: uuid.UUID,
    scope_id: uuid.UUID,
    org_id: uuid.UUID | None,
    user_id: uuid.UUID,
    attempt: int,
    type_: str,
) -> Recipient | Skipped:
    """The recipient's name and email when the email is still to go; else why not, the row settled `skipped` in
    the claim's transaction."""
    reason = await _why_not(settings, session, org_id, user_id, type_)
    if reason is not None:
        await _skip(session, box, notification_id, scope_id, attempt, reason)
        return reason
    name, email = (await session.execute(select(User.name, User.email).where(User.id == user_id))).one()
    return Recipient(name, email)


def _skipped(box: Outbox, notification_id: uuid.UUID, user_id: uuid.UUID, reason: Skipped) -> str:
    """Say (once the claim's transaction committed) that an email was skipped, and why."""
    log.info("%s %s to user %s skipped: %s", box.noun, notification_id, user_id, reason.value)
    return SKIPPED


async def _why_not(
    settings: Settings, session: AsyncSession, org_id: uuid.UUID | None, user_id: uuid.UUID, type_: str
) -> Skipped | None:
    if settings.smtp_url is None:
        return Skipped.email_off
    if org_id is not None and await orgs.membership_of(session, org_id, user_id) is None:
        return Skipped.not_member
    if not await service.email_on(session, user_id, type_):
        return Skipped.preference_off
    return None


async def _skip(
    session: AsyncSession,
    box: Outbox,
    notification_id: uuid.UUID,
    scope_id: uuid.UUID,
    attempt: int,
    reason: Skipped,
) -> None:
    # Fenced like a settle: only the attempt this transaction claimed is skipped.
    t = box.table
    await session.execute(
        update(t)
        .where(*box.this_row(notification_id, scope_id), t.attempts == attempt, t.state == "sending")
        .values(state=SKIPPED, lease_expires_at=None, finished_at=text("clock_timestamp()"), last_error=reason.value)
        .execution_options(synchronize_session=False)
    )


async def settle(
    settings: Settings, db: Database, queue: Queue | None, claimed: Claimed, answer: Answer, *, shown: str
) -> str:
    """Move the row on after the attempt (delivered; failed on a 5xx or the last attempt; else pending until its
    backoff), fenced by the attempt, and enqueue the next one."""
    box = claimed.box
    async with UnitOfWork(db.sessionmaker, claimed.context) as uow:
        settled = await box.settle(
            uow.session,
            claimed.notification_id,
            claimed.scope_id,
            claimed.attempt,
            ok=answer.ok,
            final=answer.final,
            retry_base=settings.mail_retry_seconds,
        )
        if settled is None:
            return "not_claimed"
        if answer.error is not None:
            await uow.session.execute(
                update(box.table)
                .where(*box.this_row(claimed.notification_id, claimed.scope_id))
                .values(last_error=answer.error)
                .execution_options(synchronize_session=False)
            )
    level = logging.INFO if answer.ok else logging.WARNING
    log.log(
        level,
        "%s %s to user %s via %s, attempt %d: %s%s",
        box.noun,
        claimed.notification_id,
        claimed.user_id,
        shown,
        claimed.attempt,
        settled.result,
        f" ({answer.error})" if answer.error else "",
    )
    if settled.retrying and queue is not None:
        await box.enqueue(
            queue, claimed.notification_id, claimed.scope_id, attempt=claimed.attempt + 1, delay=settled.delay
        )
    return settled.result
