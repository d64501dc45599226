"""SAQ entry points of webhooks: one attempt of a delivery, and the sweeper for lost or stalled ones. Both run in the
outbound lane (`space.worker`): `ctx["worker"].queue` is the outbound queue, where retries and swept attempts go."""

from __future__ import annotations

import uuid
from typing import Any

from space.outbox import deferring
from space.webhooks.delivery import deliver
from space.webhooks.outbox import DELIVERIES

SWEEP_LIMIT = 500


@deferring
async def deliver_webhook_job(ctx: Any, *, delivery_id: str, org_id: str) -> str:
    """SAQ job: make a delivery's next attempt (and schedule the one after, if it failed); at the org's outbound
    cap, it goes back on the queue a little later (`deferring`)."""
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await deliver(ctx["settings"], ctx["db"], queue, uuid.UUID(delivery_id), uuid.UUID(org_id))


async def sweep_webhooks_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: enqueue deliveries whose entry was lost (overdue) or whose worker died (lease ran out)."""
    return {"enqueued": await DELIVERIES.sweep(ctx["db"], ctx["worker"].queue, SWEEP_LIMIT)}
