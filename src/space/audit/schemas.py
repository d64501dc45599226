"""Payloads of the audit trail: `{"items": [...], "next": cursor | null}`, newest first."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from space.schemas import Output


class AuditActor(Output):
    """Who acted (null for the system: the worker, the purge)."""

    user_id: uuid.UUID
    name: str


class AuditTarget(Output):
    """What the action was about: an export, a user (member actions) or the org."""

    type: str
    id: str
    name: str | None = None
    """The user's name (a `user` target) or the org's (an `org` target), so a reader needs no id; null when gone."""
    kind: str | None = None
    """The export's kind (an `export` target); null otherwise or when the export is gone."""


class AuditItem(Output):
    """One audit row as the API shows it."""

    id: uuid.UUID
    at: dt.datetime
    actor: AuditActor | None
    action: str
    target: AuditTarget
    ip: str | None
    details: dict[str, Any]


class AuditPage(Output):
    """A page of the trail; `next` is the cursor of the following (older) page, or null at its end."""

    items: list[AuditItem]
    next: str | None
