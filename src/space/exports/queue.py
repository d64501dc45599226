"""The export's queue entry: the job that carries an export id, and its enqueue after commit. The queue itself
(its name, the installation stamp, the guard) is `space.queue`."""

from __future__ import annotations

import logging
import math
import uuid

from saq import Job, Queue

from space.config import Settings
from space.exports.formats.registry import KINDS, ExportKind

log = logging.getLogger("space.exports")

RUN_EXPORT = "run_export_job"


def export_job(settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID, kind: ExportKind) -> Job:
    """The SAQ job of an export of `kind`: key = export id (one queue entry per export), explicit limits."""
    lease = math.ceil(settings.export_lease_seconds)
    return Job(
        function=RUN_EXPORT,
        kwargs={"export_id": str(export_id), "org_id": str(org_id)},
        key=str(export_id),
        # The read is bounded by the kind's timeout (an archive's is its own, far longer); publishing and a last
        # heartbeat fit in the rest.
        timeout=KINDS[kind].limits(settings).queue_timeout(settings.export_lease_seconds),
        # The run touches the job every lease/3 s; SAQ sweeps it as stuck after a whole lease without one.
        heartbeat=lease,
        # SAQ counts attempts: retries=N allows N runs. The ledger's own `attempt` is the real bound.
        retries=settings.export_retries,
    )


async def enqueue_export(
    queue: Queue, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID, kind: ExportKind
) -> bool:
    """Put the export's job on the queue; False when an unfinished entry with that key already exists."""
    return await queue.enqueue(export_job(settings, export_id, org_id, kind)) is not None


async def enqueue_quietly(
    queue: Queue, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID, kind: ExportKind
) -> None:
    """After-commit enqueue: a broker error is logged, not raised. The row is committed; the reconciler retries."""
    try:
        await enqueue_export(queue, settings, export_id, org_id, kind)
    except Exception:
        log.exception("enqueue of export %s failed; the reconciler will enqueue it", export_id)
