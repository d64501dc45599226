"""SAQ entry points of notifications: one attempt of an email (of an org's notification, or of a user's own), and the
sweeper for lost or stalled ones of both tables. All run in the outbound lane (`space.worker`): `ctx["worker"].queue` is the outbound queue, where retries and swept attempts go."""

from __future__ import annotations

import uuid
from typing import Any

from space.notifications.outbox import EMAILS, PERSONAL_EMAILS
from space.notifications.sending import send_email, send_personal_email
from space.outbox import deferring

SWEEP_LIMIT = 500


@deferring
async def send_email_job(ctx: Any, *, notification_id: str, org_id: str) -> str:
    """SAQ job: make an email's next attempt (and schedule the one after, if it may pass); at the org's outbound
    cap, it goes back on the queue a little later (`deferring`)."""
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await send_email(ctx["settings"], ctx["db"], queue, uuid.UUID(notification_id), uuid.UUID(org_id))


@deferring
async def send_personal_email_job(ctx: Any, *, notification_id: str, user_id: str) -> str:
    """SAQ job: make the next attempt of the email of a user's own notification; at the user's outbound cap (one
    person's emails hold no more of the lane than one org's), it goes back on the queue a little later."""
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    return await send_personal_email(ctx["settings"], ctx["db"], queue, uuid.UUID(notification_id), uuid.UUID(user_id))


async def sweep_emails_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: enqueue emails whose entry was lost (overdue) or whose worker died (lease ran out): an org's
    (`enqueued`, all of them) and users' own (`personal`, counted among them too)."""
    org = await EMAILS.sweep(ctx["db"], ctx["worker"].queue, SWEEP_LIMIT)
    personal = await PERSONAL_EMAILS.sweep(ctx["db"], ctx["worker"].queue, SWEEP_LIMIT)
    return {"enqueued": org + personal, "personal": personal}
