"""One attempt of one delivery, top to bottom: claim -> check the address -> send signed -> record -> schedule.

No transaction is open while the request is in flight. Each attempt is fenced by the delivery's attempt
count: only the worker that made attempt n records it, and a delivery deleted with its endpoint meanwhile
records nothing. The claim, the fenced record, the backoff and the next entry are the outbox's (`space.outbox`);
what is sent, and the deliveries log, are this module's. An attempt runs in the outbound lane, at most
`outbound_org_concurrency` of one org's at once (the claim raises OrgBusy beyond).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from saq import Queue
from sqlalchemy import select

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import InvalidRequest
from space.webhooks import guard
from space.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from space.webhooks.outbox import DELIVERIES
from space.webhooks.signing import signed_headers

TIMEOUT_SECONDS = 5.0
"""Bound on one attempt's whole request (connect, send, response headers)."""
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


async def deliver(
    settings: Settings, db: Database, queue: Queue | None, delivery_id: uuid.UUID, org_id: uuid.UUID
) -> str:
    """Make the delivery's next attempt; returns delivered, retrying, failed or not_claimed. Raises OrgBusy, having
    changed nothing, while the org has `outbound_org_concurrency` attempts in flight."""
    claimed = await claim(db, delivery_id, org_id, org_concurrency=settings.outbound_org_concurrency)
    if claimed is None:
        return "not_claimed"
    outcome = await attempt(claimed, allow_private=settings.webhook_allow_private)
    return await record(settings, db, queue, claimed, outcome)


async def claim(db: Database, delivery_id: uuid.UUID, org_id: uuid.UUID, *, org_concurrency: int) -> Claimed | None:
    """Take the next attempt (`DELIVERIES.claim`); None when it is done, deleted, or another worker has it; OrgBusy
    while the org has `org_concurrency` attempts in flight."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        row = await DELIVERIES.claim(
            uow.session,
            delivery_id,
            org_id,
            WebhookDelivery.event_id,
            WebhookDelivery.body,
            WebhookDelivery.endpoint_id,
            org_concurrency=org_concurrency,
        )
        if row is None:
            return None
        attempts, event_id, body, endpoint_id = row
        endpoint = (
            await uow.session.execute(
                select(WebhookEndpoint.url, WebhookEndpoint.secret).where(WebhookEndpoint.id == endpoint_id)
            )
        ).one()
    return Claimed(delivery_id, org_id, attempts, event_id, body.encode(), endpoint.url, endpoint.secret)


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
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=claimed.org_id)) as uow:
        settled = await DELIVERIES.settle(
            uow.session,
            claimed.delivery_id,
            claimed.org_id,
            claimed.attempt,
            ok=outcome.ok,
            final=outcome.final,
            retry_base=settings.webhook_retry_seconds,
            columns=(WebhookDelivery.endpoint_id,),
        )
        if settled is None:
            # Deleted with its endpoint, or the lease ran out and the attempt was started again elsewhere.
            return "not_claimed"
        uow.session.add(
            WebhookAttempt(
                id=uuid.uuid4(),
                org_id=claimed.org_id,
                endpoint_id=settled.row.endpoint_id,
                delivery_id=claimed.delivery_id,
                attempt=claimed.attempt,
                status="succeeded" if outcome.ok else "failed",
                response_code=outcome.response_code,
                error=outcome.error,
            )
        )
    if settled.retrying and queue is not None:
        await DELIVERIES.enqueue(
            queue, claimed.delivery_id, claimed.org_id, attempt=claimed.attempt + 1, delay=settled.delay
        )
    return settled.result
