"""The outbox's claim (`space.outbox`, SPEC §19 and §25): one org's attempts in flight are capped over every
channel, an attempt refused at the cap waits without counting as one, and a row another transaction holds is
skipped (`FOR UPDATE SKIP LOCKED`), never waited for.

The real database as the app role, real rows written by `webhooks.service.emit`; the claims are the outbox's own.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import select

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.outbox import DEFER_SECONDS, DEFERRALS, OrgBusy, in_flight, registered
from space.queue import PutBack
from space.webhooks import service
from space.webhooks.jobs import deliver_webhook_job
from space.webhooks.models import EventType, WebhookDelivery
from space.webhooks.outbox import DELIVERIES
from space.webhooks.schemas import EventData
from tests.exports.fixtures import WAIT, tuned
from tests.helpers import Api, Org

PUBLIC_URL = "https://93.184.216.34/hooks"
"""A public address literal: allowed with no DNS lookup; nothing is ever sent to it here (no attempt is made)."""


async def _owed(api: Api, db: Database, endpoints: int) -> tuple[Org, list[uuid.UUID]]:
    """An org with `endpoints` endpoints and one event owed to each (no queue: nothing is sent)."""
    org = await api.org()
    for _ in range(endpoints):
        r = await api.call(
            "POST", org.path("/webhooks"), org.owner, json={"url": PUBLIC_URL, "events": ["export.failed"]}
        )
        assert r.status_code == 201, r.text
    oid = uuid.UUID(org.id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        data = EventData(org_id=oid, export_id=uuid.uuid4(), state="failed", error_code="worker_lost")
        assert await service.emit(uow, None, EventType.export_failed, data) == endpoints
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        ids = list(await uow.session.scalars(select(WebhookDelivery.id).where(WebhookDelivery.org_id == oid)))
    return org, ids


async def _claim(db: Database, org: Org, delivery_id: uuid.UUID, cap: int) -> Any:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        return await DELIVERIES.claim(uow.session, delivery_id, uuid.UUID(org.id), org_concurrency=cap)


async def _settle(db: Database, org: Org, delivery_id: uuid.UUID, attempt: int) -> None:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        settled = await DELIVERIES.settle(
            uow.session, delivery_id, uuid.UUID(org.id), attempt, ok=True, final=False, retry_base=0
        )
        assert settled is not None and settled.result == "delivered"


def _row(owner: psycopg.Connection[Any], delivery_id: uuid.UUID) -> tuple[str, int]:
    row = owner.execute("SELECT state, attempts FROM webhook_deliveries WHERE id = %s", (delivery_id,)).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


async def test_an_org_at_its_outbound_cap_claims_nothing_and_another_org_still_does(
    api: Api, db: Database, owner: psycopg.Connection[Any]
) -> None:
    assert DELIVERIES in registered()
    a, (first, second, third) = await _owed(api, db, 3)
    b, (other,) = await _owed(api, db, 1)
    # Cap 2: two of a's attempts are taken; the third is refused and its row is untouched.
    assert (await _claim(db, a, first, 2))[0] == 1
    assert (await _claim(db, a, second, 2))[0] == 1
    with pytest.raises(OrgBusy):
        await _claim(db, a, third, 2)
    assert _row(owner, third) == ("pending", 0)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(a.id))) as uow:
        assert await in_flight(uow.session, uuid.UUID(a.id)) == 2
    # Another org's attempt is not held up by a's.
    assert (await _claim(db, b, other, 2))[0] == 1
    # One of a's attempts ends: its place is free again.
    await _settle(db, a, first, 1)
    assert (await _claim(db, a, third, 2))[0] == 1
    assert [_row(owner, d) for d in (first, second, third)] == [("delivered", 1), ("sending", 1), ("sending", 1)]
    # An attempt whose worker died (its lease ran out) no longer counts as in flight.
    owner.execute(
        "UPDATE webhook_deliveries SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
        (second,),
    )
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(a.id))) as uow:
        assert await in_flight(uow.session, uuid.UUID(a.id)) == 1


async def test_an_attempt_refused_at_the_cap_goes_back_on_its_queue_uncounted(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    a, (held, waiting) = await _owed(api, db, 2)
    one = tuned(settings, outbound_org_concurrency=1)
    assert (await _claim(db, a, held, 1))[0] == 1
    job = DELIVERIES.job(waiting, uuid.UUID(a.id), attempt=1, delay=0)
    # As SAQ hands it to the job: its attempt counted once dequeued.
    job.attempts = 1
    ctx: dict[str, Any] = {"settings": one, "db": db, "job": job}
    waits = []
    for _ in range(len(DEFER_SECONDS) + 1):
        with pytest.raises(PutBack):
            await deliver_webhook_job(ctx, **job.kwargs)
        # SAQ retries it (the entry stays unfinished) after the delay, with its own attempt given back.
        assert job.attempts == 0 and job.retryable
        waits.append(job.retry_delay)
        job.attempts = 1
    assert waits == [*DEFER_SECONDS, DEFER_SECONDS[-1]]
    assert job.meta[DEFERRALS] == len(DEFER_SECONDS) + 1
    # The row's attempt count is untouched: a wait is not an attempt.
    assert _row(owner, waiting) == ("pending", 0)


async def test_a_claim_skips_a_row_another_transaction_holds(
    api: Api, db: Database, owner_url: str, owner: psycopg.Connection[Any]
) -> None:
    a, (delivery,) = await _owed(api, db, 1)
    async with await psycopg.AsyncConnection.connect(owner_url) as holder:
        await holder.execute("SELECT 1 FROM webhook_deliveries WHERE id = %s FOR UPDATE", (delivery,))
        # SKIP LOCKED: the claim answers at once that it took nothing; a plain UPDATE would wait for the holder.
        assert await asyncio.wait_for(_claim(db, a, delivery, 2), WAIT) is None
        assert _row(owner, delivery) == ("pending", 0)
        await holder.rollback()
    assert (await _claim(db, a, delivery, 2))[0] == 1
    assert _row(owner, delivery) == ("sending", 1)


async def test_a_claim_fails_a_row_whose_last_attempts_worker_died_even_at_the_cap(
    api: Api, db: Database, owner: psycopg.Connection[Any]
) -> None:
    a, (busy, exhausted) = await _owed(api, db, 2)
    assert (await _claim(db, a, busy, 1))[0] == 1
    owner.execute(
        "UPDATE webhook_deliveries SET state = 'sending', attempts = %s,"
        " lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
        (DELIVERIES.max_attempts, exhausted),
    )
    # The org is at its cap, but failing the row sends nothing: it is failed, not deferred.
    assert await _claim(db, a, exhausted, 1) is None
    assert _row(owner, exhausted) == ("failed", DELIVERIES.max_attempts)
