"""The installation's queues: which broker, under which names, and the guard every job they run passes first.
SAQ is transport only.

The queue is named after the installation (`space-<installation id>`, the id `space migrate` keeps in the
database; SPACE_QUEUE_NAME overrides it), so installations that share a broker never see each other's jobs.
Outbound work (every `space.outbox` channel: webhook deliveries, ...) has a lane of its own beside it, the queue
`<name>-outbound` on the same broker, served by the worker's second SAQ Worker (`space.worker`), so that no
export ever waits for a slow receiver.
Every job enqueued is stamped with the installation id (`job.meta`); a worker that still receives another
installation's job (two of them given the same SPACE_QUEUE_NAME) puts it back (`guarded`, which wraps every job
function the worker registers: export runs, webhook deliveries, crons).
"""

from __future__ import annotations

import collections
import functools
import logging
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from saq import Job, Queue
from saq.job import Status
from saq.queue.postgres import PostgresQueue
from sqlalchemy import text

from space.config import Settings
from space.db import Database, queue_conninfo
from space.failures import OperatorError

TERMINAL = frozenset({Status.COMPLETE, Status.FAILED, Status.ABORTED})
INSTALLATION = "installation"
"""The key of `job.meta` that names the installation whose database holds the job's rows."""
FOREIGN_RETRY_SECONDS = 1.0
"""How long another installation's job waits before it is on the queue again (for its own workers to take)."""
FOREIGN_LOGGED = 1024
"""Foreign jobs one worker remembers having logged (so each is logged once, in bounded memory)."""

OUTBOUND_SUFFIX = "-outbound"
"""What the outbound lane's queue name adds to the installation's queue name."""

T = TypeVar("T")


@dataclass(frozen=True)
class QueueIdentity:
    """Whose queue this is: the installation's id (from its database) and the queue's name."""

    installation: uuid.UUID
    name: str

    def outbound(self) -> QueueIdentity:
        """The identity of the installation's outbound lane: `<name>-outbound`, the same installation."""
        return QueueIdentity(self.installation, self.name + OUTBOUND_SUFFIX)


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
        # Our own pool, so that min_size holds from the start: SAQ builds its pool with psycopg_pool's default of 4
        # and only resizes it after opening, which leaves 4 idle connections per queue for ten minutes (two queues
        # a process, with the outbound lane, filled a small server's slots in the scale-out test).
        pool = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_connections,
            check=AsyncConnectionPool.check_connection,
            kwargs={"autocommit": True},
            open=False,
        )
        queue = PostgresQueue(
            pool=pool, name=identity.name, min_size=1, max_size=max_connections, manage_pool_lifecycle=True
        )
    prefix = cron_prefix(identity)

    async def stamp(job: Job) -> None:
        job.meta[INSTALLATION] = str(identity.installation)
        # SAQ names a cron job's entry `cron:<function>` in every queue; its PostgreSQL backend keys entries by
        # that key alone, across queues, so two installations on one PostgreSQL broker (or an entry an older
        # release left under another name) would hold each other's cron entries. Each queue's are its own.
        if job.key.startswith("cron:") and not job.key.startswith(prefix):
            job.key = prefix + job.key.removeprefix("cron:")

    queue.register_before_enqueue(stamp)
    return queue


def cron_prefix(identity: QueueIdentity) -> str:
    """How this queue's cron entries' keys begin: `cron:<queue name>:`, and the installation when the name is not
    the installation's own.

    Crons pass the guard too: installations given one SPACE_QUEUE_NAME each keep cron entries of their own, which
    only their own workers run (with one key between them, an entry of an installation that stopped would be put
    back forever, and the others' crons never scheduled).
    """
    if identity.name.removesuffix(OUTBOUND_SUFFIX) == f"space-{identity.installation}":
        return f"cron:{identity.name}:"
    return f"cron:{identity.name}:{identity.installation}:"


async def open_queue(
    settings: Settings, db: Database, *, application_name: str = "space-queue", max_connections: int = 10
) -> Queue:
    """`make_queue` for this installation, its identity read from the database (not yet connected)."""
    identity = await queue_identity(settings, db)
    return make_queue(settings, identity, application_name=application_name, max_connections=max_connections)


async def open_outbound_queue(
    settings: Settings, db: Database, *, application_name: str = "space-outbound-queue", max_connections: int = 10
) -> Queue:
    """`make_queue` for this installation's outbound lane (not yet connected): where outbound attempts are enqueued."""
    identity = (await queue_identity(settings, db)).outbound()
    return make_queue(settings, identity, application_name=application_name, max_connections=max_connections)


def installation_of(job: Job) -> str | None:
    """The installation a job was enqueued by (None: a job of a release that did not stamp them)."""
    value = (job.meta or {}).get(INSTALLATION)
    return str(value) if value is not None else None


# --- the guard -------------------------------------------------------------------------------------------------


class PutBack(Exception):
    """Raised by a job that is not to run now (`put_back`): SAQ puts it on the queue again, no attempt counted.

    Not an error: the worker's log filter drops SAQ's "Error processing job" traceback for it.
    """


class ForeignJob(PutBack):
    """The job belongs to another installation (another database) that shares this queue: put it back."""


_guarded: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()


def guarded(function: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """`function` as a SAQ job that first hands another installation's job back (`give_back`), untouched.

    The worker needs ctx `installation` and `foreign_logged` (its startup makes them). The wrapper keeps the
    function's name, which SAQ registers a cron job under.
    """
    # The warning goes to the log of the job's own domain (`space.exports`, `space.webhooks`, ...).
    log = logging.getLogger(".".join(function.__module__.split(".")[:2]))

    @functools.wraps(function)
    async def run(ctx: Any, **kwargs: Any) -> T:
        job: Job | None = ctx.get("job")
        if job is not None:
            owner = installation_of(job)
            if owner is not None and owner != str(ctx["installation"]):
                give_back(ctx, job, owner, log)
        return await function(ctx, **kwargs)

    _guarded.add(run)
    return run


def is_guarded(function: Callable[..., Any]) -> bool:
    """Whether `function` is a job wrapped by `guarded`."""
    return function in _guarded


def give_back(ctx: Any, job: Job, owner: str, log: logging.Logger) -> None:
    """Hand another installation's job back to the queue untouched, logged once; raises ForeignJob.

    Its rows are not in this database: an export run would find no row and finish the entry (the export would
    then wait for its own installation's reconciler), a delivery would claim nothing. Raising makes SAQ retry it
    (the one way a job function can leave its entry unfinished), after FOREIGN_RETRY_SECONDS so that this worker
    does not take it straight back; the attempt SAQ counted for this dequeue is given back first, so the detours
    never use up the retries its own installation's workers will need.
    """
    job.attempts -= 1
    job.retry_delay = max(job.retry_delay, FOREIGN_RETRY_SECONDS)
    # Made by the worker's startup: each job's ctx is a shallow copy of the worker's, so this one outlives the job.
    logged: collections.OrderedDict[str, None] = ctx["foreign_logged"]
    if job.key not in logged:
        logged[job.key] = None
        if len(logged) > FOREIGN_LOGGED:
            logged.popitem(last=False)
        log.warning(
            "queue %s carries job %s of installation %s, but this is installation %s: put back for its own workers."
            " Give each installation its own queue (unset SPACE_QUEUE_NAME, or set a distinct one)",
            job.queue.name if job.queue is not None else "?",
            job.key,
            owner,
            ctx["installation"],
        )
    raise ForeignJob(f"job of installation {owner}")


def put_back(job: Job, delay: float, reason: str) -> PutBack:
    """Ready `job` to go back on its queue after `delay` seconds without using up an attempt; raise what this
    returns from the job function (SAQ retries an entry whose function raised, the one way to leave it unfinished).

    SAQ floors the retry's time to a whole second: a delay under 2 s could come round again at once.
    """
    job.attempts -= 1
    job.retry_delay = delay
    return PutBack(reason)
