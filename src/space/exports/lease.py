"""The lease: a fenced ledger row. Every write of a worker names its execution id and checks the row count.

Time always comes from the database clock (`clock_timestamp()`), never from the worker's host.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.types import Interval

from space.config import Settings
from space.db import Tenant, UnitOfWork
from space.exports.models import ExportJob, ExportScope, ExportState
from space.orgs.models import Membership, Organization, OrgState, Role

HAND_BACK_SECONDS = 2.0
"""How long a cancelled run (worker shutdown) may spend giving its export back; the lease covers the rest."""


class LeaseLost(Exception):
    """A fenced write matched no row: another execution owns the export now, or it was cancelled."""


class ExportFailure(Exception):
    """The export can't be produced, for a reason the owner is told (`errorCode`). Not retried."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(detail or code)
        self.code = code


@dataclass(frozen=True)
class Lease:
    """What a successful claim hands the worker: the execution it owns and the export's fixed inputs."""

    export_id: uuid.UUID
    org_id: uuid.UUID
    execution_id: uuid.UUID
    attempt: int
    kind: str
    scope: ExportScope
    creator_id: uuid.UUID
    filters: dict[str, Any]
    delimiter: str

    @property
    def tenant(self) -> Tenant:
        """The export's RLS context: its org, and for `own` scope the creator's tickets only."""
        customer = self.creator_id if self.scope is ExportScope.own else None
        return Tenant(org_id=self.org_id, customer_id=customer)


@dataclass(frozen=True)
class Built:
    """What a finished read produced, ready to publish."""

    row_count: int
    byte_size: int
    sha256: str
    snapshot_at: dt.datetime


def _seconds(value: float) -> Any:
    return bindparam(None, dt.timedelta(seconds=value), type_=Interval)


def _now() -> Any:
    return func.clock_timestamp()


def _fence(lease: Lease) -> tuple[Any, ...]:
    return (
        ExportJob.id == lease.export_id,
        ExportJob.org_id == lease.org_id,
        ExportJob.execution_id == lease.execution_id,
        ExportJob.state == ExportState.running.value,
    )


def _claimable() -> Any:
    # Queued, or running under a lease that has run out (its worker is gone or stalled).
    return or_(
        ExportJob.state == ExportState.queued.value,
        and_(ExportJob.state == ExportState.running.value, ExportJob.lease_expires_at < _now()),
    )


def _uow(sessionmaker: async_sessionmaker[AsyncSession], org_id: uuid.UUID) -> UnitOfWork:
    return UnitOfWork(sessionmaker, Tenant(org_id=org_id))


async def claim(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID
) -> Lease | None:
    """Take the export with one conditional UPDATE; None when another worker owns it or it is finished.

    A claimable export that has used all its attempts fails `worker_lost` instead.
    """
    execution_id = uuid.uuid4()
    async with _uow(sessionmaker, org_id) as uow:
        row = (
            await uow.session.execute(
                update(ExportJob)
                .where(
                    ExportJob.id == export_id,
                    ExportJob.org_id == org_id,
                    ExportJob.deleted_at.is_(None),
                    ExportJob.attempt < settings.export_retries,
                    _claimable(),
                )
                .values(
                    state=ExportState.running.value,
                    execution_id=execution_id,
                    attempt=ExportJob.attempt + 1,
                    lease_expires_at=_now() + _seconds(settings.export_lease_seconds),
                    started_at=func.coalesce(ExportJob.started_at, _now()),
                    progress=0,
                    error_code=None,
                )
                .returning(
                    ExportJob.attempt,
                    ExportJob.kind,
                    ExportJob.scope,
                    ExportJob.creator_id,
                    ExportJob.filters,
                    ExportJob.delimiter,
                )
                .execution_options(synchronize_session=False)
            )
        ).first()
        if row is None:
            await _fail_exhausted(uow.session, settings, export_id, org_id)
            return None
    return Lease(
        export_id=export_id,
        org_id=org_id,
        execution_id=execution_id,
        attempt=row.attempt,
        kind=row.kind,
        scope=ExportScope(row.scope),
        creator_id=row.creator_id,
        filters=dict(row.filters or {}),
        delimiter=row.delimiter,
    )


async def _fail_exhausted(session: AsyncSession, settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID) -> bool:
    result = await session.execute(
        update(ExportJob)
        .where(
            ExportJob.id == export_id,
            ExportJob.org_id == org_id,
            ExportJob.deleted_at.is_(None),
            ExportJob.attempt >= settings.export_retries,
            _claimable(),
        )
        .values(
            state=ExportState.failed.value,
            error_code="worker_lost",
            lease_expires_at=None,
            completed_at=_now(),
        )
        .returning(ExportJob.id)
        .execution_options(synchronize_session=False)
    )
    return result.first() is not None


async def fail_exhausted(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, export_id: uuid.UUID, org_id: uuid.UUID
) -> bool:
    """Fail `worker_lost` an export whose lease ran out after its last allowed attempt."""
    async with _uow(sessionmaker, org_id) as uow:
        return await _fail_exhausted(uow.session, settings, export_id, org_id)


async def _fenced(session: AsyncSession, lease: Lease, **values: Any) -> None:
    result = await session.execute(
        update(ExportJob)
        .where(*_fence(lease))
        .values(**values)
        .returning(ExportJob.id)
        .execution_options(synchronize_session=False)
    )
    if result.first() is None:
        raise LeaseLost(f"execution {lease.execution_id} no longer owns export {lease.export_id}")


async def extend(sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, lease: Lease) -> None:
    """Heartbeat: push the lease out again (fenced)."""
    async with _uow(sessionmaker, lease.org_id) as uow:
        await _fenced(uow.session, lease, lease_expires_at=_now() + _seconds(settings.export_lease_seconds))


async def report_progress(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings, lease: Lease, progress: int
) -> None:
    """Write progress (fenced); it renews the lease as well."""
    async with _uow(sessionmaker, lease.org_id) as uow:
        await _fenced(
            uow.session,
            lease,
            progress=progress,
            lease_expires_at=_now() + _seconds(settings.export_lease_seconds),
        )


def fail_values(code: str) -> dict[str, Any]:
    """The columns a failure sets."""
    return {
        "state": ExportState.failed.value,
        "error_code": code,
        "lease_expires_at": None,
        "completed_at": _now(),
    }


async def fail(sessionmaker: async_sessionmaker[AsyncSession], lease: Lease, code: str) -> None:
    """Mark the export failed with `code` (fenced: a stale worker's failure changes nothing)."""
    async with _uow(sessionmaker, lease.org_id) as uow:
        await _fenced(uow.session, lease, **fail_values(code))


async def fail_in(session: AsyncSession, lease: Lease, code: str) -> None:
    """`fail`, inside a transaction the caller holds (the publish step, under the org lock)."""
    await _fenced(session, lease, **fail_values(code))


async def release(sessionmaker: async_sessionmaker[AsyncSession], lease: Lease) -> None:
    """Give the export back (queued, no lease) so a retry can claim it at once instead of after expiry."""
    async with _uow(sessionmaker, lease.org_id) as uow:
        await _fenced(uow.session, lease, state=ExportState.queued.value, lease_expires_at=None)


async def complete_in(session: AsyncSession, settings: Settings, lease: Lease, built: Built) -> None:
    """The fenced publish UPDATE, inside the caller's transaction (which holds the org lock)."""
    # statement_timestamp(): after the lock wait, so the TTL starts when the result really appears.
    now = func.statement_timestamp()
    await _fenced(
        session,
        lease,
        state=ExportState.completed.value,
        progress=100,
        error_code=None,
        completed_at=now,
        expires_at=now + _seconds(settings.export_ttl_seconds),
        snapshot_at=built.snapshot_at,
        row_count=built.row_count,
        byte_size=built.byte_size,
        sha256=built.sha256,
        lease_expires_at=None,
    )


async def check_eligible(session: AsyncSession, lease: Lease, org_state: str | None) -> uuid.UUID:
    """SPEC §5 step 2: the org is not being deleted, the creator is still a member, team scope needs staff.

    Returns the creator's membership id (for `assignment=mine`). Raises ExportFailure otherwise.
    """
    if org_state is None or org_state in (OrgState.deleting.value, OrgState.deleted.value):
        raise ExportFailure("org_deleting", "The organization is being deleted.")
    row = (
        await session.execute(
            select(Membership.id, Membership.role).where(
                Membership.org_id == lease.org_id, Membership.user_id == lease.creator_id
            )
        )
    ).first()
    if row is None:
        raise ExportFailure("access_revoked", "The export's owner is no longer a member.")
    if lease.scope is ExportScope.team and not Role(row.role).is_staff:
        raise ExportFailure("access_revoked", "The export's owner no longer has a staff role.")
    membership_id: uuid.UUID = row.id
    return membership_id


async def org_state(session: AsyncSession, org_id: uuid.UUID) -> str | None:
    """The org's state, or None when it is gone."""
    state: str | None = await session.scalar(select(Organization.state).where(Organization.id == org_id))
    return state
