"""The purge: organizations past their grace period lose every tenant row, in small batches, then become tombstones.

Finding due orgs is the one cross-org read; it goes through the SECURITY DEFINER function
`space_maintenance_due_purges()` (migration 0002), which returns ids only. Each batch then runs as the app
role inside that org's tenant context, in its own short transaction under the org lock, and adds what it
deleted to `organizations.purged_counts` in the same transaction: a crash between batches loses nothing
and the next run carries on where this one stopped, with exact counts.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CursorResult, func, select, text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.storage.factory import open_result_store
from space.exports.storage.protocol import ResultStore
from space.orgs.lifecycle import Action, change_state, is_due
from space.orgs.service import lock_org

log = logging.getLogger("space.purge")

PURGE_TABLES: tuple[str, ...] = (
    "export_chunks",
    "export_jobs",
    "schedules",
    "webhook_attempts",
    "webhook_deliveries",
    "webhook_endpoints",
    "destination_deliveries",
    "destinations",
    "notifications",
    "tickets",
    "tasks",
    "projects",
    "ticket_counters",
    "invitations",
    "audit_events",
    "memberships",
)
"""Every table holding an org's rows, children before parents (foreign keys). Missing tables are skipped."""

_DELETE_BATCH = "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE org_id = :org LIMIT :n))"
# The audit trail is append-only for the app role: its rows go through the one function allowed to delete
# them (migration 0008), which does so only for the due org of this transaction's tenant context.
_DELETE_STATEMENTS = {"audit_events": "SELECT space_audit_purge(:org, :n)"}

PURGE_BATCH_ROWS = 1000
"""Rows deleted per transaction: keeps each lock short and each transaction small."""

MAX_SWEEPS = 3
"""Passes over the tables per run before giving up until the next run (rows keep appearing: a bug elsewhere)."""

MAX_ORGS_PER_RUN = 100
"""Orgs taken per run; the next run takes the rest."""

AfterBatch = Callable[[uuid.UUID, str, int], Awaitable[None]]
"""Called after each committed batch with (org id, table, rows deleted)."""


@dataclass(frozen=True)
class PurgeResult:
    """One org turned into a tombstone, with the rows purged per table."""

    org_id: uuid.UUID
    counts: dict[str, int]


class _NotDue(Exception):
    """The org stopped being due (cancelled, already purged): leave it alone."""


async def purge_due_job(ctx: dict[str, Any]) -> dict[str, Any]:
    """SAQ cron entry: purge every organization whose grace period is over."""
    results = await purge_due(ctx["settings"], ctx["db"], store=ctx.get("store"))
    return {"purged": [{"orgId": str(r.org_id), "counts": r.counts} for r in results]}


async def purge_due(
    settings: Settings,
    db: Database,
    *,
    batch_rows: int = PURGE_BATCH_ROWS,
    after_batch: AfterBatch | None = None,
    store: ResultStore | None = None,
) -> list[PurgeResult]:
    """Purge every due organization; one that fails is logged and retried on the next run.

    `store` is where results live (the worker's); without one, the store the settings name is opened for the run.
    """
    async with contextlib.AsyncExitStack() as exits:
        if store is None:
            store = await exits.enter_async_context(open_result_store(settings, db))
        results = []
        for org_id in await due_org_ids(db):
            try:
                result = await purge_org(db, org_id, batch_rows=batch_rows, after_batch=after_batch, store=store)
            except Exception:
                log.exception("purge of org %s stopped; the next run resumes it", org_id)
                continue
            if result is not None:
                results.append(result)
        return results


async def due_org_ids(db: Database, limit: int = MAX_ORGS_PER_RUN) -> list[uuid.UUID]:
    """Ids of orgs in `deleting` past deleteAfter, through the privileged maintenance function."""
    async with UnitOfWork(db.sessionmaker) as uow:
        rows = await uow.session.execute(
            text("SELECT org_id FROM space_maintenance_due_purges(:n) AS org_id"), {"n": limit}
        )
        return list(rows.scalars())


async def purge_org(
    db: Database,
    org_id: uuid.UUID,
    *,
    batch_rows: int = PURGE_BATCH_ROWS,
    after_batch: AfterBatch | None = None,
    store: ResultStore | None = None,
) -> PurgeResult | None:
    """Delete one due org's rows batch by batch, and its stored results outside the database (`store`), then
    leave the tombstone; None if it is no longer due."""
    tables = await _existing_tables(db, org_id)
    try:
        for _ in range(MAX_SWEEPS):
            for table in tables:
                while (n := await _delete_batch(db, org_id, table, batch_rows, tables)) > 0:
                    if after_batch is not None:
                        await after_batch(org_id, table, n)
            if store is not None:
                # Before the tombstone: a failure here leaves the org `deleting`, and the next run deletes again.
                # Its export rows are gone, so no upload still running can be published; one that completes
                # after this has no ledger row, and the cleanup's sweep deletes it.
                removed = await store.delete_org(org_id)
                if removed:
                    log.info("purge of org %s: deleted %d stored result(s)", org_id, removed)
            finished = await _finish(db, org_id, tables)
            if finished is not None:
                return finished
            # A row slipped in after its table was emptied (a request that began before the deletion): sweep again.
    except _NotDue:
        return None
    raise RuntimeError(f"org {org_id} still has rows after {MAX_SWEEPS} sweeps; the next run retries")


async def _existing_tables(db: Database, org_id: uuid.UUID) -> tuple[str, ...]:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        present = set(
            (
                await uow.session.execute(
                    text(
                        "SELECT t FROM unnest(CAST(:tables AS text[])) t WHERE to_regclass('public.' || t) IS NOT NULL"
                    ),
                    {"tables": list(PURGE_TABLES)},
                )
            ).scalars()
        )
    return tuple(t for t in PURGE_TABLES if t in present)


async def _delete_batch(db: Database, org_id: uuid.UUID, table: str, batch_rows: int, tables: tuple[str, ...]) -> int:
    """One short transaction: lock the org, check it is still due, delete up to batch_rows rows, count them."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        org = await lock_org(session, org_id)
        if not is_due(org, await _now(uow)):
            raise _NotDue()
        # RLS limits both the inner SELECT and the DELETE to this org; the WHERE only makes it use the index.
        # Table names are interpolated only from PURGE_TABLES, never from input.
        statement = _DELETE_STATEMENTS.get(table)
        params = {"org": org_id, "n": batch_rows}
        if statement is not None:
            deleted = int(await session.scalar(text(statement), params) or 0)
        else:
            result = await session.execute(text(_DELETE_BATCH.format(table=table)), params)
            assert isinstance(result, CursorResult)
            deleted = int(result.rowcount)
        # Counts live on the org row, written in the batch's own transaction; the first batch also marks
        # the purge as started, which ends the owner's chance to cancel.
        counts = {t: 0 for t in tables} | dict(org.purged_counts or {})
        counts[table] = int(counts.get(table, 0)) + deleted
        org.purged_counts = counts
        await session.flush()
        return deleted


async def _finish(db: Database, org_id: uuid.UUID, tables: tuple[str, ...]) -> PurgeResult | None:
    """Tombstone the org if nothing of it is left; None if a row remains (the caller sweeps again)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
        session = uow.session
        org = await lock_org(session, org_id)
        if not is_due(org, await _now(uow)):
            raise _NotDue()
        for table in tables:
            left = await session.scalar(
                text(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE org_id = :org)"), {"org": org_id}
            )
            if left:
                return None
        if org.purged_counts is None:
            org.purged_counts = {t: 0 for t in tables}
            await session.flush()
        org = await change_state(session, org_id, Action.purge, actor_id=None)
        counts = {k: int(v) for k, v in (org.purged_counts or {}).items()}
    log.info("purged org %s: %s", org_id, counts)
    return PurgeResult(org_id, counts)


async def _now(uow: UnitOfWork) -> Any:
    return (await uow.session.execute(select(func.now()))).scalar_one()
