"""Notifications, one row per recipient and channel (the email rows are an outbox), and email preferences
(migration 0018); a user's own notifications of events that have no org (migration 0025)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import Computed, ForeignKey
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, updated_at
from space.outbox import Owed


class NotificationType(enum.StrEnum):
    """What people are told about (SPEC §19); every one is emailed unless its recipient turned it off.

    Schedules (§21) and imports (§23) add theirs here: the table checks the form of a type, not a list.
    """

    export_completed = "export.completed"
    export_failed = "export.failed"
    export_cancelled = "export.cancelled"
    org_deletion_requested = "org.deletion_requested"
    schedule_paused = "schedule.paused"
    import_completed = "import.completed"
    """An archive the importer uploaded was restored as an organization (SPEC §23)."""
    import_failed = "import.failed"
    """An archive the importer uploaded could not be restored (SPEC §23): no org exists, so the rows are the
    importer's own (`PersonalNotification`)."""


class Channel(enum.StrEnum):
    """In the app (delivered by being written) or by email (sent by the worker)."""

    app = "app"
    email = "email"


class Skipped(enum.StrEnum):
    """Why an email was not sent (the row's `last_error` when its state is `skipped`)."""

    email_off = "email_off"
    """SPACE_SMTP_URL is not set."""
    not_member = "not_member"
    """The recipient is no longer a member of the org."""
    preference_off = "preference_off"
    """The recipient turned this type of email off."""


SKIPPED = "skipped"
"""The state of an email row that was not sent, and never will be (`Skipped` says why)."""


class Told(Owed):
    """What every notification row holds, an org's or a person's own: one event told to one person on one channel.
    For email, a row of an outbox (`Owed`); `status` is the state as SPEC §19 names it (a pending row already tried
    reads `retrying`)."""

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    channel: Mapped[str]
    type: Mapped[str]
    import_id: Mapped[uuid.UUID | None]
    title: Mapped[str]
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    """What the email says beyond the title: kind, rows, bytes, expiry, error code (never content)."""
    read_at: Mapped[dt.datetime | None]
    status: Mapped[str] = mapped_column(
        Computed("CASE WHEN state = 'pending' AND attempts > 0 THEN 'retrying' ELSE state END")
    )
    last_error: Mapped[str | None]
    created_at: Mapped[dt.datetime] = created_at()


class Notification(Told, Base):
    """An org's event told to one of its people (migration 0018)."""

    __tablename__ = "notifications"
    org_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    export_id: Mapped[uuid.UUID | None]
    schedule_id: Mapped[uuid.UUID | None]


class PersonalNotification(Told, Base):
    """An event of no org told to one person (`import.failed`): keyed by its user instead of an org, the user's
    own row (RLS on app.user_id, like `imports`; migration 0025); for email, a row of `outbox.PERSONAL_EMAILS`."""

    __tablename__ = "personal_notifications"
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)


class NotificationPreference(Base):
    """One email type a user set (a type with no row is on)."""

    __tablename__ = "notification_preferences"
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    type: Mapped[str] = mapped_column(primary_key=True)
    email: Mapped[bool]
    updated_at: Mapped[dt.datetime] = updated_at()
