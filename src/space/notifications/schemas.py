"""Payloads of /me/notifications and /me/preferences."""

from __future__ import annotations

import datetime as dt
import uuid

from space.schemas import Input, Output


class NotificationItem(Output, omit_defaults=True):
    """One in-app notification: what happened, where (`orgId` null: an event of no org, such as an import that
    failed, with its `importId`), and whether the caller has read it."""

    id: uuid.UUID
    at: dt.datetime
    type: str
    org_id: uuid.UUID | None
    title: str
    read_at: dt.datetime | None
    export_id: uuid.UUID | None = None
    schedule_id: uuid.UUID | None = None
    import_id: uuid.UUID | None = None


class NotificationPage(Output):
    """A page of the caller's notifications, newest first; `next` is the cursor of the older page (null at the
    end); `unread` counts every unread one, on every page."""

    items: list[NotificationItem]
    next: str | None
    unread: int


class Preferences(Output):
    """Which notifications the caller gets by email: every type, on unless turned off."""

    email: dict[str, bool]


class PreferencesUpdate(Input):
    """Turn email types on or off; types not named keep their setting."""

    email: dict[str, bool]
