"""Work over the orgs' exports: the wake-up (an org has room to run its next export), the reconciler (lost queue
entries) and the cleanup (expired results, chunks of executions that were never published)."""

from __future__ import annotations

import logging
import uuid

from saq import Queue

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import NotFound
from space.exports import ledger
from space.exports.lease import fail_exhausted
from space.exports.models import ExportState
from space.exports.queue import enqueue_export
from space.exports.storage.protocol import ResultKey, ResultStore
from space.observability import metrics
from space.orgs import service as orgs

log = logging.getLogger("space.exports")


async def wake(settings: Settings, db: Database, queue: Queue, org_id: uuid.UUID) -> int:
    """Enqueue the org's oldest waiting exports, as many as it has room to run now; how many were enqueued.

    An org's exports beyond its concurrency wait in the ledger with no queue entry (creation does not enqueue
    them, and a claim refused for lack of room, `deferred`, ends its entry), so whoever may have made room
    calls this: the worker after each export job of the org has left the queue, and the reconciler. An
    export that still has an unfinished entry is not enqueued twice (the key dedupes).
    """
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        # Under the org lock, which creation decides under: an export created meanwhile is either seen here, or
        # saw the room this wake-up is for and enqueued itself.
        try:
            await orgs.lock_org(uow.session, org_id)
        except NotFound:
            return 0
        room = settings.export_org_concurrency - await ledger.running(uow.session, org_id)
        waiting = await ledger.waiting(uow.session, org_id, room)
    woken = 0
    for export_id, kind in waiting:
        if await enqueue_export(queue, settings, export_id, org_id, kind):
            log.info("enqueued waiting export %s of org %s", export_id, org_id)
            woken += 1
    return woken


async def reconcile(settings: Settings, db: Database, queue: Queue, limit: int = 500) -> dict[str, int]:
    """Wake every org with queued exports or expired-lease running ones (re-enqueueing those with no live queue
    entry, as many as the org may run).

    Running exports whose lease ran out after their last attempt fail `worker_lost` instead.
    """
    async with UnitOfWork(db.sessionmaker) as uow:
        candidates = await ledger.reconcile_candidates(uow.session, limit)
    failed = 0
    orgs: dict[uuid.UUID, None] = {}  # in the candidates' order: oldest waiting export first
    for export_id, org_id, state, attempt in candidates:
        if state == ExportState.running.value and attempt >= settings.export_retries:
            async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
                kind = await fail_exhausted(uow, queue, export_id, org_id, max_attempts=settings.export_retries)
            if kind is not None:
                failed += 1
                # A running export whose lease ran out: its last execution lost it.
                metrics.lease_lost()
                metrics.export_ended(kind, "worker_lost")
            continue
        orgs[org_id] = None
    requeued = 0
    for org_id in orgs:
        requeued += await wake(settings, db, queue, org_id)
    return {"requeued": requeued, "failed": failed}


async def cleanup(db: Database, store: ResultStore, limit: int = 500) -> dict[str, int]:
    """Delete results past expiresAt (the row stays, marked purged) and the store's bytes of unpublished
    executions (chunks; with S3 objects, and unfinished uploads)."""
    async with UnitOfWork(db.sessionmaker) as uow:
        expired = await ledger.expired_results(uow.session, limit)
    purged = 0
    for export_id, org_id in expired:
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            execution_id = await ledger.mark_purged(uow.session, export_id, org_id)
        if execution_id is not None:
            await store.delete(ResultKey(org_id, export_id, execution_id))
            purged += 1
    return {"purged": purged, **await store.sweep(limit)}
