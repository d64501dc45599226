"""Projects (versioned, soft-deleted) and their tasks."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Computed
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, org_key, tenant_fk, updated_at, uuid_pk


class Project(Base):
    """A project; `version` counts its edits, `deleted_at` marks a soft delete."""

    __tablename__ = "projects"
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    name: Mapped[str]
    version: Mapped[int] = mapped_column(default=1)
    deleted_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = created_at()
    updated_at: Mapped[dt.datetime] = updated_at()


class Task(Base):
    """A task of a project."""

    __tablename__ = "tasks"
    __table_args__ = (tenant_fk("project_id", "projects"),)
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    project_id: Mapped[uuid.UUID]
    title: Mapped[str]
    # Migration 0014: the title holds no byte a JSON string escapes, so the snapshot writes it as it is stored.
    title_plain: Mapped[bool] = mapped_column(Computed(r"""title !~ '[\x01-\x1f"\\]'""", persisted=True), deferred=True)
    status: Mapped[str] = mapped_column(default="todo")
    due_date: Mapped[dt.date | None]
    created_at: Mapped[dt.datetime] = created_at()
    updated_at: Mapped[dt.datetime] = updated_at()
