"""Exports as the API sees them: create (under the org lock), list, read, cancel/delete, and download."""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from saq import Queue
from sqlalchemy import and_, func, or_, select

from space.auth.deps import MemberContext
from space.config import Settings
from space.errors import (
    AccessRevoked,
    ExportExpired,
    ExportFailed,
    ExportNotReady,
    Forbidden,
    NotFound,
    OrgDeleting,
    RateLimited,
)
from space.exports.models import ACTIVE_STATES, FAILED_STATES, ExportJob, ExportKind, ExportScope, ExportState
from space.exports.queue import enqueue_quietly
from space.exports.schemas import Export, ExportCreate, SnapshotRequest
from space.exports.storage import ResultKey, ResultMissing, ResultStore
from space.orgs.models import Membership, OrgState, Role
from space.orgs.service import lock_org

NOT_READY_RETRY_AFTER = 5
"""Seconds a client is asked to wait before polling a queued or running export's result again."""
BUSY_RETRY_AFTER = 30
"""Seconds to wait when the rate limit is held by exports still running (their end can't be predicted)."""
LIST_LIMIT = 200
"""The newest exports a list shows."""
_ACTIVE = [s.value for s in ACTIVE_STATES]


def export_out(job: ExportJob, *, can_download: bool) -> Export:
    """The API shape of an export."""
    return Export(
        id=job.id,
        kind=ExportKind(job.kind),
        state=ExportState(job.state),
        progress=job.progress,
        error_code=job.error_code,
        filters=job.filters or {},
        scope=ExportScope(job.scope),
        created_at=job.created_at,
        started_at=job.started_at,
        snapshot_at=job.snapshot_at,
        completed_at=job.completed_at,
        expires_at=job.expires_at,
        row_count=job.row_count,
        byte_size=job.byte_size,
        sha256=job.sha256,
        can_download=can_download,
    )


def _downloadable(ctx: MemberContext, job: ExportJob, now: Any) -> bool:
    return (
        ctx.role is not None
        and (job.scope == ExportScope.own or ctx.role.is_staff)
        and ctx.org.state != OrgState.deleting
        and job.state == ExportState.completed
        and job.purged_at is None
        and job.expires_at is not None
        and job.expires_at > now
    )


def _member(ctx: MemberContext) -> Membership:
    # Former members reach this controller (for the result route's 403); everything else is 404 to them.
    if ctx.membership is None:
        raise NotFound()
    return ctx.membership


async def create_export(ctx: MemberContext, data: ExportCreate, settings: Settings, queue: Queue) -> Export:
    """Create an export under the org lock (membership, org state, rate limit), enqueue it after commit."""
    _member(ctx)
    session = ctx.uow.session
    org = await lock_org(session, ctx.org.id)
    if org.state == OrgState.deleted:
        raise NotFound()
    if org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted; no new exports.")
    # Re-read under the lock: the role decides the scope, and a concurrent change is ordered by the lock.
    membership = (
        await session.execute(
            select(Membership)
            .where(Membership.org_id == org.id, Membership.user_id == ctx.principal.user_id)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if membership is None:
        raise NotFound()
    role = Role(membership.role)
    if isinstance(data, SnapshotRequest) and not role.is_staff:
        raise Forbidden("Snapshots are for staff; customers can export their tickets as CSV.")
    await _rate_limit(ctx, settings)
    job = ExportJob(
        id=uuid.uuid4(),
        org_id=org.id,
        creator_id=ctx.principal.user_id,
        kind=ExportKind.snapshot.value if isinstance(data, SnapshotRequest) else ExportKind.tickets_csv.value,
        state=ExportState.queued.value,
        filters={} if isinstance(data, SnapshotRequest) else msgspec.to_builtins(data.filters),
        delimiter="," if isinstance(data, SnapshotRequest) else data.delimiter,
        scope=(ExportScope.team if role.is_staff else ExportScope.own).value,
    )
    session.add(job)
    await session.flush()
    await session.refresh(job)
    export_id, org_id = job.id, org.id

    async def enqueue() -> None:
        await enqueue_quietly(queue, settings, export_id, org_id)

    ctx.uow.after_commit(enqueue)
    return export_out(job, can_download=False)


async def _rate_limit(ctx: MemberContext, settings: Settings) -> None:
    # statement_timestamp(): the window is measured after the lock wait, not from the request's start.
    now = func.statement_timestamp()
    recent = ExportJob.created_at > now - func.make_interval(0, 0, 0, 0, 0, 1)
    active = ExportJob.state.in_(_ACTIVE)
    row = (
        await ctx.uow.session.execute(
            select(
                func.count().label("n"),
                func.count().filter(active).label("active"),
                func.extract(
                    "epoch", func.min(ExportJob.created_at).filter(~active) + func.make_interval(0, 0, 0, 0, 0, 1) - now
                ).label("wait"),
            ).where(
                ExportJob.org_id == ctx.org.id,
                ExportJob.creator_id == ctx.principal.user_id,
                or_(active, recent),
            )
        )
    ).one()
    limit = settings.export_rate_limit
    if row.n < limit:
        return
    wait = BUSY_RETRY_AFTER if row.active >= limit or row.wait is None else max(1, math.ceil(float(row.wait)))
    raise RateLimited(
        f"At most {limit} exports may be queued, running or started within a minute.",
        headers={"Retry-After": str(wait)},
    )


def _owned(ctx: MemberContext, export_id: uuid.UUID) -> Any:
    return and_(
        ExportJob.id == export_id,
        ExportJob.org_id == ctx.org.id,
        ExportJob.creator_id == ctx.principal.user_id,
        ExportJob.deleted_at.is_(None),
    )


async def list_exports(ctx: MemberContext) -> list[Export]:
    """The caller's exports in this org, newest first."""
    _member(ctx)
    rows = await ctx.uow.session.execute(
        select(ExportJob, func.now())
        .where(
            ExportJob.org_id == ctx.org.id,
            ExportJob.creator_id == ctx.principal.user_id,
            ExportJob.deleted_at.is_(None),
        )
        .order_by(ExportJob.created_at.desc(), ExportJob.id.desc())
        .limit(LIST_LIMIT)
    )
    return [export_out(job, can_download=_downloadable(ctx, job, now)) for job, now in rows.all()]


async def _get_owned(ctx: MemberContext, export_id: uuid.UUID, *, for_update: bool = False) -> tuple[ExportJob, Any]:
    stmt = select(ExportJob, func.now()).where(_owned(ctx, export_id)).execution_options(populate_existing=True)
    if for_update:
        stmt = stmt.with_for_update(of=ExportJob)
    row = (await ctx.uow.session.execute(stmt)).first()
    if row is None:
        raise NotFound()
    return row[0], row[1]


async def get_export(ctx: MemberContext, export_id: uuid.UUID) -> Export:
    """One export of the caller's."""
    _member(ctx)
    job, now = await _get_owned(ctx, export_id)
    return export_out(job, can_download=_downloadable(ctx, job, now))


async def delete_export(ctx: MemberContext, export_id: uuid.UUID, store: ResultStore) -> None:
    """Cancel a queued/running export; delete a finished one (its row stays hidden, its bytes go)."""
    _member(ctx)
    job, now = await _get_owned(ctx, export_id, for_update=True)
    if job.state in _ACTIVE:
        # The worker's next fenced write (state = 'running') matches nothing: it stops, publishes nothing.
        job.state = ExportState.cancelled.value
        job.error_code = "cancelled"
        job.lease_expires_at = None
        job.completed_at = now
    else:
        job.deleted_at = now
        if job.state == ExportState.completed and job.purged_at is None:
            job.purged_at = now
    await ctx.uow.session.flush()
    if job.execution_id is not None:
        key = ResultKey(job.org_id, job.id, job.execution_id)

        async def drop() -> None:
            # Best effort: what stays behind is an orphan by then, and the cleanup removes it.
            try:
                await store.delete(key)
            except Exception:
                return

        ctx.uow.after_commit(drop)


@dataclass(frozen=True)
class Download:
    """An authorized download: headers' facts and the chunk stream."""

    export_id: uuid.UUID
    kind: ExportKind
    byte_size: int
    sha256: str
    chunks: AsyncIterator[bytes]

    @property
    def media_type(self) -> str:
        """The result's content type."""
        # Litestar appends "; charset=utf-8" to text/* types itself.
        return "application/json" if self.kind is ExportKind.snapshot else "text/csv"

    @property
    def filename(self) -> str:
        """Server-made file name, never user text."""
        ext = "json" if self.kind is ExportKind.snapshot else "csv"
        return f"space-export-{self.export_id}.{ext}"


async def open_result(ctx: MemberContext, export_id: uuid.UUID, store: ResultStore) -> Download:
    """Authorize a download again, in SPEC §6's order, and open the stored bytes."""
    job, now = await _get_owned(ctx, export_id)
    if ctx.role is None:
        raise AccessRevoked("You are no longer a member of this organization.")
    if job.scope == ExportScope.team and not ctx.role.is_staff:
        raise AccessRevoked("This export holds team data; your role no longer includes it.")
    if ctx.org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted.")
    if job.state in _ACTIVE:
        raise ExportNotReady(
            f"The export is {job.state} ({job.progress}%).", headers={"Retry-After": str(NOT_READY_RETRY_AFTER)}
        )
    if job.state in {s.value for s in FAILED_STATES}:
        raise ExportFailed(f"The export {job.state}: {job.error_code}.", errorCode=job.error_code)
    if job.purged_at is not None or job.expires_at is None or job.expires_at <= now:
        raise ExportExpired("The export's result has expired.")
    assert job.execution_id is not None and job.byte_size is not None and job.sha256 is not None
    key = ResultKey(job.org_id, job.id, job.execution_id)
    return Download(job.id, ExportKind(job.kind), job.byte_size, job.sha256, _checked(store.read(key), job.byte_size))


async def _checked(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    # Headers (Content-Length) are sent before the body: a short body must abort, not end quietly.
    sent = 0
    async for chunk in chunks:
        sent += len(chunk)
        yield chunk
    if sent != size:
        raise ResultMissing(f"result ended after {sent} of {size} bytes")
