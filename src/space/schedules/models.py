"""A schedule: one org's recurring export request and its state (migration 0021)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import ForeignKey
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at


class Every(enum.StrEnum):
    """A schedule's cadence, in UTC."""

    hour = "hour"
    day = "day"
    week = "week"


class PausedReason(enum.StrEnum):
    """Why a schedule does not run: its managers paused it, its runs kept failing, its creator lost the role, or
    its destination refused a delivery (SPEC §22)."""

    user = "user"
    failing = "failing"
    access_revoked = "access_revoked"
    destination_failed = "destination_failed"


FAILURES_TO_PAUSE = 3
"""Consecutive failed runs after which a schedule pauses (`failing`)."""


class Schedule(Base):
    """One recurring export, keyed `(org_id, id)`; its runs are export_jobs rows with its `schedule_id`."""

    __tablename__ = "schedules"
    org_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("organizations.id"), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    kind: Mapped[str]
    filters: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    delimiter: Mapped[str] = mapped_column(default=",")
    every: Mapped[str]
    at_minute: Mapped[int] = mapped_column(default=0)
    """Minutes after midnight UTC (day and week)."""
    weekday: Mapped[int | None]
    """ISO weekday, 1 (Monday) to 7 (week only)."""
    incremental: Mapped[bool] = mapped_column(default=False)
    destination_id: Mapped[uuid.UUID | None]
    """Where runs are delivered (SPEC §22): a destination of the same org (foreign key `(org_id, destination_id)`)."""
    paused: Mapped[bool] = mapped_column(default=False)
    paused_reason: Mapped[str | None]
    consecutive_failures: Mapped[int] = mapped_column(default=0)
    created_by: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[dt.datetime] = created_at()
    next_run_at: Mapped[dt.datetime]
    last_run_at: Mapped[dt.datetime | None]
    last_export_id: Mapped[uuid.UUID | None]
