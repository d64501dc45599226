"""Declarative base shared by every domain's models. The schema itself is written in migrations/."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import DateTime, MetaData, Uuid, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Models map tables; migrations own DDL, roles, grants and policies."""

    metadata = MetaData()
    type_annotation_map = {dt.datetime: DateTime(timezone=True), uuid.UUID: Uuid}


def uuid_pk() -> Mapped[uuid.UUID]:
    """A UUID primary key made by the application (so the tenant context can be set before insert)."""
    return mapped_column(primary_key=True, default=uuid.uuid4)


def created_at() -> Mapped[dt.datetime]:
    """Creation time from the database clock."""
    return mapped_column(server_default=func.now())


def updated_at() -> Mapped[dt.datetime]:
    """Last change, from the database clock."""
    return mapped_column(server_default=func.now(), onupdate=func.now())
