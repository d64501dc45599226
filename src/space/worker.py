"""SAQ queue and worker settings; registers every job and cron entry.

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
from typing import Any

from saq import CronJob, Worker
from saq.types import PartialTimersDict

from space.config import Settings
from space.db import Database, app_url, check_app_role
from space.exports.jobs import cleanup_exports_job, reconcile_exports_job, run_export_job, wake_after_export_job
from space.exports.lease import HAND_BACK_SECONDS
from space.exports.queue import RUN_EXPORT
from space.exports.storage.factory import open_result_store
from space.notifications.jobs import send_email_job, sweep_emails_job
from space.notifications.outbox import SEND_EMAIL
from space.observability.metrics import WorkerMetricsServer
from space.orgs.jobs import purge_due_job
from space.queue import ForeignJob, guarded, make_queue, queue_identity
from space.webhooks.jobs import deliver_webhook_job, sweep_webhooks_job
from space.webhooks.outbox import DELIVER_WEBHOOK

log = logging.getLogger("space.worker")

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


class _QuietForeignJobs(logging.Filter):
    """Drops SAQ's "Error processing job" traceback for a job handed back to another installation: it is not an
    error, and `space.queue.guarded` has logged it once already (SAQ would log it at every pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record whose exception is ForeignJob."""
        return not (record.exc_info and isinstance(record.exc_info[1], ForeignJob))


def _quiet_foreign_jobs() -> None:
    saq_log = logging.getLogger("saq")
    if not any(isinstance(f, _QuietForeignJobs) for f in saq_log.filters):
        saq_log.addFilter(_QuietForeignJobs())


async def build_worker(
    settings: Settings, *, application_name: str = "space-worker", serve_metrics: bool = False
) -> Worker[Any]:
    """A SAQ worker on this installation's queue, whose ctx carries `settings`, `db` (app role), `store` and
    `installation` for every job; with `serve_metrics`, it serves /metrics on SPACE_WORKER_METRICS_PORT (0: none)
    while it runs."""
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
    queue = make_queue(
        settings,
        identity,
        application_name=f"{application_name}-queue",
        max_connections=4 + 2 * settings.worker_concurrency,
    )
    _quiet_foreign_jobs()
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
        ctx["foreign_logged"] = collections.OrderedDict()  # of other installations' jobs, each logged once
        log.info("worker of installation %s on queue %s", identity.installation, identity.name)
        if metrics is not None:
            metrics.start(db)

    async def shutdown(ctx: Any) -> None:
        try:
            if metrics is not None:
                metrics.stop()
            await exits.aclose()
        finally:
            await db.dispose()

    # Every job and cron entry is `guarded`: one of another installation sharing the broker is handed back.
    functions: Any = [
        (RUN_EXPORT, guarded(run_export_job)),
        (DELIVER_WEBHOOK, guarded(deliver_webhook_job)),
        (SEND_EMAIL, guarded(send_email_job)),
    ]
    cadence = cadence_seconds(settings)
    # SAQ sweeps entries whose heartbeat (one lease) stopped; sweeping once a lease finds them in time.
    # The other timers are SAQ's defaults (its typing wants every key).
    timers: PartialTimersDict = {"schedule": 1, "worker_info": 10, "sweep": cadence, "abort": 1}
    cron_jobs: Any = [
        CronJob(guarded(reconcile_exports_job), cron=every(cadence), timeout=60),
        CronJob(guarded(cleanup_exports_job), cron=EVERY_FIVE_MINUTES, timeout=300),
        CronJob(guarded(purge_due_job), cron=EVERY_MINUTE, timeout=300),
        CronJob(guarded(sweep_webhooks_job), cron=EVERY_MINUTE, timeout=60),
        CronJob(guarded(sweep_emails_job), cron=EVERY_MINUTE, timeout=60),
    ]
    worker: Worker[Any] = Worker(
        queue,
        functions=functions,
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
        # Shown by SAQ's worker info: which installation each worker of a queue serves.
        metadata={"installation": str(identity.installation)},
    )
    # Signals are decided by run_worker: inside `space up` they belong to the API server.
    worker.SIGNALS = []
    return worker


async def run_worker(settings: Settings, *, started: asyncio.Event | None = None, serve_metrics: bool = False) -> None:
    """Run a worker until cancelled, or until SIGINT/SIGTERM when it is the process's only job; set `started` once it is up."""
    worker = await build_worker(settings, serve_metrics=serve_metrics)
    if started is not None:
        # SAQ runs its start-up hooks once the queue is connected, right before it takes jobs.
        async def mark_started(ctx: Any) -> None:
            started.set()

        worker.startup = [*(worker.startup or []), mark_started]
    loop = asyncio.get_running_loop()
    # Nobody else handles SIGTERM: this is `space worker`, and the signals are ours.
    standalone = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (
        signal.SIG_DFL,
        None,
    )
    signals = [signal.SIGINT, signal.SIGTERM] if standalone else []
    for signum in signals:
        loop.add_signal_handler(signum, lambda: worker.event.set())
    try:
        await worker.queue.connect()
        await worker.start()
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
        with contextlib.suppress(Exception):
            await worker.queue.disconnect()
    # Worker.start swallows cancellation while stopping; pass it on to whoever cancelled us.
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
