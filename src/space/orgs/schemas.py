"""Payloads of organizations and members."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

import msgspec

from space.orgs.models import OrgState, Role
from space.schemas import Email, Input, Name, Output


class Org(Output):
    """An organization as the API shows it."""

    id: uuid.UUID
    name: str
    state: OrgState
    created_at: dt.datetime
    delete_after: dt.datetime | None


class OrgCreate(Input):
    """POST /orgs."""

    name: Name


class Member(Output):
    """A membership; `id` is the membership id (what tickets' assigneeId refers to)."""

    id: uuid.UUID
    user_id: uuid.UUID
    email: str
    name: str
    role: Role
    created_at: dt.datetime


class MemberCreate(Input):
    """POST /orgs/{orgId}/members: add an existing user by email."""

    email: Email
    role: Role


class MemberUpdate(Input):
    """PATCH /orgs/{orgId}/members/{userId}."""

    role: Role


class DeletionRequest(Input):
    """POST /orgs/{orgId}/deletion: `confirm` must equal the org's name."""

    confirm: Annotated[str, msgspec.Meta(max_length=1000)]
    skip_final_export: bool = False
