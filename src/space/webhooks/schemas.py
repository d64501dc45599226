"""Payloads of webhooks: the endpoint as created (with its secret, once) and listed, the log, the event body."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated

import msgspec

from space.schemas import Input, Output
from space.webhooks.models import EventType

WebhookUrl = Annotated[str, msgspec.Meta(min_length=1, max_length=2000, pattern=r"^[^\x00-\x20\x7f]+$")]


class WebhookCreate(Input):
    """`{url, events}`: where to send, and which events (at least one, each named once)."""

    url: WebhookUrl
    events: Annotated[list[EventType], msgspec.Meta(min_length=1, max_length=len(EventType))]


class Webhook(Output):
    """An endpoint as listed: never its secret."""

    id: uuid.UUID
    url: str
    events: list[EventType]
    created_at: dt.datetime


class WebhookCreated(Webhook):
    """The endpoint right after creation, with the secret shown this once."""

    secret: str


class DeliveryAttempt(Output):
    """One attempt of the deliveries log: which event, which try, and how the receiver answered."""

    id: uuid.UUID
    delivery_id: uuid.UUID
    event_id: uuid.UUID
    type: EventType
    attempt: int
    at: dt.datetime
    status: str
    response_code: int | None
    error: str | None


class EventData(Output, omit_defaults=True):
    """`data` of an event: the org, and for exports which one and how it ended. Never content or links."""

    org_id: uuid.UUID
    export_id: uuid.UUID | None = None
    kind: str | None = None
    state: str | None = None
    error_code: str | None = None


class Event(Output):
    """The body every delivery sends (SPEC §12)."""

    id: uuid.UUID
    type: EventType
    created_at: dt.datetime
    data: EventData
