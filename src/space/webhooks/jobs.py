"""SAQ entry points of webhooks: one attempt of a delivery, and the sweeper for lost or stalled ones."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import text

from space.db import UnitOfWork
from space.webhooks.delivery import deliver
from space.webhooks.queue import enqueue_delivery

log = logging.getLogger("space.webhooks")

SWEEP_LIMIT = 500


async def deliver_webhook_job(ctx: Any, *, delivery_id: str, org_id: str) -> str:
    """SAQ job: make a delivery's next attempt (and schedule the one after, if it failed)."""
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await deliver(ctx["settings"], ctx["db"], queue, uuid.UUID(delivery_id), uuid.UUID(org_id))


async def sweep_webhooks_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: enqueue deliveries whose entry was lost (overdue) or whose worker died (lease ran out)."""
    async with UnitOfWork(ctx["db"].sessionmaker) as uow:
        rows = (
            await uow.session.execute(
                text("SELECT * FROM space_webhooks_due_deliveries(:n)"),
                {"n": SWEEP_LIMIT},
            )
        ).all()
    for delivery_id, org_id, attempts in rows:
        # The key names the attempt the job will make: a scheduled retry still waiting is not doubled.
        await enqueue_delivery(ctx["worker"].queue, delivery_id, org_id, attempt=attempts + 1, delay=0.0)
    return {"enqueued": len(rows)}
