"""Declarative base shared by every domain's models. The schema itself is written in migrations/."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import DateTime, ForeignKey, ForeignKeyConstraint, MetaData, Uuid, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Models map tables; migrations own DDL, roles, grants and policies."""

    metadata = MetaData()
    type_annotation_map = {dt.datetime: DateTime(timezone=True), uuid.UUID: Uuid}


def uuid_pk() -> Mapped[uuid.UUID]:
    """A UUID primary key made by the application (so the tenant context can be set before insert)."""
    return mapped_column(primary_key=True, default=uuid.uuid4)


def org_key() -> Mapped[uuid.UUID]:
    """A tenant row's `org_id`: the first column of its primary key (SPEC §28, migration 0020), so each org's rows
    are keyed, made unique and joined together, as an engine distributing them by organization requires."""
    return mapped_column(ForeignKey("organizations.id"), primary_key=True)


def tenant_fk(columns: str, parent: str, ondelete: str | None = None) -> ForeignKeyConstraint:
    """A foreign key to another tenant table, carrying `org_id` on both sides: `tenant_fk("project_id",
    "projects")` is `(org_id, project_id) REFERENCES projects (org_id, id)`."""
    return ForeignKeyConstraint(["org_id", columns], [f"{parent}.org_id", f"{parent}.id"], ondelete=ondelete)


def created_at() -> Mapped[dt.datetime]:
    """Creation time from the database clock."""
    return mapped_column(server_default=func.now())


def updated_at() -> Mapped[dt.datetime]:
    """Last change, from the database clock."""
    return mapped_column(server_default=func.now(), onupdate=func.now())
