"""An org's destinations and the deliveries owed to them (migration 0023). Both tables are keyed (org_id, id)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid

from sqlalchemy import ForeignKey, ForeignKeyConstraint
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at
from space.outbox import Owed


class DestinationType(enum.StrEnum):
    """Where a destination's objects go; each is a module and a row of `stores.STORES`."""

    s3 = "s3"


class DeliveryState(enum.StrEnum):
    """The export's `delivery.state` (SPEC §22): the outbox's states as §22 names them."""

    pending = "pending"
    delivering = "delivering"
    delivered = "delivered"
    failed = "failed"


OUTBOX_TO_DELIVERY = {
    "pending": DeliveryState.pending,
    "sending": DeliveryState.delivering,
    "delivered": DeliveryState.delivered,
    "failed": DeliveryState.failed,
}


class Destination(Base):
    """A bucket an org's owners or admins registered; `secret_sealed` is the sealed secret, never the secret."""

    __tablename__ = "destinations"
    org_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    type: Mapped[str]
    bucket: Mapped[str]
    prefix: Mapped[str] = mapped_column(default="")
    region: Mapped[str | None]
    endpoint_url: Mapped[str | None]
    access_key_id: Mapped[str]
    secret_sealed: Mapped[bytes]
    created_by: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = created_at()
    last_delivery_at: Mapped[dt.datetime | None]
    last_error: Mapped[str | None]


class DestinationDelivery(Owed, Base):
    """One export owed to one destination: a row of the deliveries' outbox (`Owed`)."""

    __tablename__ = "destination_deliveries"
    __table_args__ = (ForeignKeyConstraint(["org_id", "destination_id"], ["destinations.org_id", "destinations.id"]),)
    org_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    export_id: Mapped[uuid.UUID]
    destination_id: Mapped[uuid.UUID | None]
    schedule_id: Mapped[uuid.UUID | None]
    delivered_at: Mapped[dt.datetime | None]
    error_code: Mapped[str | None]
    last_error: Mapped[str | None]
    created_by: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = created_at()
