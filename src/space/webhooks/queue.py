"""SAQ wiring of webhook deliveries: one queue entry per attempt. The deliveries table is the ledger."""

from __future__ import annotations

import logging
import math
import time
import uuid

from saq import Job, Queue

log = logging.getLogger("space.webhooks")

DELIVER_WEBHOOK = "deliver_webhook_job"
JOB_TIMEOUT_SECONDS = 30
"""SAQ's bound on one attempt's job: the HTTP request itself is bounded at 5 s, resolving the name at 5 s more."""


def delivery_job(delivery_id: uuid.UUID, org_id: uuid.UUID, *, attempt: int, delay: float) -> Job:
    """The job of one attempt, keyed by delivery and attempt so a scheduled retry never collides with its predecessor."""
    return Job(
        function=DELIVER_WEBHOOK,
        kwargs={"delivery_id": str(delivery_id), "org_id": str(org_id)},
        key=f"webhook:{delivery_id}:{attempt}",
        # SAQ schedules in whole seconds; rounding up never runs an attempt before its backoff. Never 0 ("at
        # once"): SAQ replaces a finished entry of the same key only by a later `scheduled`, and the sweeper may
        # need to enqueue a key whose earlier entry ended without claiming anything.
        scheduled=math.ceil(time.time() + delay) if delay > 0 else int(time.time()),
        timeout=JOB_TIMEOUT_SECONDS,
        # The delivery's own attempt count is the bound; SAQ only carries it.
        retries=1,
    )


async def enqueue_delivery(
    queue: Queue, delivery_id: uuid.UUID, org_id: uuid.UUID, *, attempt: int, delay: float
) -> None:
    """Enqueue one attempt after a commit; a broker error is logged, not raised (the sweeper sends it later)."""
    try:
        await queue.enqueue(delivery_job(delivery_id, org_id, attempt=attempt, delay=delay))
    except Exception:
        log.exception("enqueue of webhook delivery %s failed; the sweeper will send it", delivery_id)
