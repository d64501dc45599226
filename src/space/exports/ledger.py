"""The export ledger's queries: every read and write of `export_jobs`, in one place.

The row is the truth about an export; SAQ only carries its id. A worker's writes are fenced: they name the
execution that claimed the row and match nothing once another execution (or a cancel) took it. Times come
from the database clock: `clock_timestamp()` for leases, `statement_timestamp()` for what a request or a
publish decides after waiting for a lock.

Cross-org reads (the reconciler's and the cleanup's candidates) go through SECURITY DEFINER functions of
migration 0003 that list ids only, and a user's exports over every org (the per-user rate limit) through
0006's, which counts only; every write that follows runs per org under its RLS context.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, exists, func, or_, select, text, tuple_, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Interval

from space.auth.models import User
from space.exports.formats.registry import FINAL_KINDS, ExportKind
from space.exports.models import ACTIVE_STATES, ExportJob, ExportState

ACTIVE = tuple(s.value for s in ACTIVE_STATES)
REVOKED = "export_revoked"
"""The errorCode of a completed export whose result an owner or admin of the org removed."""
_MINUTE = func.make_interval(0, 0, 0, 0, 0, 1)


def seconds(value: float) -> Any:
    """An interval parameter of `value` seconds."""
    return bindparam(None, dt.timedelta(seconds=value), type_=Interval)


def _now() -> Any:
    return func.clock_timestamp()


@dataclass(frozen=True)
class Fence:
    """Which execution a write speaks for: it changes the row only while that execution runs it."""

    export_id: uuid.UUID
    org_id: uuid.UUID
    execution_id: uuid.UUID


# --- requests (the API) ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """A user's exports in an org that count against the rate limit (SPEC §5)."""

    counted: int
    """Queued or running, or created in the last minute."""
    active: int
    """Queued or running."""
    frees_in: float | None
    """Seconds until the oldest finished export of the last minute leaves the window."""


async def usage(session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID) -> Usage:
    """What the rate limit counts, measured now (after any lock wait: statement_timestamp)."""
    now = func.statement_timestamp()
    active = ExportJob.state.in_(ACTIVE)
    row = (
        await session.execute(
            select(
                func.count().label("n"),
                func.count().filter(active).label("active"),
                func.extract("epoch", func.min(ExportJob.created_at).filter(~active) + _MINUTE - now).label("wait"),
            ).where(
                ExportJob.org_id == org_id,
                ExportJob.creator_id == user_id,
                # A schedule's runs are not the creator's requests (SPEC §21).
                ExportJob.schedule_id.is_(None),
                or_(active, ExportJob.created_at > now - _MINUTE),
            )
        )
    ).one()
    return Usage(counted=row.n, active=row.active, frees_in=None if row.wait is None else float(row.wait))


async def schedule_active(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID) -> bool:
    """Whether a run of the schedule is still queued or running."""
    found = await session.scalar(
        select(ExportJob.id)
        .where(ExportJob.org_id == org_id, ExportJob.schedule_id == schedule_id, ExportJob.state.in_(ACTIVE))
        .limit(1)
    )
    return found is not None


async def schedule_of(session: AsyncSession, org_id: uuid.UUID, export_id: uuid.UUID) -> uuid.UUID | None:
    """The schedule that made the export, if one did."""
    found: uuid.UUID | None = await session.scalar(
        select(ExportJob.schedule_id).where(ExportJob.org_id == org_id, ExportJob.id == export_id)
    )
    return found


async def active(session: AsyncSession, org_id: uuid.UUID) -> int:
    """The org's queued and running exports (whatever their lease): the ones ahead of a new export."""
    n = await session.scalar(select(func.count()).where(ExportJob.org_id == org_id, ExportJob.state.in_(ACTIVE)))
    return int(n or 0)


async def user_usage(session: AsyncSession, user_id: uuid.UUID) -> Usage:
    """What the per-user rate limit counts: the user's exports in every org, measured now (SPEC §14)."""
    row = (
        await session.execute(
            text("SELECT * FROM space_exports_user_usage(:user, :window)"),
            {"user": user_id, "window": dt.timedelta(minutes=1)},
        )
    ).one()
    return Usage(counted=row.counted, active=row.active, frees_in=row.frees_in)


def _stored() -> list[ColumnElement[bool]]:
    # Completed and still downloadable: not deleted, not purged, not past expiresAt (after any lock wait).
    return [
        ExportJob.state == ExportState.completed.value,
        ExportJob.deleted_at.is_(None),
        ExportJob.purged_at.is_(None),
        ExportJob.expires_at > func.statement_timestamp(),
    ]


async def stored_bytes(session: AsyncSession, org_id: uuid.UUID) -> int:
    """Bytes of the org's downloadable results: what its result quota counts."""
    total = await session.scalar(
        select(func.coalesce(func.sum(ExportJob.byte_size), 0)).where(ExportJob.org_id == org_id, *_stored())
    )
    return int(total or 0)


async def add(session: AsyncSession, job: ExportJob) -> ExportJob:
    """Insert a new export row and read back what the database filled in."""
    session.add(job)
    await session.flush()
    await session.refresh(job)
    return job


def _owned(org_id: uuid.UUID, user_id: uuid.UUID) -> list[ColumnElement[bool]]:
    return [ExportJob.org_id == org_id, ExportJob.creator_id == user_id, ExportJob.deleted_at.is_(None)]


async def owned(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, export_id: uuid.UUID, *, for_update: bool = False
) -> tuple[ExportJob, dt.datetime] | None:
    """One of the user's (not deleted) exports in the org, with the database's now; None otherwise."""
    stmt = (
        select(ExportJob, func.now())
        .where(ExportJob.id == export_id, *_owned(org_id, user_id))
        .execution_options(populate_existing=True)
    )
    if for_update:
        stmt = stmt.with_for_update(of=ExportJob)
    row = (await session.execute(stmt)).first()
    return None if row is None else (row[0], row[1])


Position = tuple[dt.datetime, uuid.UUID]
"""Where a row stands in a list newest first: its (created_at, id)."""


def _older_than(position: Position | None) -> list[ColumnElement[bool]]:
    if position is None:
        return []
    return [tuple_(ExportJob.created_at, ExportJob.id) < tuple_(*position)]


async def position_owned(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, export_id: uuid.UUID
) -> Position | None:
    """Where one of the user's (not deleted) exports stands in their list; None when it is not theirs."""
    row = (
        await session.execute(
            select(ExportJob.created_at, ExportJob.id).where(ExportJob.id == export_id, *_owned(org_id, user_id))
        )
    ).first()
    return None if row is None else (row[0], row[1])


async def position_in_org(session: AsyncSession, org_id: uuid.UUID, export_id: uuid.UUID) -> Position | None:
    """Where a (not deleted) export of the org stands in the org's list; None when it is no export of it."""
    row = (
        await session.execute(
            select(ExportJob.created_at, ExportJob.id).where(
                ExportJob.id == export_id, ExportJob.org_id == org_id, ExportJob.deleted_at.is_(None)
            )
        )
    ).first()
    return None if row is None else (row[0], row[1])


async def newest_owned(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, limit: int, before: Position | None = None
) -> list[tuple[ExportJob, dt.datetime]]:
    """The user's `limit` newest exports in the org (older than `before` when given), with the database's now."""
    rows = await session.execute(
        select(ExportJob, func.now())
        .where(*_owned(org_id, user_id), *_older_than(before))
        .order_by(ExportJob.created_at.desc(), ExportJob.id.desc())
        .limit(limit)
    )
    return [(job, now) for job, now in rows.all()]


async def newest_in_org(
    session: AsyncSession, org_id: uuid.UUID, limit: int, before: Position | None = None
) -> list[tuple[ExportJob, str, dt.datetime]]:
    """Every member's `limit` newest (not deleted) exports in the org (older than `before` when given), with the
    creator's name and the database's now (the owners' and admins' view)."""
    rows = await session.execute(
        select(ExportJob, User.name, func.now())
        .join(User, User.id == ExportJob.creator_id)
        .where(ExportJob.org_id == org_id, ExportJob.deleted_at.is_(None), *_older_than(before))
        .order_by(ExportJob.created_at.desc(), ExportJob.id.desc())
        .limit(limit)
    )
    return [(job, name, now) for job, name, now in rows.all()]


async def in_org(
    session: AsyncSession, org_id: uuid.UUID, export_id: uuid.UUID
) -> tuple[ExportJob, dt.datetime] | None:
    """Any member's (not deleted) export in the org, locked FOR UPDATE, with the database's now; None otherwise."""
    row = (
        await session.execute(
            select(ExportJob, func.now())
            .where(ExportJob.id == export_id, ExportJob.org_id == org_id, ExportJob.deleted_at.is_(None))
            .with_for_update(of=ExportJob)
            .execution_options(populate_existing=True)
        )
    ).first()
    return None if row is None else (row[0], row[1])


async def ended_facts(
    session: AsyncSession, org_id: uuid.UUID, export_id: uuid.UUID
) -> tuple[uuid.UUID, dt.datetime | None] | None:
    """Who created an export and until when its result may be downloaded (what its end's notice says)."""
    row = (
        await session.execute(
            select(ExportJob.creator_id, ExportJob.expires_at).where(
                ExportJob.id == export_id, ExportJob.org_id == org_id
            )
        )
    ).first()
    return None if row is None else (row[0], row[1])


async def cancel_active_of(
    session: AsyncSession, org_id: uuid.UUID, creator_id: uuid.UUID, scopes: tuple[str, ...], code: str
) -> list[tuple[uuid.UUID, str]]:
    """Cancel the creator's queued and running exports of `scopes` with `code`; the ids and kinds cancelled, by id.

    A running worker's next fenced write then matches no row, so it stops and publishes nothing.
    """
    now = func.statement_timestamp()
    rows = await session.execute(
        update(ExportJob)
        .where(
            ExportJob.org_id == org_id,
            ExportJob.creator_id == creator_id,
            ExportJob.state.in_(ACTIVE),
            ExportJob.scope.in_(scopes),
            ExportJob.deleted_at.is_(None),
        )
        .values(state=ExportState.cancelled.value, error_code=code, lease_expires_at=None, completed_at=now)
        .returning(ExportJob.id, ExportJob.kind)
        .execution_options(synchronize_session=False)
    )
    return sorted((export_id, kind) for export_id, kind in rows)


def cancel(job: ExportJob, now: dt.datetime, code: str) -> None:
    """A queued or running export stops: the running worker's next fenced write matches nothing."""
    job.state = ExportState.cancelled.value
    job.error_code = code
    job.lease_expires_at = None
    job.completed_at = now


def hide(job: ExportJob, now: dt.datetime) -> None:
    """A finished export is deleted by its owner: hidden from the API (still counted by the rate limit), its
    result gone."""
    job.deleted_at = now
    if job.state == ExportState.completed and job.purged_at is None:
        job.purged_at = now


def revoke(job: ExportJob, now: dt.datetime) -> None:
    """An admin takes a completed result away from its owner: the bytes go, the row says why (`export_revoked`)."""
    job.error_code = REVOKED
    if job.purged_at is None:
        job.purged_at = now


async def has_recent_final_export(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, window: dt.timedelta
) -> bool:
    """Whether the user completed a final-export kind in this org within `window` that is still downloadable."""
    # A final export is one the owner can still take away: a deleted, purged or expired result is not one,
    # whenever it was taken (SPEC §13). Database clock throughout.
    recent: Any = exists().where(
        and_(
            ExportJob.org_id == org_id,
            ExportJob.creator_id == user_id,
            ExportJob.kind.in_(FINAL_KINDS),
            ExportJob.completed_at >= func.now() - window,
            *_stored(),
        )
    )
    return bool(await session.scalar(select(recent)))


# --- the worker ------------------------------------------------------------------------------------------------


def _claimable() -> Any:
    # Queued, or running under a lease that has run out (its worker is gone or stalled).
    return or_(
        ExportJob.state == ExportState.queued.value,
        and_(ExportJob.state == ExportState.running.value, ExportJob.lease_expires_at < _now()),
    )


async def claim(
    session: AsyncSession,
    fence: Fence,
    *,
    max_attempts: int,
    lease_seconds: float,
) -> Any | None:
    """Take the export for `fence.execution_id` with one conditional UPDATE; the export's fixed inputs, or None
    when another execution owns it, it is finished, or it has used its attempts."""
    return (
        await session.execute(
            update(ExportJob)
            .where(
                ExportJob.id == fence.export_id,
                ExportJob.org_id == fence.org_id,
                ExportJob.deleted_at.is_(None),
                ExportJob.attempt < max_attempts,
                _claimable(),
            )
            .values(
                state=ExportState.running.value,
                execution_id=fence.execution_id,
                attempt=ExportJob.attempt + 1,
                lease_expires_at=_now() + seconds(lease_seconds),
                started_at=func.coalesce(ExportJob.started_at, _now()),
                progress=0,
                error_code=None,
                error_detail=None,
            )
            .returning(
                ExportJob.attempt,
                ExportJob.kind,
                ExportJob.scope,
                ExportJob.creator_id,
                ExportJob.filters,
                ExportJob.delimiter,
                ExportJob.schedule_id,
                ExportJob.incremental,
            )
            .execution_options(synchronize_session=False)
        )
    ).first()


async def running(session: AsyncSession, org_id: uuid.UUID) -> int:
    """The org's running exports whose lease is still live: what its concurrency limit counts."""
    n = await session.scalar(
        select(func.count()).where(
            ExportJob.org_id == org_id,
            ExportJob.state == ExportState.running.value,
            ExportJob.lease_expires_at >= _now(),
        )
    )
    return int(n or 0)


async def claimable(session: AsyncSession, export_id: uuid.UUID, org_id: uuid.UUID, *, max_attempts: int) -> bool:
    """Whether `claim` would take the export if the org had room."""
    found: Any = exists().where(
        ExportJob.id == export_id,
        ExportJob.org_id == org_id,
        ExportJob.deleted_at.is_(None),
        ExportJob.attempt < max_attempts,
        _claimable(),
    )
    return bool(await session.scalar(select(found)))


async def waiting(session: AsyncSession, org_id: uuid.UUID, limit: int) -> list[tuple[uuid.UUID, ExportKind]]:
    """The org's `limit` oldest claimable exports (queued, or running under an expired lease), with their kinds."""
    if limit <= 0:
        return []
    rows = await session.execute(
        select(ExportJob.id, ExportJob.kind)
        .where(ExportJob.org_id == org_id, ExportJob.deleted_at.is_(None), _claimable())
        .order_by(ExportJob.created_at, ExportJob.id)
        .limit(limit)
    )
    return [(export_id, ExportKind(kind)) for export_id, kind in rows]


async def lease_ran_out(session: AsyncSession, export_id: uuid.UUID, org_id: uuid.UUID) -> bool:
    """Whether the export is running under a lease that has run out, locking its row until commit.

    A claim (or `worker_lost`) that follows in the same transaction then ends an execution that lost its lease:
    what `space_lease_lost_total` counts. The claim would lock the row anyway; this takes the same lock (FOR NO
    KEY UPDATE, which chunk inserts' KEY SHARE does not wait for) a moment earlier, so nothing changes the row
    between this answer and the claim.
    """
    expired = await session.scalar(
        select(and_(ExportJob.state == ExportState.running.value, ExportJob.lease_expires_at < _now()))
        .where(ExportJob.id == export_id, ExportJob.org_id == org_id)
        .with_for_update(key_share=True)
    )
    return bool(expired)


async def fail_exhausted(
    session: AsyncSession, export_id: uuid.UUID, org_id: uuid.UUID, *, max_attempts: int
) -> str | None:
    """Fail `worker_lost` a claimable export that has used all its attempts; its kind if one was, else None."""
    result = await session.execute(
        update(ExportJob)
        .where(
            ExportJob.id == export_id,
            ExportJob.org_id == org_id,
            ExportJob.deleted_at.is_(None),
            ExportJob.attempt >= max_attempts,
            _claimable(),
        )
        .values(**failed("worker_lost"))
        .returning(ExportJob.kind)
        .execution_options(synchronize_session=False)
    )
    kind: str | None = result.scalar()
    return kind


async def fenced(session: AsyncSession, fence: Fence, **values: Any) -> bool:
    """Update the row only while `fence`'s execution runs it; whether it did."""
    result = await session.execute(
        update(ExportJob)
        .where(
            ExportJob.id == fence.export_id,
            ExportJob.org_id == fence.org_id,
            ExportJob.execution_id == fence.execution_id,
            ExportJob.state == ExportState.running.value,
        )
        .values(**values)
        .returning(ExportJob.id)
        .execution_options(synchronize_session=False)
    )
    return result.first() is not None


def renewed(lease_seconds: float) -> dict[str, Any]:
    """The columns a lease renewal sets."""
    return {"lease_expires_at": _now() + seconds(lease_seconds)}


def failed(code: str, detail: str = "") -> dict[str, Any]:
    """The columns a failure sets (`detail`: its words for the owner, none when empty)."""
    return {
        "state": ExportState.failed.value,
        "error_code": code,
        "error_detail": detail or None,
        "lease_expires_at": None,
        "completed_at": _now(),
    }


def handed_back() -> dict[str, Any]:
    """The columns that give a running export back to the queue (no lease: the next claim takes it at once)."""
    return {"state": ExportState.queued.value, "lease_expires_at": None}


def completed(
    *, ttl_seconds: float, snapshot_at: dt.datetime, row_count: int, byte_size: int, sha256: str
) -> dict[str, Any]:
    """The columns the publish sets."""
    # statement_timestamp(): after the lock wait, so the TTL starts when the result really appears.
    now = func.statement_timestamp()
    return {
        "state": ExportState.completed.value,
        "progress": 100,
        "error_code": None,
        "error_detail": None,
        "completed_at": now,
        "expires_at": now + seconds(ttl_seconds),
        "snapshot_at": snapshot_at,
        "row_count": row_count,
        "byte_size": byte_size,
        "sha256": sha256,
        "lease_expires_at": None,
    }


@dataclass(frozen=True)
class QueueStats:
    """The export queue over every org, as the ledger has it now (SPEC §16's gauges)."""

    waiting: int
    """Queued, or running under a lease that ran out (claimable again)."""
    running: int
    """Running under a live lease."""
    oldest_waiting_seconds: float | None
    """Age of the oldest waiting export; None when none waits."""


async def queue_stats(session: AsyncSession) -> QueueStats:
    """Exports waiting and running over every org (0012's definer function: counts only)."""
    row = (await session.execute(text("SELECT * FROM space_exports_queue_stats()"))).one()
    oldest = None if row.oldest_waiting_seconds is None else float(row.oldest_waiting_seconds)
    return QueueStats(waiting=int(row.waiting), running=int(row.running), oldest_waiting_seconds=oldest)


# --- maintenance -----------------------------------------------------------------------------------------------


async def reconcile_candidates(session: AsyncSession, limit: int) -> list[tuple[uuid.UUID, uuid.UUID, str, int]]:
    """(export, org, state, attempt) of queued exports and running ones with an expired lease, across orgs."""
    rows = await session.execute(text("SELECT * FROM space_exports_reconcile_candidates(:n)"), {"n": limit})
    return [(r[0], r[1], r[2], r[3]) for r in rows]


async def expired_results(session: AsyncSession, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(export, org) of completed exports past expiresAt whose result is not purged yet, across orgs."""
    rows = await session.execute(text("SELECT * FROM space_exports_expired_results(:n)"), {"n": limit})
    return [(r[0], r[1]) for r in rows]


async def orphan_executions(session: AsyncSession, limit: int) -> list[tuple[uuid.UUID, uuid.UUID, uuid.UUID]]:
    """(export, org, execution) of stored chunks that no live published or running execution owns."""
    rows = await session.execute(text("SELECT * FROM space_exports_orphan_executions(:n)"), {"n": limit})
    return [(r[0], r[1], r[2]) for r in rows]


async def mark_purged(session: AsyncSession, export_id: uuid.UUID, org_id: uuid.UUID) -> uuid.UUID | None:
    """Mark an expired result purged (the row stays for history); its execution id, or None if not due."""
    execution_id: uuid.UUID | None = await session.scalar(
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
    return execution_id
