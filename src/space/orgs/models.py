"""Organizations and memberships."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import ForeignKey
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, org_key, updated_at, uuid_pk


class OrgState(enum.StrEnum):
    """Lifecycle states (SPEC §3)."""

    active = "active"
    suspended = "suspended"
    deleting = "deleting"
    deleted = "deleted"


class Role(enum.StrEnum):
    """Membership roles; staff are owner, admin and member."""

    owner = "owner"
    admin = "admin"
    member = "member"
    customer = "customer"

    @property
    def is_staff(self) -> bool:
        """Owners, admins and members are staff; customers are not."""
        return self is not Role.customer


class Organization(Base):
    """A tenant. Its row doubles as the org lock (SELECT ... FOR NO KEY UPDATE, `orgs.service.lock_org`)."""

    __tablename__ = "organizations"
    id: Mapped[uuid.UUID] = uuid_pk()
    name: Mapped[str]
    state: Mapped[str] = mapped_column(default=OrgState.active.value)
    previous_state: Mapped[str | None]
    delete_after: Mapped[dt.datetime | None]
    deleted_at: Mapped[dt.datetime | None]
    purged_counts: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    created_by: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("users.id"))
    """Who created it (migration 0015): SPACE_ORGS_PER_USER counts it for them, whatever their role now."""
    created_at: Mapped[dt.datetime] = created_at()
    updated_at: Mapped[dt.datetime] = updated_at()


class Membership(Base):
    """A user's role in one organization."""

    __tablename__ = "memberships"
    id: Mapped[uuid.UUID] = uuid_pk()
    org_id: Mapped[uuid.UUID] = org_key()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id"))
    role: Mapped[str]
    created_at: Mapped[dt.datetime] = created_at()
