"""SAQ wiring for exports: which broker, under which name, and the job that carries an export id. SAQ is
transport only.

The queue is named after the installation (`space-<installation id>`, the id `space migrate` keeps in the
database; SPACE_QUEUE_NAME overrides it), so installations that share a broker never see each other's jobs.
Every job enqueued is stamped with the installation id (`job.meta`); a worker that still receives another
installation's job (two of them given the same SPACE_QUEUE_NAME) puts it back (`space.exports.jobs`).
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass

from psycopg.conninfo import make_conninfo
from saq import Job, Queue
from saq.job import Status
from saq.queue.postgres import PostgresQueue
from sqlalchemy import text

from space.config import Settings
from space.db import Database, queue_conninfo
from space.failures import OperatorError

log = logging.getLogger("space.exports")

RUN_EXPORT = "run_export_job"
TERMINAL = frozenset({Status.COMPLETE, Status.FAILED, Status.ABORTED})
INSTALLATION = "installation"
"""The key of `job.meta` that names the installation whose database holds the job's export."""


@dataclass(frozen=True)
class QueueIdentity:
    """Whose queue this is: the installation's id (from its database) and the queue's name."""

    installation: uuid.UUID
    name: str


async def read_installation_id(db: Database) -> uuid.UUID:
    """The id `space migrate` created in this database (table `installation`, readable by the app role)."""
    async with db.engine.connect() as conn:
        exists = await conn.scalar(text("SELECT to_regclass('public.installation') IS NOT NULL"))
        value = await conn.scalar(text("SELECT id FROM installation")) if exists else None
    if value is None:
        raise OperatorError(
            "the database has no installation id (it names the queue): run `space migrate` (as the owner)"
        )
    return uuid.UUID(str(value))


async def queue_identity(settings: Settings, db: Database) -> QueueIdentity:
    """This installation's id, and its queue's name: SPACE_QUEUE_NAME, or `space-<installation id>`."""
    installation = await read_installation_id(db)
    return QueueIdentity(installation, settings.queue_name or f"space-{installation}")


def make_queue(
    settings: Settings,
    identity: QueueIdentity,
    *,
    application_name: str = "space-queue",
    max_connections: int = 10,
) -> Queue:
    """SAQ on PostgreSQL (own pool, role `space_queue`, schema `saq`) unless SPACE_QUEUE_URL is redis://, named
    after the installation; every job it enqueues is stamped with the installation id."""
    url = settings.queue_url
    queue: Queue
    if url and url.startswith(("redis://", "rediss://", "unix://")):
        queue = Queue.from_url(url, name=identity.name)
    else:
        if not url:
            assert settings.database_url, "the queue needs DATABASE_URL or SPACE_QUEUE_URL"
            url = queue_conninfo(settings.database_url)
        conninfo = make_conninfo(url, application_name=application_name)
        queue = PostgresQueue(url=conninfo, name=identity.name, min_size=1, max_size=max_connections)

    async def stamp(job: Job) -> None:
        job.meta[INSTALLATION] = str(identity.installation)
        # SAQ names a cron job's entry `cron:<function>` in every queue; its PostgreSQL backend keys entries by
        # that key alone, across queues, so two installations on one PostgreSQL broker (or an entry an older
        # release left under another name) would hold each other's cron entries. Each queue's are its own.
        prefix = f"cron:{identity.name}:"
        if job.key.startswith("cron:") and not job.key.startswith(prefix):
            job.key = prefix + job.key.removeprefix("cron:")

    queue.register_before_enqueue(stamp)
    return queue


async def open_queue(
    settings: Settings, db: Database, *, application_name: str = "space-queue", max_connections: int = 10
) -> Queue:
    """`make_queue` for this installation, its identity read from the database (not yet connected)."""
    identity = await queue_identity(settings, db)
    return make_queue(settings, identity, application_name=application_name, max_connections=max_connections)


def installation_of(job: Job) -> str | None:
    """The installation a job was enqueued by (None: a job of a release that did not stamp them)."""
    value = (job.meta or {}).get(INSTALLATION)
    return str(value) if value is not None else None


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
