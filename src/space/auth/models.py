"""Users and their API tokens (global, not tenant rows)."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import ForeignKey
from sqlalchemy.orm import Mapped, mapped_column

from space.db.base import Base, created_at, uuid_pk


class User(Base):
    """A person who can sign in with a token."""

    __tablename__ = "users"
    id: Mapped[uuid.UUID] = uuid_pk()
    email: Mapped[str]
    name: Mapped[str]
    placeholder: Mapped[bool] = mapped_column(default=False)
    """Made by a restore for a member's email that had no user (migration 0022); claimed by `create_user`."""
    created_at: Mapped[dt.datetime] = created_at()


class ApiToken(Base):
    """A bearer token, kept only as its SHA-256."""

    __tablename__ = "api_tokens"
    id: Mapped[uuid.UUID] = uuid_pk()
    user_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    token_hash: Mapped[bytes]
    created_at: Mapped[dt.datetime] = created_at()
    revoked_at: Mapped[dt.datetime | None]
