"""SAQ wiring for exports: which broker, and the job that carries an export id. SAQ is transport only."""

from __future__ import annotations

import logging
import math
import uuid

from psycopg.conninfo import make_conninfo
from saq import Job, Queue
from saq.job import Status
from saq.queue.postgres import PostgresQueue

from space.config import Settings
from space.db import queue_conninfo

log = logging.getLogger("space.exports")

QUEUE_NAME = "space"
RUN_EXPORT = "run_export_job"
TERMINAL = frozenset({Status.COMPLETE, Status.FAILED, Status.ABORTED})


def make_queue(settings: Settings, *, application_name: str = "space-queue", max_connections: int = 10) -> Queue:
    """SAQ on PostgreSQL (own pool, role `space_queue`, schema `saq`) unless SPACE_QUEUE_URL is redis://."""
    url = settings.queue_url
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        return Queue.from_url(url, name=QUEUE_NAME)
    if not url:
        assert settings.database_url, "the queue needs DATABASE_URL or SPACE_QUEUE_URL"
        url = queue_conninfo(settings.database_url)
    conninfo = make_conninfo(url, application_name=application_name)
    return PostgresQueue(url=conninfo, name=QUEUE_NAME, min_size=1, max_size=max_connections)


def export_job(settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID) -> Job:
    """The SAQ job of an export: key = export id (one queue entry per export), explicit limits."""
    lease = math.ceil(settings.export_lease_seconds)
    return Job(
        function=RUN_EXPORT,
        kwargs={"export_id": str(export_id), "org_id": str(org_id)},
        key=str(export_id),
        # The read is bounded by export_timeout_seconds; publishing and a last heartbeat fit in the rest.
        timeout=math.ceil(settings.export_timeout_seconds) + 2 * lease + 30,
        # The run touches the job every lease/3 s; SAQ sweeps it as stuck after a whole lease without one.
        heartbeat=lease,
        # SAQ counts attempts: retries=N allows N runs. The ledger's own `attempt` is the real bound.
        retries=settings.export_retries,
    )


async def enqueue_export(queue: Queue, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID) -> bool:
    """Put the export's job on the queue; False when an unfinished entry with that key already exists."""
    return await queue.enqueue(export_job(settings, export_id, org_id)) is not None


async def enqueue_quietly(queue: Queue, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID) -> None:
    """After-commit enqueue: a broker error is logged, not raised. The row is committed; the reconciler retries."""
    try:
        await enqueue_export(queue, settings, export_id, org_id)
    except Exception:
        log.exception("enqueue of export %s failed; the reconciler will enqueue it", export_id)
