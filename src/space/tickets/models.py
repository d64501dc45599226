"""Support tickets, numbered per organization."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Computed, ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, org_key, tenant_fk, updated_at, uuid_pk


class Ticket(Base):
    """A ticket; `creator_id` is a user id, `assignee_id` a membership id."""

    __tablename__ = "tickets"
    __table_args__ = (tenant_fk("assignee_id", "memberships", ondelete="SET NULL"),)
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    number: Mapped[int]
    title: Mapped[str]
    body: Mapped[str] = mapped_column(default="")
    status: Mapped[str] = mapped_column(default="open")
    priority: Mapped[str] = mapped_column(default="normal")
    creator_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    assignee_id: Mapped[uuid.UUID | None]
    created_at: Mapped[dt.datetime] = created_at()
    updated_at: Mapped[dt.datetime] = updated_at()
    # The CSV export's text, kept by PostgreSQL on every write (migration 0004); only the export reads them.
    csv_head: Mapped[str] = mapped_column(
        Computed("space_csv_head(number, title, status, priority)", persisted=True), deferred=True
    )
    csv_tail: Mapped[str] = mapped_column(
        Computed("space_csv_tail(created_at, updated_at)", persisted=True), deferred=True
    )


class TicketCounter(Base):
    """The last ticket number handed out per org (a row of its own, so numbering never waits on the org lock)."""

    __tablename__ = "ticket_counters"
    org_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    last_number: Mapped[int] = mapped_column(default=0)
