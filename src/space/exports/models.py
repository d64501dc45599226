"""The export ledger and its stored result chunks."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import ForeignKey, Integer
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, org_key, tenant_fk, uuid_pk
from space.exports.snapshots import PgSnapshot


class ExportState(enum.StrEnum):
    """States of an export job (SPEC §5)."""

    queued = "queued"
    running = "running"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class ExportScope(enum.StrEnum):
    """`own`: only the creator's tickets (customers); `team`: what staff see. Fixed at creation."""

    own = "own"
    team = "team"


ACTIVE_STATES = frozenset({ExportState.queued, ExportState.running})
FAILED_STATES = frozenset({ExportState.failed, ExportState.cancelled})


class ExportJob(Base):
    """The ledger row of one export. SAQ's job row is transport only; this row is the truth."""

    __tablename__ = "export_jobs"
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    creator_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    kind: Mapped[str]
    state: Mapped[str] = mapped_column(default=ExportState.queued.value)
    progress: Mapped[int] = mapped_column(default=0)
    error_code: Mapped[str | None]
    error_detail: Mapped[str | None]
    """A failure's words for the owner: which limit it passed and the setting that raises it (migration 0016)."""
    filters: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    delimiter: Mapped[str] = mapped_column(default=",")
    scope: Mapped[str]
    attempt: Mapped[int] = mapped_column(default=0)
    execution_id: Mapped[uuid.UUID | None]
    lease_expires_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = created_at()
    started_at: Mapped[dt.datetime | None]
    snapshot_at: Mapped[dt.datetime | None]
    completed_at: Mapped[dt.datetime | None]
    expires_at: Mapped[dt.datetime | None]
    purged_at: Mapped[dt.datetime | None]
    deleted_at: Mapped[dt.datetime | None]
    """Set when the owner deletes a finished export: hidden from the API, still counted by the rate limit."""
    row_count: Mapped[int | None]
    byte_size: Mapped[int | None]
    sha256: Mapped[str | None]
    schedule_id: Mapped[uuid.UUID | None]
    """The schedule that made this export (SPEC §21; migration 0021), or None: a person asked for it."""
    incremental: Mapped[bool] = mapped_column(default=False)
    """Holds only what changed since the schedule's previous successful run (`since`, `since_export_id`)."""
    since: Mapped[dt.datetime | None]
    since_export_id: Mapped[uuid.UUID | None]
    xact_snapshot: Mapped[str | None] = mapped_column(PgSnapshot())
    """The database snapshot the run read (`pg_snapshot`, as text): where the next incremental run begins."""
    xact_database: Mapped[int | None]
    """The oid of the database that snapshot belongs to (a restored database has another: its next run is complete)."""


class ExportChunk(Base):
    """One piece of an execution's bytes; only the published execution's chunks are ever served."""

    __tablename__ = "export_chunks"
    __table_args__ = (tenant_fk("export_id", "export_jobs"),)
    export_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    execution_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)
    org_id: Mapped[uuid.UUID] = org_key()
    data: Mapped[bytes]
    codec: Mapped[str | None]
    """How `data` is packed (migration 0013): None as it is, `lz4` one lz4 frame."""
    raw_size: Mapped[int | None]
    """The chunk's bytes once expanded (None when not packed)."""
    blocks: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    """Where each 64 KiB block of a packed chunk's frame starts (migration 0024; None: read it from its start)."""
