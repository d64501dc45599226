"""One attempt of one delivery, top to bottom: claim -> check the address -> send signed -> record -> schedule.

No transaction is open while the request is in flight. Each attempt is fenced by the delivery's attempt
count: only the worker that made attempt n records it, and a delivery deleted with its endpoint meanwhile
records nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from saq import Queue
from sqlalchemy import select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import InvalidRequest
from space.webhooks import guard
from space.webhooks.models import DeliveryState, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from space.webhooks.queue import enqueue_delivery
from space.webhooks.signing import signed_headers

log = logging.getLogger("space.webhooks")

MAX_ATTEMPTS = 5
TIMEOUT_SECONDS = 5.0
"""Bound on one attempt's whole request (connect, send, response headers)."""
LEASE_SECONDS = 60
"""How long a claimed attempt is the claimer's; after it the sweeper may start the attempt again."""
BACKOFF_FACTOR = 4
USER_AGENT = "Space-Webhooks/1"


@dataclass(frozen=True)
class Claimed:
    """An attempt this worker now owns: which try, where to, and what to send."""

    delivery_id: uuid.UUID
    org_id: uuid.UUID
    attempt: int
    event_id: uuid.UUID
    body: bytes
    url: str
    secret: str


@dataclass(frozen=True)
class Outcome:
    """How the receiver answered (or why nothing was sent). `final` ends the delivery whatever the attempt."""

    ok: bool
    response_code: int | None = None
    error: str | None = None
    final: bool = False


def backoff(attempt: int, base: float) -> float:
    """Seconds to wait after failed attempt `attempt` (from 1): base, 4 x base, 16 x base, ..."""
    return base * float(BACKOFF_FACTOR ** (attempt - 1))


async def deliver(
    settings: Settings, db: Database, queue: Queue | None, delivery_id: uuid.UUID, org_id: uuid.UUID
) -> str:
    """Make the delivery's next attempt; returns delivered, retrying, failed or not_claimed."""
    claimed = await claim(db, delivery_id, org_id)
    if claimed is None:
        return "not_claimed"
    outcome = await attempt(claimed, allow_private=settings.webhook_allow_private)
    return await record(settings, db, queue, claimed, outcome)


async def claim(db: Database, delivery_id: uuid.UUID, org_id: uuid.UUID) -> Claimed | None:
    """Take the next attempt with one conditional UPDATE; None when it is done, deleted, or another worker has it."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        claimable = (WebhookDelivery.state == DeliveryState.pending.value) | (
            (WebhookDelivery.state == DeliveryState.sending.value)
            & (WebhookDelivery.lease_expires_at < text("clock_timestamp()"))
        )
        row = (
            await session.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == delivery_id,
                    WebhookDelivery.org_id == org_id,
                    WebhookDelivery.attempts < MAX_ATTEMPTS,
                    claimable,
                )
                .values(
                    state=DeliveryState.sending.value,
                    attempts=WebhookDelivery.attempts + 1,
                    lease_expires_at=text(f"clock_timestamp() + interval '{LEASE_SECONDS} seconds'"),
                )
                .returning(
                    WebhookDelivery.attempts,
                    WebhookDelivery.event_id,
                    WebhookDelivery.body,
                    WebhookDelivery.endpoint_id,
                )
                .execution_options(synchronize_session=False)
            )
        ).first()
        if row is None:
            await _fail_exhausted(session, delivery_id, org_id, claimable)
            return None
        attempts, event_id, body, endpoint_id = row
        endpoint = (
            await session.execute(
                select(WebhookEndpoint.url, WebhookEndpoint.secret).where(WebhookEndpoint.id == endpoint_id)
            )
        ).one()
    return Claimed(delivery_id, org_id, attempts, event_id, body.encode(), endpoint.url, endpoint.secret)


async def _fail_exhausted(session: AsyncSession, delivery_id: uuid.UUID, org_id: uuid.UUID, claimable: object) -> None:
    # A worker died during the last attempt: nothing is left to try.
    await session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery_id,
            WebhookDelivery.org_id == org_id,
            WebhookDelivery.attempts >= MAX_ATTEMPTS,
            claimable,  # type: ignore[arg-type]
        )
        .values(state=DeliveryState.failed.value, lease_expires_at=None, finished_at=text("clock_timestamp()"))
        .execution_options(synchronize_session=False)
    )


async def attempt(claimed: Claimed, *, allow_private: bool) -> Outcome:
    """Check where the URL leads now, then POST the signed body to the checked address, within TIMEOUT_SECONDS."""
    try:
        destination = await guard.resolve(claimed.url, allow_private=allow_private)
    except InvalidRequest as exc:
        # The address may not be used: sending later would not make it allowed.
        return Outcome(ok=False, error=f"refused: {exc.detail}", final=True)
    address = destination.addresses[0]
    headers = {
        **signed_headers(claimed.secret, str(claimed.event_id), int(time.time()), claimed.body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "host": destination.host_header,
    }
    # Here, not at the top: every worker imports this module, few ever send a webhook (httpx is 5 MiB).
    import httpx

    # TLS still checks the certificate against the name (SNI), though the connection goes to the address.
    extensions = {"sni_hostname": destination.host} if destination.scheme == "https" else {}
    try:
        # No proxies from the environment (they would defeat the address check), no redirects (they could
        # lead anywhere), and the body of the answer is never read.
        async with (
            asyncio.timeout(TIMEOUT_SECONDS),
            httpx.AsyncClient(timeout=TIMEOUT_SECONDS, trust_env=False, follow_redirects=False) as client,
        ):
            request = client.build_request(
                "POST", destination.pinned_url(address), content=claimed.body, headers=headers, extensions=extensions
            )
            response = await client.send(request, stream=True)
            await response.aclose()
    except TimeoutError:
        return Outcome(ok=False, error=f"timeout after {TIMEOUT_SECONDS:g} s")
    except httpx.HTTPError as exc:
        return Outcome(ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
    ok = 200 <= response.status_code < 300
    return Outcome(ok=ok, response_code=response.status_code, error=None if ok else f"HTTP {response.status_code}")


async def record(settings: Settings, db: Database, queue: Queue | None, claimed: Claimed, outcome: Outcome) -> str:
    """Log the attempt and move the delivery on (delivered, failed, or pending until its backoff), fenced by the attempt."""
    if outcome.ok:
        state, delay, result = DeliveryState.delivered, 0.0, "delivered"
    elif outcome.final or claimed.attempt >= MAX_ATTEMPTS:
        state, delay, result = DeliveryState.failed, 0.0, "failed"
    else:
        state, delay, result = (
            DeliveryState.pending,
            backoff(claimed.attempt, settings.webhook_retry_seconds),
            "retrying",
        )
    done = state is not DeliveryState.pending
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=claimed.org_id)) as uow:
        matched = (
            await uow.session.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == claimed.delivery_id,
                    WebhookDelivery.org_id == claimed.org_id,
                    WebhookDelivery.attempts == claimed.attempt,
                    WebhookDelivery.state == DeliveryState.sending.value,
                )
                .values(
                    state=state.value,
                    lease_expires_at=None,
                    next_attempt_at=text("clock_timestamp() + make_interval(secs => :delay)").bindparams(delay=delay),
                    finished_at=text("clock_timestamp()") if done else None,
                )
                .returning(WebhookDelivery.endpoint_id)
                .execution_options(synchronize_session=False)
            )
        ).first()
        if matched is None:
            # Deleted with its endpoint, or the lease ran out and the attempt was started again elsewhere.
            log.info(
                "webhook delivery %s attempt %d no longer ours; not recorded", claimed.delivery_id, claimed.attempt
            )
            return "not_claimed"
        uow.session.add(
            WebhookAttempt(
                id=uuid.uuid4(),
                org_id=claimed.org_id,
                endpoint_id=matched.endpoint_id,
                delivery_id=claimed.delivery_id,
                attempt=claimed.attempt,
                status="succeeded" if outcome.ok else "failed",
                response_code=outcome.response_code,
                error=outcome.error,
            )
        )
    if not done and queue is not None:
        await enqueue_delivery(queue, claimed.delivery_id, claimed.org_id, attempt=claimed.attempt + 1, delay=delay)
    return result
