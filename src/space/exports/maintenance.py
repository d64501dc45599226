"""Periodic work over every org's exports: the reconciler (lost queue entries) and the cleanup (expired results,
chunks of executions that were never published)."""

from __future__ import annotations

import logging

from saq import Queue

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports import ledger
from space.exports.models import ExportState
from space.exports.queue import enqueue_export, has_live_entry
from space.exports.storage import ResultKey, ResultStore

log = logging.getLogger("space.exports")


async def reconcile(settings: Settings, db: Database, queue: Queue, limit: int = 500) -> dict[str, int]:
    """Re-enqueue queued exports and expired-lease running exports that have no live queue entry.

    Running exports whose lease ran out after their last attempt fail `worker_lost` instead.
    """
    async with UnitOfWork(db.sessionmaker) as uow:
        candidates = await ledger.reconcile_candidates(uow.session, limit)
    requeued = failed = 0
    for export_id, org_id, state, attempt in candidates:
        if state == ExportState.running.value and attempt >= settings.export_retries:
            async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
                failed += await ledger.fail_exhausted(
                    uow.session, export_id, org_id, max_attempts=settings.export_retries
                )
            continue
        if await has_live_entry(queue, export_id):
            continue
        if await enqueue_export(queue, settings, export_id, org_id):
            log.info("reconciler enqueued export %s (%s)", export_id, state)
            requeued += 1
    return {"requeued": requeued, "failed": failed}


async def cleanup(db: Database, store: ResultStore, limit: int = 500) -> dict[str, int]:
    """Delete results past expiresAt (the row stays, marked purged) and chunks of unpublished executions."""
    async with UnitOfWork(db.sessionmaker) as uow:
        expired = await ledger.expired_results(uow.session, limit)
    purged = 0
    for export_id, org_id in expired:
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            execution_id = await ledger.mark_purged(uow.session, export_id, org_id)
        if execution_id is not None:
            await store.delete(ResultKey(org_id, export_id, execution_id))
            purged += 1
    async with UnitOfWork(db.sessionmaker) as uow:
        orphans = await ledger.orphan_executions(uow.session, limit)
    chunks = 0
    for export_id, org_id, execution_id in orphans:
        chunks += await store.delete(ResultKey(org_id, export_id, execution_id))
    return {"purged": purged, "orphan_executions": len(orphans), "orphan_chunks": chunks}
