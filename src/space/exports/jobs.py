"""SAQ entry points of exports. The worker's startup puts `settings`, `db`, `store` and `outbound_queue` (the
outbound lane's queue, where what an ended export owes is enqueued) into ctx (space.worker)."""

from __future__ import annotations

import uuid
from typing import Any

from saq import Job

from space.exports.maintenance import cleanup, reconcile, wake
from space.exports.pipeline import ExportRunner, run_export
from space.exports.queue import RUN_EXPORT
from space.queue import TERMINAL


async def run_export_job(ctx: Any, *, export_id: str, org_id: str) -> str:
    """SAQ job: run one export (the worker registers it `guarded`: another installation's goes back on the queue)."""
    job: Job | None = ctx.get("job")
    runner = ExportRunner(ctx["settings"], ctx["db"], ctx["store"], job=job, queue=ctx.get("outbound_queue"))
    return await run_export(runner, uuid.UUID(export_id), uuid.UUID(org_id))


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
    return await reconcile(ctx["settings"], ctx["db"], ctx["worker"].queue, outbound=ctx.get("outbound_queue"))


async def cleanup_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the cleanup."""
    return await cleanup(ctx["db"], ctx["store"])
