"""The email outbox (`space.outbox`): the `notifications` rows of channel `email`, one queue entry per attempt, eight
attempts with a doubling backoff, so that a server answering 4xx or not at all is tried for more than an hour
(with the default SPACE_MAIL_RETRY_SECONDS of 60: 1, 2, 4, ... 64 minutes apart, the last two hours after the first).

Its states are the outbox's (pending, sending, delivered, failed) plus `skipped`, which the sender writes itself;
`retrying` is a pending row already tried once (the table's `status` column reads it so).

`PERSONAL_EMAILS` is its twin for the `personal_notifications` of events that have no org (`import.failed`):
the same policy, its rows keyed by their user, its attempts counted against no org's cap."""

from __future__ import annotations

import logging

from space.notifications.models import Notification, PersonalNotification
from space.outbox import Outbox

SEND_EMAIL = "send_email_job"
SEND_PERSONAL_EMAIL = "send_personal_email_job"

MAX_ATTEMPTS = 8

EMAILS = Outbox(
    table=Notification,
    job_function=SEND_EMAIL,
    id_kwarg="notification_id",
    key_prefix="email",
    due_function="space_notifications_due_emails",
    max_attempts=MAX_ATTEMPTS,
    # One SMTP session is bounded by smtp.TIMEOUT_SECONDS per step: a few steps fit well inside.
    lease_seconds=300,
    backoff_factor=2,
    job_timeout_seconds=240,
    log=logging.getLogger("space.notifications"),
    noun="email",
)


PERSONAL_EMAILS = Outbox(
    table=PersonalNotification,
    job_function=SEND_PERSONAL_EMAIL,
    id_kwarg="notification_id",
    key_prefix="personal-email",
    due_function="space_notifications_due_personal_emails",
    max_attempts=MAX_ATTEMPTS,
    lease_seconds=EMAILS.lease_seconds,
    backoff_factor=EMAILS.backoff_factor,
    job_timeout_seconds=EMAILS.job_timeout_seconds,
    log=EMAILS.log,
    noun="personal email",
    scope="user_id",
)


def retry_schedule(base: float) -> list[float]:
    """Seconds after the first attempt at which each later one is due (base `SPACE_MAIL_RETRY_SECONDS`)."""
    waits = [EMAILS.backoff(attempt, base) for attempt in range(1, MAX_ATTEMPTS)]
    return [sum(waits[: i + 1]) for i in range(len(waits))]
