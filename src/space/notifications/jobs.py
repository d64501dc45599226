"""SAQ entry points of notifications: one attempt of an email, and the sweeper for lost or stalled ones. Both run in
the outbound lane (`space.worker`): `ctx["worker"].queue` is the outbound queue, where retries and swept attempts go."""

from __future__ import annotations

import uuid
from typing import Any

from space.notifications.outbox import EMAILS
from space.notifications.sending import send_email
from space.outbox import deferring

SWEEP_LIMIT = 500


@deferring
async def send_email_job(ctx: Any, *, notification_id: str, org_id: str) -> str:
    """SAQ job: make an email's next attempt (and schedule the one after, if it may pass); at the org's outbound
    cap, it goes back on the queue a little later (`deferring`)."""
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await send_email(ctx["settings"], ctx["db"], queue, uuid.UUID(notification_id), uuid.UUID(org_id))


async def sweep_emails_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: enqueue emails whose entry was lost (overdue) or whose worker died (lease ran out)."""
    return {"enqueued": await EMAILS.sweep(ctx["db"], ctx["worker"].queue, SWEEP_LIMIT)}
