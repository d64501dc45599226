"""Webhook endpoints, the deliveries owed to them, and each HTTP attempt (migration 0009)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

from sqlalchemy import ForeignKey, Text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, org_key, tenant_fk, uuid_pk
from space.outbox import Owed


class EventType(enum.StrEnum):
    """What an endpoint can subscribe to (SPEC §12)."""

    export_completed = "export.completed"
    export_failed = "export.failed"
    org_deletion_requested = "org.deletion_requested"


class WebhookEndpoint(Base):
    """A URL an org's admins registered, the events it wants, and the secret its deliveries are signed with."""

    __tablename__ = "webhook_endpoints"
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    url: Mapped[str]
    events: Mapped[list[str]] = mapped_column(ARRAY(Text))
    secret: Mapped[str]
    created_by: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = created_at()


class WebhookDelivery(Owed, Base):
    """One event owed to one endpoint, a row of the deliveries' outbox (`Owed`: state, attempts, next attempt,
    lease); `body` is the exact payload signed and sent at every attempt."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (tenant_fk("endpoint_id", "webhook_endpoints", ondelete="CASCADE"),)
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    endpoint_id: Mapped[uuid.UUID]
    event_id: Mapped[uuid.UUID]
    event_type: Mapped[str]
    body: Mapped[str]
    created_at: Mapped[dt.datetime] = created_at()


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: the deliveries log."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (
        tenant_fk("endpoint_id", "webhook_endpoints", ondelete="CASCADE"),
        tenant_fk("delivery_id", "webhook_deliveries", ondelete="CASCADE"),
    )
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    endpoint_id: Mapped[uuid.UUID]
    delivery_id: Mapped[uuid.UUID]
    attempt: Mapped[int]
    at: Mapped[dt.datetime] = created_at()
    status: Mapped[str]
    response_code: Mapped[int | None]
    error: Mapped[str | None]
