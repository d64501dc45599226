"""The destination deliveries' outbox (`space.outbox`): one queue entry per attempt, six attempts with a four-fold
backoff (with the default SPACE_DELIVERY_RETRY_SECONDS of 30: 30 s, 2 min, 8 min, 32 min, 2 h 8 min apart).
The deliveries table is the ledger; a store's 4xx ends a delivery at its first attempt (`delivery.attempt`)."""

from __future__ import annotations

import logging

from space.destinations.models import DestinationDelivery
from space.outbox import Outbox

DELIVER_EXPORT = "deliver_export_job"

DELIVERIES = Outbox(
    table=DestinationDelivery,
    job_function=DELIVER_EXPORT,
    id_kwarg="delivery_id",
    key_prefix="destination",
    due_function="space_destinations_due_deliveries",
    max_attempts=6,
    # One attempt copies a whole export (each request bounded by the store client's timeouts): SAQ's bound on the
    # job is half an hour, and the lease outlives it, so a live attempt is never started again beside itself.
    lease_seconds=3600,
    backoff_factor=4,
    job_timeout_seconds=1800,
    log=logging.getLogger("space.destinations"),
    noun="destination delivery",
)
