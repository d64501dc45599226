"""Payloads of tickets."""

from __future__ import annotations

import datetime as dt
import uuid

from msgspec import UNSET, UnsetType

from space.schemas import Body, Input, Output, Title
from space.tickets.filters import Priority, TicketStatus


class Ticket(Output):
    """A ticket; `creatorId` is a user id, `assigneeId` a membership id."""

    number: int
    title: str
    body: str
    status: TicketStatus
    priority: Priority
    creator_id: uuid.UUID
    assignee_id: uuid.UUID | None
    created_at: dt.datetime
    updated_at: dt.datetime


class TicketCreate(Input):
    """POST /orgs/{orgId}/tickets."""

    title: Title
    body: Body = ""
    priority: Priority = Priority.normal


class TicketUpdate(Input):
    """PATCH /orgs/{orgId}/tickets/{number}: fields left out stay; `assigneeId: null` unassigns."""

    status: TicketStatus | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    assignee_id: uuid.UUID | UnsetType | None = UNSET


class TicketPage(Output):
    """One page of the ticket list, in number order."""

    items: list[Ticket]
    total: int
    page: int
    page_size: int
