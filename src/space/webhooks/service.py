"""Webhook endpoints (create, list, delete, their log) and `emit`, which owes an event to every subscribed endpoint.

`emit` writes the deliveries in the caller's transaction, so an event exists exactly when the change it
announces committed; their jobs are enqueued after that commit (`UnitOfWork.after_commit`). A lost enqueue
is found again by the sweeper (`jobs.sweep_webhooks_job`).
"""

from __future__ import annotations

import logging
import uuid

import msgspec
from saq import Queue
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import UnitOfWork
from space.errors import NotFound, WebhookLimitReached
from space.orgs import service as orgs
from space.webhooks import guard
from space.webhooks.models import EventType, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from space.webhooks.outbox import DELIVERIES
from space.webhooks.schemas import DeliveryAttempt, Event, EventData, Webhook, WebhookCreate, WebhookCreated
from space.webhooks.signing import new_secret

log = logging.getLogger("space.webhooks")

LOG_LIMIT = 100
"""Attempts the deliveries log shows, newest first."""

_encoder = msgspec.json.Encoder()


def _out(endpoint: WebhookEndpoint) -> Webhook:
    return Webhook(
        id=endpoint.id, url=endpoint.url, events=[EventType(e) for e in endpoint.events], created_at=endpoint.created_at
    )


async def create_webhook(
    session: AsyncSession,
    org_id: uuid.UUID,
    actor_id: uuid.UUID,
    data: WebhookCreate,
    *,
    allow_private: bool,
    limit: int,
) -> WebhookCreated:
    """Check the URL (after DNS resolution), then, under the org lock, the caller's role and the org's endpoint
    count (at most `limit`); store it with a new secret."""
    # The lookup runs before the lock: a slow resolver must not hold the org's lock.
    await guard.resolve(data.url, allow_private=allow_private)
    await orgs.lock_org(session, org_id)
    await orgs.authority(session, org_id, actor_id, orgs.MANAGERS)
    # Counted under the org lock: two concurrent creates can't both take the last place. Every event is owed to
    # every endpoint, so the count bounds what one org's event costs the outbound lane.
    count = await session.scalar(
        select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.org_id == org_id)
    )
    if (count or 0) >= limit:
        raise WebhookLimitReached(f"This organization has {count} webhook endpoints; at most {limit} are allowed.")
    endpoint = WebhookEndpoint(
        id=uuid.uuid4(),
        org_id=org_id,
        url=data.url,
        events=[e.value for e in dict.fromkeys(data.events)],
        secret=new_secret(),
        created_by=actor_id,
    )
    session.add(endpoint)
    await session.flush()
    await session.refresh(endpoint)
    return WebhookCreated(**msgspec.structs.asdict(_out(endpoint)), secret=endpoint.secret)


async def list_webhooks(session: AsyncSession, org_id: uuid.UUID) -> list[Webhook]:
    """The org's endpoints, oldest first, without secrets."""
    rows = await session.scalars(
        select(WebhookEndpoint)
        .where(WebhookEndpoint.org_id == org_id)
        .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)
    )
    return [_out(e) for e in rows]


async def delete_webhook(session: AsyncSession, org_id: uuid.UUID, actor_id: uuid.UUID, webhook_id: uuid.UUID) -> None:
    """Remove an endpoint with its pending deliveries and its log; 404 when unknown."""
    await orgs.lock_org(session, org_id)
    await orgs.authority(session, org_id, actor_id, orgs.MANAGERS)
    result = await session.execute(
        delete(WebhookEndpoint)
        .where(WebhookEndpoint.id == webhook_id, WebhookEndpoint.org_id == org_id)
        .returning(WebhookEndpoint.id)
    )
    if result.first() is None:
        raise NotFound()


async def list_attempts(session: AsyncSession, org_id: uuid.UUID, webhook_id: uuid.UUID) -> list[DeliveryAttempt]:
    """The endpoint's most recent attempts, newest first; 404 when the endpoint is unknown."""
    exists = await session.scalar(
        select(WebhookEndpoint.id).where(WebhookEndpoint.id == webhook_id, WebhookEndpoint.org_id == org_id)
    )
    if exists is None:
        raise NotFound()
    rows = await session.execute(
        select(WebhookAttempt, WebhookDelivery.event_id, WebhookDelivery.event_type)
        .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
        .where(WebhookAttempt.org_id == org_id, WebhookAttempt.endpoint_id == webhook_id)
        .order_by(WebhookAttempt.at.desc(), WebhookAttempt.attempt.desc())
        .limit(LOG_LIMIT)
    )
    return [
        DeliveryAttempt(
            id=a.id,
            delivery_id=a.delivery_id,
            event_id=event_id,
            type=EventType(event_type),
            attempt=a.attempt,
            at=a.at,
            status=a.status,
            response_code=a.response_code,
            error=a.error,
        )
        for a, event_id, event_type in rows
    ]


async def emit(uow: UnitOfWork, queue: Queue | None, event_type: EventType, data: EventData) -> int:
    """Owe `event_type` to every endpoint of the org subscribed to it, in the caller's transaction; returns how many.

    The uow's tenant must be the org's. Jobs are enqueued after the commit (on `queue`; with None, or when that
    enqueue fails, the sweeper sends them).
    """
    session = uow.session
    endpoints = list(
        await session.scalars(
            select(WebhookEndpoint.id).where(
                WebhookEndpoint.org_id == data.org_id, WebhookEndpoint.events.any_() == event_type.value
            )
        )
    )
    if not endpoints:
        return 0
    now = (await session.execute(select(func.now()))).scalar_one()
    event = Event(id=uuid.uuid4(), type=event_type, created_at=now, data=data)
    body = _encoder.encode(event).decode()
    deliveries = [
        WebhookDelivery(
            id=uuid.uuid4(),
            org_id=data.org_id,
            endpoint_id=endpoint_id,
            event_id=event.id,
            event_type=event_type.value,
            body=body,
        )
        for endpoint_id in endpoints
    ]
    await DELIVERIES.owe(uow, queue, deliveries)
    return len(deliveries)
