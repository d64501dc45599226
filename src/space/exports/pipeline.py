"""One export, top to bottom (SPEC §5 steps 1-8): claim -> check -> read -> store -> publish.

`run_export` is the whole pipeline; `check`, `build` and `publish` are its steps. Tests pause it at named
points through `gate` (an injected coroutine; production passes none).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import psycopg.errors
from saq import Job, Queue
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork, server_version
from space.errors import NotFound
from space.exports import increments, ledger
from space.exports.failures import Deferred, ExportFailure, LeaseLost
from space.exports.formats.base import Batch, Format
from space.exports.formats.registry import KINDS, ExportKind
from space.exports.lease import HAND_BACK_SECONDS, Built, Lease
from space.exports.models import ExportScope, ExportState
from space.exports.storage.chunks import ChunkWriter
from space.exports.storage.protocol import ResultStore
from space.observability import logs, metrics
from space.orgs import service as orgs
from space.orgs.models import OrgState, Role

log = logging.getLogger("space.exports")

Gate = Callable[[str, Lease], Awaitable[None]]
"""Called at named points: claimed, eligible, counted, batch, before_publish, publish_locked, finished."""

READ_AHEAD_BYTES = 2 * 1024 * 1024
"""How far the snapshot's reader may run ahead of the store."""


async def _open(point: str, lease: Lease) -> None:
    return None


@dataclass
class ExportRunner:
    """What a run needs: settings, the app-role database, the result store, the SAQ job to touch, and the queue
    the jobs its outcome owes (webhook deliveries) are enqueued on after commit: the outbound lane's, never the
    export queue (None: their sweepers send them)."""

    settings: Settings
    db: Database
    store: ResultStore
    job: Job | None = None
    queue: Queue | None = None


async def run_export(runner: ExportRunner, export_id: uuid.UUID, org_id: uuid.UUID, *, gate: Gate = _open) -> str:
    """Claim, check, build, publish. Returns the outcome: completed, a failure code, `lease_lost`, `not_claimed`, or
    `deferred` (the org runs its limit of exports; the worker wakes the org again when one of them ends).

    Business failures (limits, access, org state, timeout) are final and written fenced. Any other error
    gives the export back and re-raises so SAQ retries, except on the last attempt, which fails it.
    """
    # Every log line of the run names the export (SPEC §16), and once claimed its execution and attempt.
    with logs.bound(export_id=str(export_id), org_id=str(org_id)):
        outcome = await _run(runner, export_id, org_id, gate)
    return outcome


async def _run(runner: ExportRunner, export_id: uuid.UUID, org_id: uuid.UUID, gate: Gate) -> str:
    started = asyncio.get_running_loop().time()
    try:
        lease = await Lease.claim(runner.db, runner.settings, export_id, org_id, queue=runner.queue)
    except Deferred:
        log.info("export deferred: its org runs its limit of exports")
        return "deferred"
    if lease is None:
        return "not_claimed"
    logs.bind(execution_id=str(lease.execution_id), attempt=lease.attempt)
    log.info("export claimed", extra={"kind": lease.kind})
    await gate("claimed", lease)
    built: Built | None = None
    async with lease.kept(runner.job):
        try:
            built = await build(runner, lease, gate)
            lease.check()
            await gate("before_publish", lease)
            outcome = await publish(runner, lease, built, gate)
        except ExportFailure as failure:
            outcome = await _fail(runner, lease, failure.code, failure.detail)
        except LeaseLost:
            # Cancelled (by its owner, an admin, or a role change) or taken over: this execution is never
            # published, so its chunks go now rather than at the next cleanup. No other execution's are touched.
            with contextlib.suppress(Exception):
                await runner.store.delete(lease.key)
            outcome = "lease_lost"
        except asyncio.CancelledError:
            # Shutdown or SAQ's timeout: hand the export back so the next claim need not wait for the lease.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(lease.hand_back(), timeout=HAND_BACK_SECONDS)
            raise
        except Exception:
            if lease.attempt >= runner.settings.export_retries:
                log.exception("export %s failed on its last attempt", export_id)
                outcome = await _fail(runner, lease, "internal_error")
            else:
                log.warning("export %s attempt %d failed; retrying", export_id, lease.attempt, exc_info=True)
                with contextlib.suppress(Exception):
                    await lease.hand_back()
                raise
    _report(lease, outcome, asyncio.get_running_loop().time() - started, built)
    # Everything after this point (reporting to the queue) may fail without touching the ledger.
    await gate("finished", lease)
    return outcome


def _report(lease: Lease, outcome: str, seconds: float, built: Built | None) -> None:
    """The run's log line and metrics, once its outcome is in the ledger."""
    if outcome == "lease_lost":
        # Another execution took the export, or it was cancelled: the one that ends it reports it.
        log.warning("export run stopped: its execution no longer owns the export")
        return
    if outcome == ExportState.completed.value and built is not None:
        metrics.export_completed(lease.kind, seconds, built.row_count, built.byte_size)
        log.info(
            "export completed",
            extra={"kind": lease.kind, "rows": built.row_count, "bytes": built.byte_size, "seconds": round(seconds, 3)},
        )
        return
    metrics.export_ended(lease.kind, outcome)
    log.warning("export failed", extra={"kind": lease.kind, "error_code": outcome})


async def check(session: AsyncSession, lease: Lease, org_state: str | None) -> uuid.UUID:
    """Step 2: the org is not being deleted, the creator is still a member, team scope needs staff.

    Returns the creator's membership id (for `assignment=mine`). Raises ExportFailure otherwise.
    """
    if org_state is None or org_state in (OrgState.deleting.value, OrgState.deleted.value):
        raise ExportFailure("org_deleting", "The organization is being deleted.")
    membership = await orgs.membership_of(session, lease.org_id, lease.creator_id)
    if membership is None:
        raise ExportFailure("access_revoked", "The export's owner is no longer a member.")
    if lease.scope is ExportScope.team and not Role(membership.role).is_staff:
        raise ExportFailure("access_revoked", "The export's owner no longer has a staff role.")
    if lease.schedule_id is not None and Role(membership.role) not in orgs.MANAGERS:
        # SPEC §21: a schedule is an owner's or admin's; its runs stop with its creator's role.
        raise ExportFailure("access_revoked", "The schedule's creator is no longer an owner or admin.")
    return membership.id


async def build(runner: ExportRunner, lease: Lease, gate: Gate = _open) -> Built:
    """Steps 2-5: re-check eligibility, read in one REPEATABLE READ READ ONLY transaction, store the chunks."""
    settings = runner.settings
    # The kind's own bounds: one export's, or the complete archive's (far higher, rows per member file).
    kind = KINDS[ExportKind(lease.kind)]
    limits = kind.limits(settings)
    async with UnitOfWork(runner.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
        membership_id = await check(uow.session, lease, await orgs.org_state(uow.session, lease.org_id))
    await gate("eligible", lease)
    chunk_bytes = runner.store.chunk_bytes(max(1, int(settings.export_chunk_bytes * kind.chunk_share)))
    out = ChunkWriter(runner.store, lease.key, chunk_bytes, limits)
    rows = 0
    try:
        async with (
            asyncio.timeout(limits.timeout_seconds),
            UnitOfWork(runner.db.sessionmaker, lease.tenant, isolation="REPEATABLE READ", read_only=True) as uow,
        ):
            await _bound_transaction(uow.session, limits.timeout_seconds)
            await _not_pooled(uow.session)
            # now() is the transaction's start: the moment the snapshot stands for.
            snapshot_at: dt.datetime = (await uow.session.execute(select(func.now()))).scalar_one()
            xact = None
            if lease.incremental:
                # The run's own snapshot (kept for the next run) and the previous run's, which bounds this one.
                xact = await increments.begin(uow.session, lease.org_id, lease.schedule_id, lease.export_id)
                lease.since = xact.since
            source = await _format(uow.session, lease, membership_id)
            counts = await source.count(uow.session)
            limits.check_rows(counts)
            total = sum(counts.values())
            await _prefer_keyset_plans(uow.session, incremental=lease.since is not None)
            await gate("counted", lease)
            await out.write(source.header(snapshot_at))
            # The snapshot's backend reads the next batches while this task stores and reports the current one.
            async with ReadAhead(
                source.batches(uow.session, settings.export_batch_rows, settings.export_batch_bytes)
            ) as batches:
                async for batch in batches:
                    await out.write(batch.data)
                    if not batch.rows:
                        continue
                    rows += batch.rows
                    lease.check()
                    lease.report(progress_of(rows, total))
                    if gate is not _open:
                        # Whoever stops the run here sees this batch's progress written.
                        await lease.settle()
                    await gate("batch", lease)
            await out.write(source.footer())
        await out.close()
        await lease.settle()
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            # Shutdown: the hand-back that follows must not wait on a blocked chunk write. A write landing
            # later belongs to this execution, which is never published, so the cleanup removes it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.discard(), HAND_BACK_SECONDS)
        else:
            # No chunk write may land after a failure is recorded (the failure deletes the execution's chunks).
            await out.discard()
        if isinstance(exc, TimeoutError):
            raise limits.timed_out() from None
        # statement_timeout cancels the query; PostgreSQL 17+'s transaction_timeout ends the session. Batches
        # run on the driver connection itself, so its errors arrive unwrapped too.
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(cause, (psycopg.errors.QueryCanceled, psycopg.errors.TransactionTimeout)):
            raise limits.timed_out() from None
        raise
    return Built(row_count=rows, byte_size=out.total, sha256=out.sha256, snapshot_at=snapshot_at, xact=xact)


async def publish(runner: ExportRunner, lease: Lease, built: Built, gate: Gate = _open) -> str:
    """Step 6: under the org lock, re-check eligibility and the org's result quota, and run the fenced UPDATE.
    Returns the outcome.

    An ineligible export, or one that would take the org's stored results past their quota, is failed in the
    same transaction (still fenced); its chunks are then deleted. Raises LeaseLost when the execution no
    longer owns the export: nothing is published or failed.
    """
    outcome = ExportState.completed.value
    async with UnitOfWork(runner.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
        try:
            state: str | None = (await orgs.lock_org(uow.session, lease.org_id)).state
        except NotFound:
            state = None
        await gate("publish_locked", lease)
        try:
            await check(uow.session, lease, state)
            # Under the org lock: publishes of one org are ordered, so none counts without another's bytes.
            await _within_quota(uow.session, lease, built.byte_size, runner.settings.org_result_quota_bytes)
        except ExportFailure as failure:
            await lease.fail_in(uow, failure.code, failure.detail)
            outcome = failure.code
        else:
            await lease.complete_in(uow, built)
    if outcome != ExportState.completed.value:
        await runner.store.delete(lease.key)
    return outcome


async def _within_quota(session: AsyncSession, lease: Lease, size: int, quota: int) -> None:
    stored = await ledger.stored_bytes(session, lease.org_id)
    if stored + size > quota:
        # The org's stored total is not in the words: a customer sees them, and the total counts others' results.
        raise ExportFailure(
            "quota_exceeded",
            f"{size} bytes would take the organization's stored results past its quota of {quota} bytes"
            " (SPACE_ORG_RESULT_QUOTA_BYTES). Delete older exports, then request it again.",
        )


async def _fail(runner: ExportRunner, lease: Lease, code: str, detail: str = "") -> str:
    try:
        async with UnitOfWork(runner.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
            await lease.fail_in(uow, code, detail)
    except LeaseLost:
        return "lease_lost"
    await runner.store.delete(lease.key)
    return code


def progress_of(rows: int, total: int) -> int:
    """SPEC §5 step 4: at most 95 until the publish sets 100."""
    return min(95, round(rows / max(total, 1) * 95))


async def _format(session: AsyncSession, lease: Lease, membership_id: uuid.UUID) -> Format:
    # Opened inside the snapshot transaction: whatever a kind reads to begin is part of the snapshot too.
    return await KINDS[ExportKind(lease.kind)].open(session, lease, membership_id)


async def _bound_transaction(session: AsyncSession, timeout_seconds: float) -> None:
    ms = str(max(1, int(timeout_seconds * 1000)))
    await session.execute(
        text("SELECT set_config('statement_timeout', :ms, true), set_config('TimeZone', 'UTC', true)"), {"ms": ms}
    )
    # PostgreSQL 17 bounds the whole transaction too; older servers rely on the asyncio timeout around it.
    if await server_version(session) >= 170000:
        await session.execute(text("SELECT set_config('transaction_timeout', :ms, true)"), {"ms": ms})


async def _not_pooled(session: AsyncSession) -> None:
    # libpq keeps a connection's buffers at the size of the largest message it carried, for the connection's
    # life. The read's messages are batches (bounded by SPACE_EXPORT_BATCH_BYTES, plus one row), still far more
    # than the API's: the read's connection is closed when the read ends instead of going back to the pool.
    connection = await session.connection()
    await connection.run_sync(lambda sync: sync.detach())


async def _prefer_keyset_plans(session: AsyncSession, *, incremental: bool = False) -> None:
    # The RLS predicates defeat the planner's row estimates (it believes a handful of rows match), so for
    # every batch it would scan and sort the whole remainder: quadratic in the rows. A keyset batch is best
    # served by walking the (org_id, key) index in order and stopping at the LIMIT, which these settings
    # make it choose. Small batches gain nothing from parallel workers. An incremental run reads the few changed
    # rows through the (org_id, row_xid) index and sorts them: walking the key's index would read every row.
    if incremental:
        await session.execute(
            text(
                "SELECT set_config('enable_seqscan', 'off', true),"
                " set_config('max_parallel_workers_per_gather', '0', true)"
            )
        )
        return
    await session.execute(
        text(
            "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),"
            " set_config('max_parallel_workers_per_gather', '0', true)"
        )
    )


class ReadAhead:
    """Reads a batch source in a task of its own, up to `ahead_bytes` ahead of the consumer.

    While the consumer stores one batch (another connection, another database backend), the snapshot's
    backend is already producing the next: the two run on two cores. Leaving the block, normally or not,
    stops the reader and waits for it, so nothing uses the snapshot connection afterwards.
    """

    def __init__(self, source: AsyncIterator[Batch], ahead_bytes: int = READ_AHEAD_BYTES) -> None:
        self._source = source
        self._limit = ahead_bytes
        self._items: collections.deque[Batch | BaseException | None] = collections.deque()
        self._queued = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def _put(self, item: Batch | BaseException | None) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._queued < self._limit)
            self._items.append(item)
            self._queued += len(item.data) if isinstance(item, Batch) else 0
            self._changed.notify_all()

    async def _pump(self) -> None:
        try:
            async for batch in self._source:
                await self._put(batch)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, which raises it
            await self._put(exc)
        else:
            await self._put(None)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._pump(), name="export-read-ahead")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Batch:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            item = self._items.popleft()
            self._queued -= len(item.data) if isinstance(item, Batch) else 0
            self._changed.notify_all()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item
