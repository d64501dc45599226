"""SAQ queues and worker settings; registers every job and cron entry, each in its lane.

A worker process runs two SAQ Workers on one app-role database: the export lane (the installation's queue,
SPACE_WORKER_CONCURRENCY slots: export runs and the export crons) and the outbound lane (`<queue>-outbound`,
SPACE_OUTBOUND_CONCURRENCY slots: webhook deliveries and every other `space.outbox` channel, and their sweepers).
A receiver that never answers holds an outbound slot, never an export's.

`space worker` runs `run_worker` alone (it then owns SIGINT/SIGTERM); `space up` runs it as a task beside
the API, which owns the signals and cancels the task. Either way it stops cleanly: running exports hand
their lease back, and the pools close.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import signal
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from saq import CronJob, Queue, Worker
from saq.types import PartialTimersDict

from space.config import Settings
from space.db import Database, app_url, check_app_role
from space.destinations.jobs import deliver_export_job, sweep_deliveries_job
from space.destinations.outbox import DELIVER_EXPORT
from space.exports.jobs import cleanup_exports_job, reconcile_exports_job, run_export_job, wake_after_export_job
from space.exports.lease import HAND_BACK_SECONDS
from space.exports.queue import RUN_EXPORT
from space.exports.storage.factory import open_result_store
from space.imports.jobs import reconcile_imports_job, run_import_job
from space.imports.service import RUN_IMPORT
from space.notifications.jobs import send_email_job, send_personal_email_job, sweep_emails_job
from space.notifications.outbox import SEND_EMAIL, SEND_PERSONAL_EMAIL
from space.observability.metrics import WorkerMetricsServer
from space.orgs.jobs import purge_due_job
from space.queue import PutBack, QueueIdentity, guarded, make_queue, queue_identity
from space.schedules.jobs import run_due_schedules_job
from space.webhooks.jobs import deliver_webhook_job, sweep_webhooks_job
from space.webhooks.outbox import DELIVER_WEBHOOK

log = logging.getLogger("space.worker")

OUTBOUND_POOL_SIZE = 4
"""Database connections the outbound lane keeps open (SQLAlchemy adds up to 10 more while they are all busy)."""

EVERY_MINUTE = "* * * * *"
EVERY_FIVE_MINUTES = "*/5 * * * *"


def cadence_seconds(settings: Settings) -> int:
    """How often stuck queue entries are swept and lost ones reconciled: once a lease, at most once a minute.

    A killed worker's export can be claimed again once its lease runs out; finding it sooner gains nothing,
    and finding it much later leaves it stalled for no reason.
    """
    return max(1, min(60, math.ceil(settings.export_lease_seconds)))


def every(seconds: int) -> str:
    """A cron expression for `seconds` (croniter's sixth field is the second)."""
    return EVERY_MINUTE if seconds >= 60 else f"* * * * * */{seconds}"


class _QuietPutBacks(logging.Filter):
    """Drops SAQ's "Error processing job" traceback for a job put back on its queue (`space.queue.PutBack`: another
    installation's, or an outbound attempt at its org's cap): it is not an error, and whoever put it back has said
    so where it matters (SAQ would log it at every pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record whose exception is a PutBack."""
        return not (record.exc_info and isinstance(record.exc_info[1], PutBack))


def _quiet_put_backs() -> None:
    saq_log = logging.getLogger("saq")
    if not any(isinstance(f, _QuietPutBacks) for f in saq_log.filters):
        saq_log.addFilter(_QuietPutBacks())


@dataclass(frozen=True)
class Lanes:
    """A worker process's two SAQ Workers and their app-role databases (disposed by `close`, once both have
    stopped). Each lane has its own pool: outbound claims waiting on an org's lock never hold a connection an
    export needs."""

    exports: Worker[Any]
    outbound: Worker[Any]
    db: Database
    outbound_db: Database

    @property
    def workers(self) -> tuple[Worker[Any], Worker[Any]]:
        """Both workers, exports first."""
        return (self.exports, self.outbound)

    async def close(self) -> None:
        """Close the app role's pools (after both workers have stopped)."""
        try:
            await self.outbound_db.dispose()
        finally:
            await self.db.dispose()


async def build_workers(
    settings: Settings, *, application_name: str = "space-worker", serve_metrics: bool = False
) -> Lanes:
    """The export and outbound workers of this installation, whose ctx carries `settings`, `db` (app role, a pool
    per lane) and `installation` for every job (the export lane's also `store` and `outbound_queue`); with `serve_metrics`, the
    export worker serves /metrics on SPACE_WORKER_METRICS_PORT (0: none) while it runs."""
    assert settings.database_url, "the worker needs a database URL"
    db = Database(app_url(settings.database_url, settings.app_database_url), application_name=application_name)
    try:
        # Before anything else, the installation id included: a role that could see past RLS stops the worker
        # (AppRoleError), before it takes any job.
        async with db.engine.connect() as conn:
            await check_app_role(conn)
        identity = await queue_identity(settings, db)
    except BaseException:
        await db.dispose()
        raise
    _quiet_put_backs()
    # Short transactions only (a claim, a settle, the sweeper's read): a small pool, overflowing when it must.
    outbound_db = Database(db.url, application_name=f"{application_name}-outbound", pool_size=OUTBOUND_POOL_SIZE)
    queue = make_queue(
        settings,
        identity,
        application_name=f"{application_name}-queue",
        max_connections=4 + 2 * settings.worker_concurrency,
    )
    # An attempt touches SAQ's tables when it starts and ends, never while it waits for its receiver.
    outbound_queue = make_queue(
        settings,
        identity.outbound(),
        application_name=f"{application_name}-outbound-queue",
        max_connections=4 + settings.outbound_concurrency,
    )
    cadence = cadence_seconds(settings)
    # SAQ sweeps entries whose heartbeat (one lease) stopped; sweeping once a lease finds them in time.
    # The other timers are SAQ's defaults (its typing wants every key).
    timers: PartialTimersDict = {"schedule": 1, "worker_info": 10, "sweep": cadence, "abort": 1}
    # Shown by SAQ's worker info: which installation each worker of a queue serves.
    metadata = {"installation": str(identity.installation)}
    exports = _export_worker(settings, db, identity, queue, outbound_queue, timers, metadata, serve_metrics)

    outbound_exits = contextlib.AsyncExitStack()

    async def outbound_startup(ctx: Any) -> None:
        ctx["settings"] = settings
        ctx["db"] = outbound_db
        # Deliveries to a customer's bucket (SPEC §22) read the results they copy.
        ctx["store"] = await outbound_exits.enter_async_context(open_result_store(settings, outbound_db))
        ctx["installation"] = identity.installation
        ctx["foreign_logged"] = collections.OrderedDict()  # of other installations' jobs, each logged once
        log.info(
            "outbound lane of installation %s on queue %s, %d slots",
            identity.installation,
            outbound_queue.name,
            settings.outbound_concurrency,
        )

    async def outbound_shutdown(ctx: Any) -> None:
        await outbound_exits.aclose()

    # Every job and cron entry is `guarded`: one of another installation sharing the broker is handed back.
    outbound: Worker[Any] = Worker(
        outbound_queue,
        functions=[
            (DELIVER_WEBHOOK, guarded(deliver_webhook_job)),
            (SEND_EMAIL, guarded(send_email_job)),
            (SEND_PERSONAL_EMAIL, guarded(send_personal_email_job)),
            (DELIVER_EXPORT, guarded(deliver_export_job)),
        ],
        cron_jobs=[
            CronJob(guarded(sweep_webhooks_job), cron=EVERY_MINUTE, timeout=60),
            CronJob(guarded(sweep_emails_job), cron=EVERY_MINUTE, timeout=60),
            CronJob(guarded(sweep_deliveries_job), cron=EVERY_MINUTE, timeout=60),
        ],
        concurrency=settings.outbound_concurrency,
        startup=outbound_startup,
        shutdown=outbound_shutdown,
        timers=timers,
        metadata=metadata,
    )
    for worker in (exports, outbound):
        # Signals are decided by run_worker: inside `space up` they belong to the API server.
        worker.SIGNALS = []
    return Lanes(exports, outbound, db, outbound_db)


def _export_worker(
    settings: Settings,
    db: Database,
    identity: QueueIdentity,
    queue: Queue,
    outbound_queue: Queue,
    timers: PartialTimersDict,
    metadata: dict[str, str],
    serve_metrics: bool,
) -> Worker[Any]:
    exits = contextlib.AsyncExitStack()
    metrics = (
        WorkerMetricsServer(settings.host, settings.worker_metrics_port)
        if serve_metrics and settings.worker_metrics_port
        else None
    )

    async def startup(ctx: Any) -> None:
        ctx["settings"] = settings
        ctx["db"] = db
        ctx["store"] = await exits.enter_async_context(open_result_store(settings, db))
        ctx["installation"] = identity.installation
        # What an ended export owes (webhook deliveries, ...) is enqueued here: the outbound lane's queue.
        ctx["outbound_queue"] = outbound_queue
        ctx["foreign_logged"] = collections.OrderedDict()  # of other installations' jobs, each logged once
        log.info("worker of installation %s on queue %s", identity.installation, identity.name)
        if metrics is not None:
            metrics.start(db)

    async def shutdown(ctx: Any) -> None:
        if metrics is not None:
            metrics.stop()
        await exits.aclose()

    # Every job and cron entry is `guarded`: one of another installation sharing the broker is handed back.
    cadence = cadence_seconds(settings)
    cron_jobs: Any = [
        CronJob(guarded(reconcile_exports_job), cron=every(cadence), timeout=60),
        CronJob(guarded(cleanup_exports_job), cron=EVERY_FIVE_MINUTES, timeout=300),
        CronJob(guarded(purge_due_job), cron=EVERY_MINUTE, timeout=300),
        CronJob(guarded(run_due_schedules_job), cron=EVERY_MINUTE, timeout=60),
        CronJob(guarded(reconcile_imports_job), cron=EVERY_MINUTE, timeout=60),
    ]
    return Worker(
        queue,
        functions=[(RUN_EXPORT, guarded(run_export_job)), (RUN_IMPORT, guarded(run_import_job))],
        cron_jobs=cron_jobs,
        concurrency=settings.worker_concurrency,
        startup=startup,
        shutdown=shutdown,
        # An export of an org that ran its limit waits with no queue entry; each ending export job wakes its org.
        after_process=wake_after_export_job,
        timers=timers,
        # On shutdown SAQ cancels running jobs and, after this deadline, cancels them again: a cancelled export
        # must first get to give itself back (bounded by HAND_BACK_SECONDS) and SAQ to requeue its entry.
        # SAQ's default (1 s) cut the hand-back short, leaving the export to wait out its lease.
        cancellation_hard_deadline_s=HAND_BACK_SECONDS + 3,
        metadata=metadata,
    )


async def run_worker(settings: Settings, *, started: asyncio.Event | None = None, serve_metrics: bool = False) -> None:
    """Run both lanes until cancelled, or until SIGINT/SIGTERM when it is the process's only job; set `started` once
    both are up."""
    lanes = await build_workers(settings, serve_metrics=serve_metrics)
    if started is not None:
        up: set[int] = set()

        def marker(worker: Worker[Any]) -> Any:
            # SAQ runs its start-up hooks once the queue is connected, right before it takes jobs.
            async def mark_started(ctx: Any) -> None:
                up.add(id(worker))
                if len(up) == len(lanes.workers):
                    started.set()

            return mark_started

        for worker in lanes.workers:
            worker.startup = [*(worker.startup or []), marker(worker)]
    loop = asyncio.get_running_loop()
    # Nobody else handles SIGTERM: this is `space worker`, and the signals are ours.
    standalone = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    )
    signals = [signal.SIGINT, signal.SIGTERM] if standalone else []

    def stop() -> None:
        for worker in lanes.workers:
            worker.event.set()

    for signum in signals:
        loop.add_signal_handler(signum, stop)
    try:
        for worker in lanes.workers:
            await worker.queue.connect()
        await _run(lanes)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        for worker in lanes.workers:
            with contextlib.suppress(Exception):
                await _bounded(worker.queue.disconnect(), f"disconnecting queue {worker.queue.name}")
        await _bounded(lanes.close(), "closing the lanes' database pools")
    # Worker.start swallows cancellation while stopping; pass it on to whoever cancelled us.
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


STOP_STEP_SECONDS = HAND_BACK_SECONDS + 5
"""Bound on each step of stopping (the workers, then each queue, then the pools): past it the step is left behind
with a warning naming it, so that a stop never hangs (a stop of `space up` or of a test's worker was seen, rarely,
not to end)."""


async def _bounded(step: Awaitable[Any], what: str) -> None:
    """Await one step of stopping for at most STOP_STEP_SECONDS; past it, log a warning and go on, leaving the step
    running (not `wait_for`, which would wait for its cancellation, and a step that hangs may not honour one)."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=STOP_STEP_SECONDS)
    if not done:
        log.warning("%s took longer than %.0f s; left behind", what, STOP_STEP_SECONDS)
        return
    task.result()


async def _run(lanes: Lanes) -> None:
    """Both workers until one of them ends (a signal ends both); then the other stops too."""
    tasks = [asyncio.create_task(w.start(), name=f"saq-{w.queue.name}") for w in lanes.workers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # Cancelled (`space up` stopping): each worker stops as it did alone, its running jobs cancelled and handed back.
        for t in tasks:
            t.cancel()
        await _bounded(asyncio.gather(*tasks, return_exceptions=True), "stopping the lanes' workers")
        raise
    # One lane ended (a signal set both events, or it failed): the other stops too, by its event, so that a stop
    # already under way is never cut short.
    for worker in lanes.workers:
        worker.event.set()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
