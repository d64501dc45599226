"""The export worker (SPEC §5 steps 1-8) and the periodic reconciler and cleanup.

`run_export` is the whole pipeline; `claim`, `build` and `publish` are its steps, callable one by one.
Tests pause it at named points through `gate` (an injected coroutine; production passes none).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg.errors
from saq import Job, Queue
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.errors import NotFound
from space.exports import lease as leases
from space.exports.lease import Built, ExportFailure, Lease, LeaseLost
from space.exports.models import ExportJob, ExportKind, ExportScope, ExportState
from space.exports.queue import enqueue_export, has_live_entry
from space.exports.storage import ChunkSink, ResultKey, ResultStore
from space.exports.writers import ReadAhead, Snapshot, TicketsCsv, Writer, iso
from space.orgs.models import Organization
from space.orgs.service import lock_org

log = logging.getLogger("space.exports")

Gate = Callable[[str, Lease], Awaitable[None]]
"""Called at named points: claimed, eligible, counted, batch, before_publish, publish_locked, finished."""


async def _open(point: str, lease: Lease) -> None:
    return None


@dataclass
class ExportRunner:
    """What a run needs: settings, the app-role database, the result store, and the SAQ job to touch."""

    settings: Settings
    db: Database
    store: ResultStore
    job: Job | None = None


def progress_of(rows: int, total: int) -> int:
    """SPEC §5 step 4: at most 95 until the publish sets 100."""
    return min(95, round(rows / max(total, 1) * 95))


def key_of(lease: Lease) -> ResultKey:
    """The store key of the lease's execution."""
    return ResultKey(lease.org_id, lease.export_id, lease.execution_id)


@dataclass
class ChunkWriter:
    """Cuts the byte stream into fixed-size chunks, hashing and counting as it goes; enforces the byte limit.

    Two buffers of one chunk each, allocated once: one is hashed and stored in the background (through the
    store's sink, one connection for the execution) while the other fills, so the read never waits for an
    insert and memory stays at two chunks, whatever the size of the result. `close` stores the rest and waits;
    `discard` waits for the write in flight without storing more.
    """

    store: ResultStore
    key: ResultKey
    chunk_bytes: int
    byte_limit: int
    total: int = 0
    seq: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    filled: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    spare: bytearray = field(default_factory=bytearray)
    pending: asyncio.Task[None] | None = None
    sink: ChunkSink | None = None
    exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes; store every full chunk."""
        size = len(data)
        if self.total + size > self.byte_limit:
            raise ExportFailure("too_large", f"The result exceeds {self.byte_limit} bytes.")
        self.total += size
        view = memoryview(data).cast("B")
        while view:
            if not self.buffer:
                self.buffer = bytearray(self.chunk_bytes)
            n = min(len(view), self.chunk_bytes - self.filled)
            self.buffer[self.filled : self.filled + n] = view[:n]
            self.filled += n
            view = view[n:]
            if self.filled == self.chunk_bytes:
                await self._put()

    async def close(self) -> None:
        """Store the last partial chunk and wait until every chunk is stored."""
        if self.filled or self.seq == 0:
            await self._put()
        await self._settle()
        await self.exits.aclose()
        self.buffer = self.spare = bytearray()

    async def discard(self) -> None:
        """After a failure: wait for the chunk in flight (its error is moot), so no write lands afterwards."""
        if self.pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.pending)
            self.pending = None
        with contextlib.suppress(Exception):
            await self.exits.aclose()
        self.buffer = self.spare = bytearray()

    async def _settle(self) -> None:
        if self.pending is not None:
            task, self.pending = self.pending, None
            await task

    async def _store(self, sink: ChunkSink, seq: int, data: memoryview) -> None:
        # Chunks are hashed in order (one in flight at a time), in a thread: hashlib lets go of the GIL, so the
        # event loop (the read, and in `space up` the API) runs meanwhile.
        await asyncio.gather(asyncio.to_thread(self.digest.update, data), sink.write(seq, data))

    async def _put(self) -> None:
        # The spare buffer is free once the write in flight (which reads it) has finished.
        await self._settle()
        if self.sink is None:
            self.sink = await self.exits.enter_async_context(self.store.sink(self.key))
        data = memoryview(self.buffer)[: self.filled]
        self.pending = asyncio.create_task(self._store(self.sink, self.seq, data), name="export-chunk")
        self.seq += 1
        self.buffer, self.spare, self.filled = self.spare, self.buffer, 0


class Heartbeat:
    """Keeps the lease while the run is alive: renews it (and touches the SAQ job) every lease/3 seconds, and
    writes the progress the run reports.

    Progress is written here, in the background, one fenced write at a time and always the latest value
    (each write renews the lease as well): the read never stops for it. `settle` waits until the latest
    value is written; a write that finds the lease gone marks the run lost.
    """

    def __init__(self, runner: ExportRunner, lease: Lease) -> None:
        self.runner = runner
        self.lease = lease
        self.lost = False
        self._task: asyncio.Task[None] | None = None
        self._wanted: int | None = None
        self._written: int | None = None
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._settled.set()

    def start(self) -> None:
        """Begin renewing in the background."""
        self._task = asyncio.create_task(self._beat(), name=f"export-heartbeat-{self.lease.export_id}")

    async def stop(self) -> None:
        """Stop renewing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def check(self) -> None:
        """Raise LeaseLost once a renewal found the lease gone: the run must stop writing."""
        if self.lost:
            raise LeaseLost(f"execution {self.lease.execution_id} lost its lease")

    def report(self, progress: int) -> None:
        """Have `progress` written soon; it replaces a value not written yet."""
        self._wanted = progress
        self._settled.clear()
        self._wake.set()

    async def settle(self) -> None:
        """Wait until the latest reported progress has been written (or its write has failed), then `check`."""
        if self._task is not None and not self._task.done():
            await self._settled.wait()
        self.check()

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.runner.settings.export_lease_seconds / 3
        due = loop.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, due - loop.time()))
            self._wake.clear()
            progress, beat = self._wanted, loop.time() >= due
            if progress is not None and progress != self._written:
                write = leases.report_progress(self.runner.db.sessionmaker, self.runner.settings, self.lease, progress)
            elif beat:
                write = leases.extend(self.runner.db.sessionmaker, self.runner.settings, self.lease)
            else:
                self._settled.set()
                continue
            try:
                await write
                self._written = progress
            except LeaseLost:
                self.lost = True
                self._settled.set()
                return
            except Exception:
                # A failed write is not a lost lease; the next beat (or a fenced write) decides.
                log.warning("lease renewal of export %s failed", self.lease.export_id, exc_info=True)
            if self._wanted == progress:
                self._settled.set()
            if beat:
                due = loop.time() + interval
                if self.runner.job is not None:
                    with contextlib.suppress(Exception):
                        await self.runner.job.update()


async def claim(runner: ExportRunner, export_id: uuid.UUID, org_id: uuid.UUID) -> Lease | None:
    """Step 1: take the export, or None."""
    return await leases.claim(runner.db.sessionmaker, runner.settings, export_id, org_id)


async def _eligibility(runner: ExportRunner, lease: Lease) -> uuid.UUID:
    async with UnitOfWork(runner.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
        return await leases.check_eligible(uow.session, lease, await leases.org_state(uow.session, lease.org_id))


async def _writer(session: AsyncSession, lease: Lease, membership_id: uuid.UUID) -> Writer:
    if lease.kind == ExportKind.snapshot:
        # Read inside the snapshot transaction, like every other byte of the file.
        name = await session.scalar(select(Organization.name).where(Organization.id == lease.org_id))
        return Snapshot(lease.org_id, name or "")
    # Own scope: the creator condition beside RLS lets the (org_id, creator_id, number) index serve it.
    creator = lease.creator_id if lease.scope is ExportScope.own else None
    return TicketsCsv.from_stored(lease.org_id, lease.filters, membership_id, lease.delimiter, creator)


async def _bound_transaction(uow: UnitOfWork, settings: Settings) -> None:
    ms = str(max(1, int(settings.export_timeout_seconds * 1000)))
    await uow.session.execute(
        text("SELECT set_config('statement_timeout', :ms, true), set_config('TimeZone', 'UTC', true)"), {"ms": ms}
    )
    # PostgreSQL 17 bounds the whole transaction too; older servers rely on the asyncio timeout around it.
    if int(await uow.session.scalar(text("SELECT current_setting('server_version_num')")) or 0) >= 170000:
        await uow.session.execute(text("SELECT set_config('transaction_timeout', :ms, true)"), {"ms": ms})


async def _prefer_keyset_plans(uow: UnitOfWork) -> None:
    # The RLS predicates defeat the planner's row estimates (it believes a handful of rows match), so for
    # every batch it would scan and sort the whole remainder: quadratic in the rows. A keyset batch is best
    # served by walking the (org_id, key) index in order and stopping at the LIMIT, which these settings
    # make it choose. Small batches gain nothing from parallel workers.
    await uow.session.execute(
        text(
            "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),"
            " set_config('max_parallel_workers_per_gather', '0', true)"
        )
    )


async def build(runner: ExportRunner, lease: Lease, heartbeat: Heartbeat | None = None, gate: Gate = _open) -> Built:
    """Steps 2-5: re-check eligibility, read in one REPEATABLE READ READ ONLY transaction, store the chunks."""
    settings = runner.settings
    membership_id = await _eligibility(runner, lease)
    await gate("eligible", lease)
    out = ChunkWriter(runner.store, key_of(lease), settings.export_chunk_bytes, settings.export_byte_limit)
    rows = 0
    try:
        async with (
            asyncio.timeout(settings.export_timeout_seconds),
            UnitOfWork(runner.db.sessionmaker, lease.tenant, isolation="REPEATABLE READ", read_only=True) as uow,
        ):
            await _bound_transaction(uow, settings)
            # now() is the transaction's start: the moment the snapshot stands for.
            snapshot_at = (await uow.session.execute(select(func.now(), iso(func.now())))).one()
            writer = await _writer(uow.session, lease, membership_id)
            total = await writer.count(uow.session)
            if total > settings.export_row_limit:
                raise ExportFailure("too_many_rows", f"{total} rows exceed the limit of {settings.export_row_limit}.")
            await _prefer_keyset_plans(uow)
            await gate("counted", lease)
            await out.write(writer.header(snapshot_at[1]))
            # The snapshot's backend reads the next batches while this task stores and reports the current one.
            async with ReadAhead(writer.batches(uow.session, settings.export_batch_rows)) as batches:
                async for batch in batches:
                    await out.write(batch.data)
                    if not batch.rows:
                        continue
                    rows += batch.rows
                    if heartbeat is None:
                        await leases.report_progress(runner.db.sessionmaker, settings, lease, progress_of(rows, total))
                    else:
                        heartbeat.check()
                        heartbeat.report(progress_of(rows, total))
                        if gate is not _open:
                            # Whoever stops the run here sees this batch's progress written.
                            await heartbeat.settle()
                    await gate("batch", lease)
            await out.write(writer.footer())
        await out.close()
        if heartbeat is not None:
            await heartbeat.settle()
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            # Shutdown: the hand-back that follows must not wait on a blocked chunk write. A write landing
            # later belongs to this execution, which is never published, so the cleanup removes it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.discard(), leases.HAND_BACK_SECONDS)
        else:
            # No chunk write may land after a failure is recorded (the failure deletes the execution's chunks).
            await out.discard()
        if isinstance(exc, TimeoutError):
            raise ExportFailure("timeout", "The export's read took longer than allowed.") from None
        # statement_timeout cancels the query; PostgreSQL 17+'s transaction_timeout ends the session. Batches
        # run on the driver connection itself, so its errors arrive unwrapped too.
        cause = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(cause, (psycopg.errors.QueryCanceled, psycopg.errors.TransactionTimeout)):
            raise ExportFailure("timeout", "The export's read took longer than allowed.") from None
        raise
    return Built(row_count=rows, byte_size=out.total, sha256=out.digest.hexdigest(), snapshot_at=snapshot_at[0])


async def publish(runner: ExportRunner, lease: Lease, built: Built, gate: Gate = _open) -> str:
    """Step 6: under the org lock, re-check eligibility and run the fenced UPDATE. Returns the outcome.

    An ineligible export is failed in the same transaction (still fenced); its chunks are then deleted.
    Raises LeaseLost when the execution no longer owns the export: nothing is published or failed.
    """
    outcome = ExportState.completed.value
    async with UnitOfWork(runner.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
        try:
            state: str | None = (await lock_org(uow.session, lease.org_id)).state
        except NotFound:
            state = None
        await gate("publish_locked", lease)
        try:
            await leases.check_eligible(uow.session, lease, state)
        except ExportFailure as failure:
            await leases.fail_in(uow.session, lease, failure.code)
            outcome = failure.code
        else:
            await leases.complete_in(uow.session, runner.settings, lease, built)
    if outcome != ExportState.completed.value:
        await runner.store.delete(key_of(lease))
    return outcome


async def _fail(runner: ExportRunner, lease: Lease, code: str) -> str:
    try:
        await leases.fail(runner.db.sessionmaker, lease, code)
    except LeaseLost:
        return "lease_lost"
    await runner.store.delete(key_of(lease))
    return code


async def run_export(runner: ExportRunner, export_id: uuid.UUID, org_id: uuid.UUID, *, gate: Gate = _open) -> str:
    """Claim, build, publish. Returns the outcome: completed, a failure code, `lease_lost` or `not_claimed`.

    Business failures (limits, access, org state, timeout) are final and written fenced. Any other error
    gives the export back and re-raises so SAQ retries, except on the last attempt, which fails it.
    """
    lease = await claim(runner, export_id, org_id)
    if lease is None:
        return "not_claimed"
    await gate("claimed", lease)
    heartbeat = Heartbeat(runner, lease)
    heartbeat.start()
    try:
        built = await build(runner, lease, heartbeat, gate)
        heartbeat.check()
        await gate("before_publish", lease)
        outcome = await publish(runner, lease, built, gate)
    except ExportFailure as failure:
        outcome = await _fail(runner, lease, failure.code)
    except LeaseLost:
        outcome = "lease_lost"
    except asyncio.CancelledError:
        # Shutdown or SAQ's timeout: hand the export back so the next claim need not wait for the lease.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(leases.release(runner.db.sessionmaker, lease), timeout=leases.HAND_BACK_SECONDS)
        raise
    except Exception:
        if lease.attempt >= runner.settings.export_retries:
            log.exception("export %s failed on its last attempt", export_id)
            outcome = await _fail(runner, lease, "internal_error")
        else:
            log.warning("export %s attempt %d failed; retrying", export_id, lease.attempt, exc_info=True)
            with contextlib.suppress(Exception):
                await leases.release(runner.db.sessionmaker, lease)
            raise
    finally:
        await heartbeat.stop()
    # Everything after this point (reporting to the queue) may fail without touching the ledger.
    await gate("finished", lease)
    return outcome


async def reconcile(settings: Settings, db: Database, queue: Queue, limit: int = 500) -> dict[str, int]:
    """Re-enqueue queued exports and expired-lease running exports that have no live queue entry.

    Running exports whose lease ran out after their last attempt fail `worker_lost` instead.
    """
    async with UnitOfWork(db.sessionmaker) as uow:
        candidates = (
            await uow.session.execute(text("SELECT * FROM space_exports_reconcile_candidates(:n)"), {"n": limit})
        ).all()
    requeued = failed = 0
    for export_id, org_id, state, attempt in candidates:
        if state == ExportState.running.value and attempt >= settings.export_retries:
            failed += await leases.fail_exhausted(db.sessionmaker, settings, export_id, org_id)
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
        expired = (
            await uow.session.execute(text("SELECT * FROM space_exports_expired_results(:n)"), {"n": limit})
        ).all()
    purged = 0
    for export_id, org_id in expired:
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            execution_id = await uow.session.scalar(
                update(ExportJob)
                .where(
                    ExportJob.id == export_id,
                    ExportJob.org_id == org_id,
                    ExportJob.state == ExportState.completed.value,
                    ExportJob.purged_at.is_(None),
                    ExportJob.expires_at <= func.clock_timestamp(),
                )
                .values(purged_at=func.clock_timestamp())
                .returning(ExportJob.execution_id)
                .execution_options(synchronize_session=False)
            )
        if execution_id is not None:
            await store.delete(ResultKey(org_id, export_id, execution_id))
            purged += 1
    async with UnitOfWork(db.sessionmaker) as uow:
        orphans = (
            await uow.session.execute(text("SELECT * FROM space_exports_orphan_executions(:n)"), {"n": limit})
        ).all()
    chunks = 0
    for export_id, org_id, execution_id in orphans:
        chunks += await store.delete(ResultKey(org_id, export_id, execution_id))
    return {"purged": purged, "orphan_executions": len(orphans), "orphan_chunks": chunks}


# SAQ entry points. The worker's startup puts settings, db, store into ctx (see space.worker).


async def run_export_job(ctx: Any, *, export_id: str, org_id: str) -> str:
    """SAQ job: run one export."""
    runner = ExportRunner(ctx["settings"], ctx["db"], ctx["store"], job=ctx.get("job"))
    return await run_export(runner, uuid.UUID(export_id), uuid.UUID(org_id))


async def reconcile_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the reconciler."""
    return await reconcile(ctx["settings"], ctx["db"], ctx["worker"].queue)


async def cleanup_exports_job(ctx: Any) -> dict[str, int]:
    """SAQ cron: the cleanup."""
    return await cleanup(ctx["db"], ctx["store"])
