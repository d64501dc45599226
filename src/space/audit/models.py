"""The audit trail's one table. The app role may insert and read rows, never change or delete them."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import FetchedValue, ForeignKey
from sqlalchemy.dialects.postgresql import INET, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, org_key, uuid_pk


class AuditAction(enum.StrEnum):
    """What an audit row records (SPEC §12, and `export.deleted` for a result its owner or an admin removed)."""

    export_requested = "export.requested"
    export_completed = "export.completed"
    export_failed = "export.failed"
    export_cancelled = "export.cancelled"
    export_deleted = "export.deleted"
    export_link_created = "export.link_created"
    export_downloaded = "export.downloaded"
    member_added = "member.added"
    member_role_changed = "member.role_changed"
    member_removed = "member.removed"
    org_suspended = "org.suspended"
    org_reactivated = "org.reactivated"
    org_deletion_requested = "org.deletion_requested"
    org_deletion_cancelled = "org.deletion_cancelled"


class AuditEvent(Base):
    """One recorded action; `seq` orders the trail (rows of one transaction may share `at`)."""

    __tablename__ = "audit_events"
    id: Mapped[uuid.UUID] = uuid_pk()
    seq: Mapped[int] = mapped_column(server_default=FetchedValue())
    org_id: Mapped[uuid.UUID] = org_key()
    at: Mapped[dt.datetime] = mapped_column(server_default=FetchedValue())
    actor_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    action: Mapped[str]
    target_type: Mapped[str]
    target_id: Mapped[str]
    ip: Mapped[str | None] = mapped_column(INET)
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
