"""The lease: one execution's claim on an export's ledger row, and every write that execution makes.

A `Lease` owns its fenced writes (renew, progress, fail, hand back, publish) and the heartbeat that keeps
it alive, so the pipeline asks the lease to act instead of threading the database and settings through
each call. Every write names the execution id and checks that it matched a row: one that matches nothing
raises LeaseLost, and the run stops writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from saq import Job, Queue
from sqlalchemy.ext.asyncio import AsyncSession

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.db.locks import lock_org_claims
from space.exports import ledger, outcomes
from space.exports.failures import Deferred, LeaseLost
from space.exports.increments import Since, Xact
from space.exports.ledger import Fence
from space.exports.models import ExportScope
from space.exports.storage.protocol import ResultKey
from space.observability import metrics

log = logging.getLogger("space.exports")

HAND_BACK_SECONDS = 2.0
"""How long a cancelled run (worker shutdown) may spend giving its export back; the lease covers the rest."""


@dataclass(frozen=True)
class Built:
    """What a finished read produced, ready to publish."""

    row_count: int
    byte_size: int
    sha256: str
    snapshot_at: dt.datetime
    xact: Xact | None = None
    """An incremental run's own snapshot, recorded for the next one, and the run it continued (None: not one)."""


@dataclass(eq=False)
class Lease:
    """A claimed execution: the export's fixed inputs, its fenced writes, and the heartbeat that keeps it."""

    db: Database
    settings: Settings
    export_id: uuid.UUID
    org_id: uuid.UUID
    execution_id: uuid.UUID
    attempt: int
    kind: str
    scope: ExportScope
    creator_id: uuid.UUID
    filters: dict[str, Any]
    delimiter: str
    schedule_id: uuid.UUID | None = None
    """The schedule that made the export (its creator must still be an owner or admin, SPEC §21)."""
    incremental: bool = False
    since: Since | None = None
    """Set by the build, inside its snapshot: the previous run an incremental run continues from."""
    queue: Queue | None = field(default=None, repr=False)
    """Where the jobs its outcome owes are enqueued after the commit (None: their sweepers send them)."""
    _heartbeat: Heartbeat | None = field(default=None, repr=False)

    @classmethod
    async def claim(
        cls, db: Database, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID, *, queue: Queue | None = None
    ) -> Lease | None:
        """Take the export with one conditional UPDATE; None when another worker owns it or it is finished.

        A claimable export that has used all its attempts fails `worker_lost` instead (its `export.failed`
        webhooks are enqueued on `queue` after the commit). Raises Deferred, and changes nothing, while the org
        already runs `export_org_concurrency` exports with a live lease.
        """
        fence = Fence(export_id, org_id, uuid.uuid4())
        max_attempts = settings.export_retries
        lost: str | None = None  # worker_lost: the kind of the export this claim failed instead
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id)) as uow:
            # The org's claims queue here, so two of them can't both count room for one more.
            await lock_org_claims(uow.session, org_id)
            expired = await ledger.lease_ran_out(uow.session, export_id, org_id)
            if await ledger.running(uow.session, org_id) >= settings.export_org_concurrency:
                lost = await fail_exhausted(uow, queue, export_id, org_id, max_attempts=max_attempts)
                if lost is None and await ledger.claimable(uow.session, export_id, org_id, max_attempts=max_attempts):
                    raise Deferred(f"org {org_id} runs {settings.export_org_concurrency} exports already")
                row = None
            else:
                row = await ledger.claim(
                    uow.session,
                    fence,
                    max_attempts=max_attempts,
                    lease_seconds=settings.export_lease_seconds,
                )
                if row is None:
                    lost = await fail_exhausted(uow, queue, export_id, org_id, max_attempts=max_attempts)
        # Counted once committed. A takeover of an expired lease is the one sure sign of a lost one: the lost
        # worker may be dead and never tell (a fenced write that fails may also be a cancel, not a loss).
        if expired and (row is not None or lost is not None):
            metrics.lease_lost()
        if lost is not None:
            metrics.export_ended(lost, "worker_lost")
        if row is None:
            return None
        return cls(
            db=db,
            settings=settings,
            export_id=export_id,
            org_id=org_id,
            execution_id=fence.execution_id,
            attempt=row.attempt,
            kind=row.kind,
            scope=ExportScope(row.scope),
            creator_id=row.creator_id,
            filters=dict(row.filters or {}),
            delimiter=row.delimiter,
            schedule_id=row.schedule_id,
            incremental=row.incremental,
            queue=queue,
        )

    @property
    def fence(self) -> Fence:
        """What every write of this execution is conditioned on."""
        return Fence(self.export_id, self.org_id, self.execution_id)

    @property
    def key(self) -> ResultKey:
        """Where this execution's bytes are stored."""
        return ResultKey(self.org_id, self.export_id, self.execution_id)

    @property
    def tenant(self) -> Tenant:
        """The export's RLS context: its org, and for `own` scope the creator's tickets only."""
        customer = self.creator_id if self.scope is ExportScope.own else None
        return Tenant(org_id=self.org_id, customer_id=customer)

    # --- fenced writes ------------------------------------------------------------------------------------------

    async def write_in(self, session: AsyncSession, **values: Any) -> None:
        """A fenced write inside a transaction the caller holds; LeaseLost when it matched no row."""
        if not await ledger.fenced(session, self.fence, **values):
            raise LeaseLost(f"execution {self.execution_id} no longer owns export {self.export_id}")

    async def _write(self, **values: Any) -> None:
        async with UnitOfWork(self.db.sessionmaker, Tenant(org_id=self.org_id)) as uow:
            await self.write_in(uow.session, **values)

    async def renew(self) -> None:
        """Push the lease out again."""
        await self._write(**ledger.renewed(self.settings.export_lease_seconds))

    async def report_progress(self, progress: int) -> None:
        """Write progress now; it renews the lease as well."""
        await self._write(progress=progress, **ledger.renewed(self.settings.export_lease_seconds))

    async def fail_in(self, uow: UnitOfWork, code: str, detail: str = "") -> None:
        """Mark the export failed with `code` (and `detail`, its words for the owner) inside the caller's
        transaction, its outcome recorded in it (`outcomes.ended`). A stale execution's failure changes nothing."""
        await self.write_in(uow.session, **ledger.failed(code, detail))
        await outcomes.ended(uow, self.queue, outcomes.failed(self.export_id, self.org_id, self.kind, code))

    async def hand_back(self) -> None:
        """Give the export back (queued, no lease) so a retry can claim it at once instead of after expiry."""
        await self._write(**ledger.handed_back())

    async def complete_in(self, uow: UnitOfWork, built: Built) -> None:
        """The fenced publish UPDATE, inside the caller's transaction (which holds the org lock), its outcome
        recorded in it (`outcomes.ended`)."""
        await self.write_in(
            uow.session,
            **ledger.completed(
                ttl_seconds=self.settings.export_ttl_seconds,
                snapshot_at=built.snapshot_at,
                row_count=built.row_count,
                byte_size=built.byte_size,
                sha256=built.sha256,
            ),
            **(built.xact.columns() if built.xact is not None else {}),
        )
        outcome = outcomes.completed(
            self.export_id, self.org_id, self.kind, row_count=built.row_count, byte_size=built.byte_size
        )
        await outcomes.ended(uow, self.queue, outcome)

    # --- the heartbeat ------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def kept(self, job: Job | None = None) -> AsyncIterator[Lease]:
        """Keep the lease alive in the background while the block runs (touching the SAQ `job` too)."""
        self._heartbeat = Heartbeat(self, job)
        self._heartbeat.start()
        try:
            yield self
        finally:
            await self._heartbeat.stop()

    def check(self) -> None:
        """Raise LeaseLost once a renewal found the lease gone: the run must stop writing."""
        if self._heartbeat is not None and self._heartbeat.lost:
            raise LeaseLost(f"execution {self.execution_id} lost its lease")

    def report(self, progress: int) -> None:
        """Have `progress` written soon, in the background (inside `kept`); it replaces a value not written yet."""
        assert self._heartbeat is not None, "report() needs the lease kept"
        self._heartbeat.report(progress)

    async def settle(self) -> None:
        """Wait until the latest reported progress has been written (or its write failed), then `check`."""
        if self._heartbeat is not None:
            await self._heartbeat.settle()
        self.check()


async def fail_exhausted(
    uow: UnitOfWork, queue: Queue | None, export_id: uuid.UUID, org_id: uuid.UUID, *, max_attempts: int
) -> str | None:
    """Fail `worker_lost` a claimable export that has used all its attempts, its outcome recorded in the same
    transaction (`outcomes.ended`; jobs enqueued on `queue` after it); its kind if one was, else None."""
    kind = await ledger.fail_exhausted(uow.session, export_id, org_id, max_attempts=max_attempts)
    if kind is None:
        return None
    await outcomes.ended(uow, queue, outcomes.failed(export_id, org_id, kind, "worker_lost"))
    return kind


class Heartbeat:
    """Renews the lease (and touches the SAQ job) every lease/3 seconds, and writes the progress the run reports.

    Progress is written here, in the background, one fenced write at a time and always the latest value
    (each write renews the lease as well): the read never stops for it. `settle` waits until the latest
    value is written; a write that finds the lease gone marks the run lost.
    """

    def __init__(self, lease: Lease, job: Job | None) -> None:
        self.lease = lease
        self.job = job
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

    def report(self, progress: int) -> None:
        """Have `progress` written soon."""
        self._wanted = progress
        self._settled.clear()
        self._wake.set()

    async def settle(self) -> None:
        """Wait until the latest reported progress has been written (or its write has failed)."""
        if self._task is not None and not self._task.done():
            await self._settled.wait()

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.lease.settings.export_lease_seconds / 3
        due = loop.time() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, due - loop.time()))
            self._wake.clear()
            progress, beat = self._wanted, loop.time() >= due
            if progress is not None and progress != self._written:
                write = self.lease.report_progress(progress)
            elif beat:
                write = self.lease.renew()
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
                if self.job is not None:
                    with contextlib.suppress(Exception):
                        await self.job.update()
