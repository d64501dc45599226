"""SAQ entry points of exports. The worker's startup puts `settings`, `db` and `store` into ctx (space.worker)."""

from __future__ import annotations

import collections
import logging
import uuid
from typing import Any

from saq import Job

from space.exports.maintenance import cleanup, reconcile, wake
from space.exports.pipeline import ExportRunner, run_export
from space.exports.queue import RUN_EXPORT, TERMINAL, installation_of

log = logging.getLogger("space.exports")

FOREIGN_RETRY_SECONDS = 1.0
"""How long another installation's job waits before it is on the queue again (for its own workers to take)."""
FOREIGN_LOGGED = 1024
"""Foreign jobs one worker remembers having logged (so each is logged once, in bounded memory)."""


class ForeignJob(Exception):
    """The job belongs to another installation (another database) that shares this queue: put it back."""


async def run_export_job(ctx: Any, *, export_id: str, org_id: str) -> str:
    """SAQ job: run one export (of this installation; another's goes back on the queue)."""
    job: Job | None = ctx.get("job")
    if job is not None:
        owner = installation_of(job)
        if owner is not None and owner != str(ctx["installation"]):
            _give_back(ctx, job, owner)
    worker = ctx.get("worker")
    queue = worker.queue if worker is not None else None
    runner = ExportRunner(ctx["settings"], ctx["db"], ctx["store"], job=job, queue=queue)
    return await run_export(runner, uuid.UUID(export_id), uuid.UUID(org_id))


def _give_back(ctx: Any, job: Job, owner: str) -> None:
    """Hand another installation's job back to the queue untouched, logged once; raises ForeignJob.

    Its export is not in this database: running it would find no row and finish the entry, and the export would
    then wait for its own installation's reconciler. Raising makes SAQ retry it (the one way a job function can
    leave its entry unfinished), after FOREIGN_RETRY_SECONDS so that this worker does not take it straight back;
    the attempt SAQ counted for this dequeue is given back first, so the detours never use up the retries its own
    installation's workers will need.
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


async def wake_after_export_job(ctx: Any) -> None:
    """SAQ after_process: once an export job's queue entry has finished, wake its org (its run may have made room).

    Here and not at the end of run_export: a run refused for lack of room can't be enqueued again while its own
    entry is unfinished, so the export that made the room could not wake it then. Checking after the entry has
    finished closes that gap: a refused run sees the room made meanwhile, and enqueues the export itself.
    """
    job = ctx.get("job")
    if job is None or job.function != RUN_EXPORT or job.status not in TERMINAL:
        # Other jobs, and entries SAQ kept for a retry (that retry runs the claim again).
        return
    await wake(ctx["settings"], ctx["db"], ctx["worker"].queue, uuid.UUID(job.kwargs["org_id"]))


async def reconcile_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the reconciler."""
    return await reconcile(ctx["settings"], ctx["db"], ctx["worker"].queue)


async def cleanup_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the cleanup."""
    return await cleanup(ctx["db"], ctx["store"])
