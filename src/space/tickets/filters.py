"""The one ticket filter builder: the list endpoint and the CSV export build their WHERE clause here."""

from __future__ import annotations

import enum
import uuid
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, or_

from space.errors import InvalidRequest
from space.schemas import Input, Query
from space.tickets.models import Ticket


class TicketStatus(enum.StrEnum):
    """Ticket states."""

    open = "open"
    pending = "pending"
    solved = "solved"
    closed = "closed"


class Priority(enum.StrEnum):
    """Ticket priorities."""

    low = "low"
    normal = "normal"
    high = "high"
    urgent = "urgent"


class Assignment(enum.StrEnum):
    """`mine` = assigned to the caller's membership; `unassigned`; `all`."""

    mine = "mine"
    unassigned = "unassigned"
    all = "all"


class TicketFilters(Input, omit_defaults=True):
    """Filters as submitted; stored verbatim on a CSV export."""

    status: TicketStatus | None = None
    priority: Priority | None = None
    assignment: Assignment | None = None
    q: Query | None = None


def parse_filters(raw: dict[str, Any]) -> TicketFilters:
    """Validate filters given as plain values (query string or stored JSON); 400 names the field."""
    try:
        return msgspec.convert(raw, TicketFilters, strict=False)
    except msgspec.ValidationError as exc:
        # Same shape as Litestar's own validation errors: "field: message" plus an errors list.
        message, _, path = str(exc).rpartition(" - at `$")
        field = path.rstrip("`").lstrip(".") if message else ""
        if not field:
            raise InvalidRequest(f"filters: {exc}") from None
        raise InvalidRequest(f"{field}: {message}", errors=[{"key": field, "message": message}]) from None


def _like_escape(q: str) -> str:
    return q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def like_pattern(q: str) -> str:
    """The ILIKE pattern (backslash escapes) that finds `q` anywhere in a text."""
    return f"%{_like_escape(q)}%"


def ticket_conditions(filters: TicketFilters, membership_id: uuid.UUID | None) -> list[ColumnElement[bool]]:
    """WHERE conditions for `filters`. `membership_id` is the caller's (for assignment=mine).

    Tenant and customer scoping are not here: RLS enforces them, and callers add `org_id = :org` so the
    planner can use the index.
    """
    conds: list[ColumnElement[bool]] = []
    if filters.status is not None:
        conds.append(Ticket.status == filters.status.value)
    if filters.priority is not None:
        conds.append(Ticket.priority == filters.priority.value)
    if filters.assignment is Assignment.mine:
        conds.append(Ticket.assignee_id == membership_id if membership_id else Ticket.id.is_(None))
    elif filters.assignment is Assignment.unassigned:
        conds.append(Ticket.assignee_id.is_(None))
    if filters.q:
        pattern = like_pattern(filters.q)
        conds.append(or_(Ticket.title.ilike(pattern, escape="\\"), Ticket.body.ilike(pattern, escape="\\")))
    return conds
