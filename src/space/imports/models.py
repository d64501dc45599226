"""The imports table (migration 0022): one upload and its restore, the importer's own row (RLS on app.user_id)."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import ForeignKey, LargeBinary
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at


class ImportState(enum.StrEnum):
    """Where an import is: waiting, restoring, done (with its report) or failed (with its errorCode)."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"


class Import(Base):
    """An uploaded archive and what became of it; `org_id` names the org only once a restore completed."""

    __tablename__ = "imports"

    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    name: Mapped[str]
    state: Mapped[str] = mapped_column(default=ImportState.queued.value)
    progress: Mapped[int] = mapped_column(default=0)
    phase: Mapped[str | None]
    dry_run: Mapped[bool] = mapped_column(default=False)
    new_ids: Mapped[bool] = mapped_column(default=False)
    org_id: Mapped[uuid.UUID | None] = mapped_column("restored_org_id")
    """The org the restore made (the column is `restored_org_id`: the row is the importer's, not a tenant row)."""
    report: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error_code: Mapped[str | None]
    error_detail: Mapped[str | None]
    byte_size: Mapped[int]
    created_at: Mapped[dt.datetime] = created_at()
    completed_at: Mapped[dt.datetime | None]


class ImportChunk(Base):
    """A piece of an uploaded archive, kept until its restore ends (migration 0022)."""

    __tablename__ = "import_chunks"

    user_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    import_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)
