"""The webhook deliveries' outbox (`space.outbox`): one queue entry per attempt, five attempts with a four-fold
backoff. The deliveries table is the ledger."""

from __future__ import annotations

import logging

from space.outbox import Outbox
from space.webhooks.models import WebhookDelivery

DELIVER_WEBHOOK = "deliver_webhook_job"

DELIVERIES = Outbox(
    table=WebhookDelivery,
    job_function=DELIVER_WEBHOOK,
    id_kwarg="delivery_id",
    key_prefix="webhook",
    due_function="space_webhooks_due_deliveries",
    max_attempts=5,
    lease_seconds=60,
    backoff_factor=4,
    # The HTTP request itself is bounded at 5 s, resolving the name at 5 s more.
    job_timeout_seconds=30,
    log=logging.getLogger("space.webhooks"),
    noun="webhook delivery",
)


def backoff(attempt: int, base: float) -> float:
    """Seconds a delivery waits after failed attempt `attempt` (from 1): base, 4 x base, 16 x base, ..."""
    return DELIVERIES.backoff(attempt, base)
