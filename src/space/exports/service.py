"""Exports as the API sees them: create (under the org lock), list, read, cancel/delete, and download."""

from __future__ import annotations

import datetime as dt
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from saq import Queue
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from space.audit import service as audit
from space.audit.models import AuditAction
from space.auth.service import Principal
from space.config import Settings
from space.cursors import decode_cursor, encode_cursor
from space.db import UnitOfWork
from space.db.locks import lock_user
from space.destinations import service as destinations
from space.destinations.schemas import Delivery
from space.errors import (
    AccessRevoked,
    ExportExpired,
    ExportFailed,
    ExportNotReady,
    ExportQuotaExceeded,
    ExportRevoked,
    Forbidden,
    InvalidRequest,
    LinkInvalid,
    LinkRateLimited,
    NotFound,
    OrgDeleting,
    RateLimited,
)
from space.exports import ledger, outcomes
from space.exports.formats.registry import KINDS, ExportKind, kind_of
from space.exports.links import LinkGrant, LinkSigner
from space.exports.models import FAILED_STATES, ExportJob, ExportScope, ExportState
from space.exports.queue import enqueue_quietly
from space.exports.schemas import Export, ExportCreate, ExportCreator, ExportPage, Link, OrgExport
from space.exports.storage.protocol import Opening, Redirecting, ResultKey, ResultMissing, ResultStore, opens
from space.orgs import service as orgs
from space.orgs.models import Membership, Organization, OrgState, Role

DownloadVia = Literal["bearer", "link"]
"""How a download's caller authenticated."""

NOT_READY_RETRY_AFTER = 5
"""Seconds a client is asked to wait before polling a queued or running export's result again."""
RATE_LIMIT_RETRY_AFTER = 30
"""Seconds to wait when the rate limit is held by exports still running (their end can't be predicted)."""
LIST_LIMIT = 200
"""The most exports one page of a list shows (and how many when the caller names no `limit`)."""
CANCELLED = "cancelled"
CANCELLED_BY_ADMIN = "cancelled_by_admin"
ACCESS_REVOKED = "access_revoked"


def export_out(job: ExportJob, *, can_download: bool, delivery: Delivery | None = None) -> Export:
    """The API shape of an export."""
    return Export(**_fields(job, can_download, delivery))


def _fields(job: ExportJob, can_download: bool, delivery: Delivery | None = None) -> dict[str, Any]:
    return dict(
        delivery=delivery,
        id=job.id,
        kind=ExportKind(job.kind),
        state=ExportState(job.state),
        progress=job.progress,
        error_code=job.error_code,
        error_detail=job.error_detail,
        filters=job.filters or {},
        delimiter=job.delimiter,
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
        schedule_id=job.schedule_id,
        since=job.since,
        since_export_id=job.since_export_id,
    )


def _downloadable(org: Organization, membership: Membership | None, job: ExportJob, now: dt.datetime) -> bool:
    return (
        membership is not None
        and (job.scope == ExportScope.own or Role(membership.role).is_staff)
        and org.state != OrgState.deleting
        and job.state == ExportState.completed
        and job.purged_at is None
        and job.expires_at is not None
        and job.expires_at > now
    )


def _member(membership: Membership | None) -> Membership:
    # Former members reach this controller (for the result route's 403); everything else is 404 to them.
    if membership is None:
        raise NotFound()
    return membership


async def create_export(
    uow: UnitOfWork,
    org_id: uuid.UUID,
    membership: Membership | None,
    data: ExportCreate,
    settings: Settings,
    queue: Queue,
    *,
    ip: str | None = None,
) -> Export:
    """Create an export under the org lock (membership, org state, quota, rate limits), enqueue it after commit.

    `membership` is the caller's as read before the lock; it is read again under it, which decides.
    """
    user_id = _member(membership).user_id
    session = uow.session
    org = await orgs.lock_org(session, org_id)
    if org.state == OrgState.deleted:
        raise NotFound()
    if org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted; no new exports.")
    # Read under the lock: the role decides the scope, and a concurrent change is ordered by the lock.
    membership = await orgs.membership_of(session, org.id, user_id)
    if membership is None:
        raise NotFound()
    role = Role(membership.role)
    kind = kind_of(data)
    if not KINDS[kind].customers and not role.is_staff:
        raise Forbidden("Snapshots and archives are for staff; customers can export their tickets as CSV.")
    # Before the rate limits: a full quota needs the caller to act (delete results); waiting would not help.
    await _within_quota(session, org.id, settings.org_result_quota_bytes)
    limit = settings.export_rate_limit
    _rate_limit(
        await ledger.usage(session, org.id, user_id),
        limit,
        f"At most {limit} exports may be queued, running or started within a minute.",
    )
    # The user's exports in every org: the org lock doesn't order requests in other orgs, the user lock does.
    await lock_user(session, user_id)
    limit = settings.export_user_rate_limit
    _rate_limit(
        await ledger.user_usage(session, user_id),
        limit,
        f"At most {limit} exports across all your organizations may be queued, running or started within a minute.",
    )
    job = await ledger.add(
        session,
        ExportJob(
            id=uuid.uuid4(),
            org_id=org.id,
            creator_id=user_id,
            kind=kind.value,
            state=ExportState.queued.value,
            # What the request fixes: a tickets_csv's filters and delimiter; none and `,` for the kinds that read
            # the whole org (an archive's CSV holds every ticket with `,`, SPEC §13).
            filters=data.ledger_filters(),
            delimiter=data.ledger_delimiter(),
            scope=(ExportScope.team if role.is_staff else ExportScope.own).value,
        ),
    )
    export_id = job.id
    await audit.record(
        session,
        org.id,
        AuditAction.export_requested,
        audit.Target.export(export_id),
        actor_id=user_id,
        ip=ip,
        details={"kind": job.kind, "scope": job.scope},
    )
    # The queue carries at most the org's concurrency of its exports: the rest wait in the ledger, oldest first,
    # until an ending export wakes the org (under this lock: exports.maintenance.wake). One org's backlog then
    # never sits in the queue in front of another org's exports.
    if await ledger.active(session, org.id) <= settings.export_org_concurrency:

        async def enqueue() -> None:
            await enqueue_quietly(queue, settings, export_id, org_id, kind)

        uow.after_commit(enqueue)
    return export_out(job, can_download=False)


def _rate_limit(usage: ledger.Usage, limit: int, detail: str) -> None:
    if usage.counted < limit:
        return
    # Running or queued exports alone fill the limit: their end can't be predicted.
    wait = (
        RATE_LIMIT_RETRY_AFTER if usage.active >= limit or usage.frees_in is None else max(1, math.ceil(usage.frees_in))
    )
    raise RateLimited(detail, headers={"Retry-After": str(wait)})


async def _within_quota(session: AsyncSession, org_id: uuid.UUID, quota: int) -> None:
    stored = await ledger.stored_bytes(session, org_id)
    if stored >= quota:
        raise ExportQuotaExceeded(
            f"The organization's stored exports use {stored} of its {quota} bytes; delete some to make room."
        )


async def list_exports(
    session: AsyncSession,
    org: Organization,
    membership: Membership | None,
    *,
    before: str | None = None,
    limit: int = LIST_LIMIT,
) -> ExportPage[Export]:
    """A page of the member's exports in this org, newest first, older than the cursor `before` when given."""
    member = _member(membership)
    position = None
    if before is not None:
        position = await ledger.position_owned(session, org.id, member.user_id, _cursor_row(before))
        if position is None:
            raise _not_a_cursor()
    # One more than asked: whether an older page exists, without counting.
    rows = await ledger.newest_owned(session, org.id, member.user_id, limit + 1, position)
    delivered = await destinations.deliveries_of(session, org.id, [job.id for job, _ in rows[:limit]])
    items = [
        export_out(job, can_download=_downloadable(org, member, job, now), delivery=delivered.get(job.id))
        for job, now in rows[:limit]
    ]
    return ExportPage(items=items, next=_next(rows, limit))


_CURSOR_VERSION = 1


def _cursor_row(before: str) -> uuid.UUID:
    row_id = decode_cursor(before, _CURSOR_VERSION)
    if row_id is None:
        raise _not_a_cursor()
    return row_id


def _not_a_cursor() -> InvalidRequest:
    return InvalidRequest("before: not a cursor of this list.", errors=[{"key": "before"}])


def _next(rows: list[Any], limit: int) -> str | None:
    # A cursor names the page's last row by id, one the caller already sees (found again in the caller's own list).
    return encode_cursor(rows[limit - 1][0].id, _CURSOR_VERSION) if len(rows) > limit else None


async def _get_owned(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, export_id: uuid.UUID, *, for_update: bool = False
) -> tuple[ExportJob, dt.datetime]:
    row = await ledger.owned(session, org_id, user_id, export_id, for_update=for_update)
    if row is None:
        raise NotFound()
    return row


def export_of(
    org: Organization,
    membership: Membership | None,
    job: ExportJob | None,
    now: dt.datetime,
    delivery: Delivery | None = None,
) -> Export:
    """One export of the member's, from the rows `access.authorize` read with the caller; NotFound otherwise."""
    member = _member(membership)
    if job is None:
        raise NotFound()
    return export_out(job, can_download=_downloadable(org, member, job, now), delivery=delivery)


async def list_org_exports(
    session: AsyncSession,
    org: Organization,
    membership: Membership | None,
    *,
    before: str | None = None,
    limit: int = LIST_LIMIT,
) -> ExportPage[OrgExport]:
    """A page of every member's exports in this org, newest first, with their creators (owners and admins;
    metadata only)."""
    member = _member(membership)
    orgs.ensure_role(Role(member.role), orgs.MANAGERS)
    position = None
    if before is not None:
        position = await ledger.position_in_org(session, org.id, _cursor_row(before))
        if position is None:
            raise _not_a_cursor()
    rows = await ledger.newest_in_org(session, org.id, limit + 1, position)
    delivered = await destinations.deliveries_of(session, org.id, [job.id for job, _, _ in rows[:limit]])
    items = [
        OrgExport(
            # Only an export's creator ever downloads it, whatever the caller's role.
            **_fields(
                job, job.creator_id == member.user_id and _downloadable(org, member, job, now), delivered.get(job.id)
            ),
            creator=ExportCreator(user_id=job.creator_id, name=name),
        )
        for job, name, now in rows[:limit]
    ]
    return ExportPage(items=items, next=_next(rows, limit))


async def delete_export(
    uow: UnitOfWork,
    org_id: uuid.UUID,
    membership: Membership | None,
    export_id: uuid.UUID,
    store: ResultStore,
    *,
    ip: str | None = None,
    queue: Queue | None = None,
) -> None:
    """Cancel a queued/running export; delete a finished one (its row stays hidden, its bytes go).

    Owners and admins may also stop another member's export (`cancelled_by_admin`) or take its result away
    (the owner's download then answers 410 `export_revoked`); they never get its content. What a cancellation
    owes (the creator's notification) is enqueued on `queue` after the commit (None: its sweeper sends it).
    """
    member = _member(membership)
    session = uow.session
    row = await ledger.owned(session, org_id, member.user_id, export_id, for_update=True)
    if row is not None:
        job, now = row
        if job.state in ledger.ACTIVE:
            ledger.cancel(job, now, CANCELLED)
            outcome = outcomes.cancelled(job.id, org_id, job.kind, CANCELLED, actor_id=member.user_id, ip=ip)
            await outcomes.ended(uow, queue, outcome)
        else:
            ledger.hide(job, now)
            await _audit_deleted(session, job, member.user_id, ip, {"revoked": False})
    else:
        if Role(member.role) not in orgs.MANAGERS:
            raise NotFound()
        found = await _as_manager(uow, org_id, member.user_id, export_id, ip, queue)
        if found is None:
            return
        job = found
    await session.flush()
    if job.execution_id is not None:
        key = ResultKey(job.org_id, job.id, job.execution_id)

        async def drop() -> None:
            # Best effort: what stays behind is an orphan by then, and the cleanup removes it.
            try:
                await store.delete(key)
            except Exception:
                return

        uow.after_commit(drop)


async def _as_manager(
    uow: UnitOfWork, org_id: uuid.UUID, user_id: uuid.UUID, export_id: uuid.UUID, ip: str | None, queue: Queue | None
) -> ExportJob | None:
    # Under the org lock, as every decision by role (a demotion meanwhile is seen) and ordered with publishes.
    session = uow.session
    await orgs.lock_org(session, org_id)
    manager = await orgs.membership_of(session, org_id, user_id)
    if manager is None or Role(manager.role) not in orgs.MANAGERS:
        raise NotFound()
    row = await ledger.in_org(session, org_id, export_id)
    if row is None:
        raise NotFound()
    job, now = row
    if job.state in ledger.ACTIVE:
        ledger.cancel(job, now, CANCELLED_BY_ADMIN)
        outcome = outcomes.cancelled(
            job.id, org_id, job.kind, CANCELLED_BY_ADMIN, actor_id=user_id, ip=ip, creator_id=job.creator_id
        )
        await outcomes.ended(uow, queue, outcome)
        return job
    if job.state == ExportState.completed and job.error_code != ledger.REVOKED:
        ledger.revoke(job, now)
        await _audit_deleted(session, job, user_id, ip, {"creatorId": str(job.creator_id), "revoked": True})
        return job
    # Failed, cancelled or already revoked: nothing of its data is left to take away.
    return None


async def _audit_deleted(
    session: AsyncSession, job: ExportJob, actor_id: uuid.UUID, ip: str | None, details: dict[str, Any]
) -> None:
    # A finished export's result goes: not an ending of its execution (that ended when it finished).
    await audit.record(
        session,
        job.org_id,
        AuditAction.export_deleted,
        audit.Target.export(job.id),
        actor_id=actor_id,
        ip=ip,
        details=details,
    )


async def cancel_for_role(
    uow: UnitOfWork,
    org_id: uuid.UUID,
    user_id: uuid.UUID,
    role: Role | None,
    *,
    actor_id: uuid.UUID,
    ip: str | None = None,
    queue: Queue | None = None,
) -> list[uuid.UUID]:
    """Cancel (`access_revoked`) the member's queued and running exports that `role` can't hold (None: removed),
    in the caller's transaction, which holds the org lock, each outcome recorded in it (`outcomes.ended`, its jobs
    enqueued on `queue` after the commit); the ids cancelled. Their workers lose their fence."""
    if role is None:
        scopes: tuple[str, ...] = (ExportScope.own.value, ExportScope.team.value)
    elif not role.is_staff:
        scopes = (ExportScope.team.value,)
    else:
        return []
    cancelled = await ledger.cancel_active_of(uow.session, org_id, user_id, scopes, ACCESS_REVOKED)
    for export_id, kind in cancelled:
        outcome = outcomes.cancelled(
            export_id, org_id, kind, ACCESS_REVOKED, actor_id=actor_id, ip=ip, creator_id=user_id
        )
        await outcomes.ended(uow, queue, outcome)
    return [export_id for export_id, _ in cancelled]


async def has_recent_final_export(
    session: AsyncSession, org_id: uuid.UUID, user_id: uuid.UUID, window: dt.timedelta
) -> bool:
    """Whether the user has a still downloadable snapshot or archive here, completed within `window` (the
    deletion rule, SPEC §13)."""
    return await ledger.has_recent_final_export(session, org_id, user_id, window)


@dataclass(frozen=True)
class Download:
    """An authorized download: headers' facts, and where its bytes are."""

    export_id: uuid.UUID
    kind: ExportKind
    byte_size: int
    sha256: str
    key: ResultKey
    store: ResultStore
    via: DownloadVia = "bearer"
    opened: Opening | None = None
    """The first part of the range asked for, fetched by the authorization's round trip (`access.authorize`)."""

    def body(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` (exclusive, default: the whole result) as they stream from storage, one part at
        a time (the first from `opened` when it is this read's); a result that ends short of them aborts
        (ResultMissing)."""
        stop = self.byte_size if end is None else end
        if self.opened is not None and opens(self.store):
            return _checked(self.store.read(self.key, start, stop, opened=self.opened), stop - start)
        return _checked(self.store.read(self.key, start, stop), stop - start)

    async def redirect_url(self) -> str | None:
        """A presigned GET of the bytes (valid at most 60 s) when the store hands results out itself, else None.

        Call it only after authorizing (`open_result`): the URL is the result, to whoever holds it.
        """
        # The attribute first: it is cheaper than the protocol's check, which every download would pay.
        if not getattr(self.store, "redirect", False) or not isinstance(self.store, Redirecting):
            return None
        # The stored object knows nothing of text: say the charset as the API's own answer does.
        return await self.store.presign(self.key, filename=self.filename, media_type=self.content_type)

    @property
    def content_type(self) -> str:
        """The full Content-Type header (HEAD answers set it themselves: Litestar leaves it off them)."""
        return KINDS[self.kind].media_type

    @property
    def filename(self) -> str:
        """Server-made file name, never user text."""
        return f"space-export-{self.export_id}.{KINDS[self.kind].extension}"


async def open_result(
    session: AsyncSession,
    org: Organization,
    user_id: uuid.UUID,
    membership: Membership | None,
    export_id: uuid.UUID,
    store: ResultStore,
    *,
    via: DownloadVia = "bearer",
    execution_id: uuid.UUID | None = None,
) -> Download:
    """Authorize a download again, in SPEC §6's order, and open the stored bytes.

    `via` says how the caller authenticated (a bearer token, or a link whose `execution_id` it carries: a link
    to another execution of the export, such as an attempt before a retry, is not a link to this result).
    """
    job, now = await _get_owned(session, org.id, user_id, export_id)
    return downloadable(org, membership, job, now, store, via=via, execution_id=execution_id)


def downloadable(
    org: Organization,
    membership: Membership | None,
    job: ExportJob | None,
    now: dt.datetime,
    store: ResultStore,
    *,
    via: DownloadVia = "bearer",
    execution_id: uuid.UUID | None = None,
    opened: Opening | None = None,
) -> Download:
    """`open_result`'s decision from rows already read (`access.authorize`, or `open_result`'s own): SPEC §6's
    refusals in its order after the caller's own export was found (None: NotFound), else the stored bytes (with
    `opened`, their first part already read, if it is of this execution)."""
    if job is None:
        raise NotFound()
    if via == "link" and job.execution_id != execution_id:
        raise LinkInvalid()
    if membership is None:
        raise AccessRevoked("You are no longer a member of this organization.")
    if job.scope == ExportScope.team and not Role(membership.role).is_staff:
        raise AccessRevoked("This export holds team data; your role no longer includes it.")
    if org.state == OrgState.deleting:
        raise OrgDeleting("The organization is being deleted.")
    if job.state in ledger.ACTIVE:
        raise ExportNotReady(
            f"The export is {job.state} ({job.progress}%).", headers={"Retry-After": str(NOT_READY_RETRY_AFTER)}
        )
    if job.state in {s.value for s in FAILED_STATES}:
        raise ExportFailed(job.error_detail or f"The export {job.state}: {job.error_code}.", errorCode=job.error_code)
    if job.error_code == ledger.REVOKED:
        raise ExportRevoked("An owner or admin of the organization removed this export's result.")
    if job.purged_at is not None or job.expires_at is None or job.expires_at <= now:
        raise ExportExpired("The export's result has expired.")
    assert job.execution_id is not None and job.byte_size is not None and job.sha256 is not None
    key = ResultKey(job.org_id, job.id, job.execution_id)
    opened = opened if opened is not None and opened.key == key else None
    return Download(job.id, ExportKind(job.kind), job.byte_size, job.sha256, key, store, via, opened)


async def create_link(
    session: AsyncSession,
    org: Organization,
    principal: Principal,
    membership: Membership | None,
    export_id: uuid.UUID,
    store: ResultStore,
    signer: LinkSigner,
    settings: Settings,
    *,
    ip: str | None = None,
) -> Link:
    """A download link to a result the caller could download now (authorized exactly as a download), at most
    `link_rate_limit` a minute per user; it lives while the bearer token that minted it does."""
    download = await open_result(session, org, principal.user_id, membership, export_id, store)
    assert principal.token_id is not None  # minted by a bearer request: a link never mints another
    await _take_mint_place(session, principal.user_id, settings.link_rate_limit)
    # The API host's clock, as the verification uses it (`space check` holds hosts within 1 s of the database).
    expires_at = int(time.time()) + settings.download_link_ttl_seconds
    grant = LinkGrant(principal.user_id, org.id, export_id, download.key.execution_id, expires_at, principal.token_id)
    url = f"/orgs/{org.id}/exports/{export_id}/result?token={signer.sign(grant)}"
    link = Link(url=url, expires_at=grant.expires)
    # The token itself is never recorded: the trail says that a link exists and until when, not how to use it.
    await audit.record(
        session,
        org.id,
        AuditAction.export_link_created,
        audit.Target.export(export_id),
        actor_id=principal.user_id,
        ip=ip,
        details={"expiresAt": f"{link.expires_at:%Y-%m-%dT%H:%M:%SZ}"},  # whole seconds, UTC: as the API shows it
    )
    return link


# One statement: the user's mints of the last minute, the older ones pruned (so the table holds at most the limit
# per user), and this one counted when there is room. Every CTE reads the same snapshot; the user's lock orders
# two mints of one user, so both can't see the last place.
_MINT_WINDOW = text(
    "WITH recent AS ("
    "  SELECT count(*) AS n, min(at) AS oldest FROM link_mints"
    "  WHERE user_id = :user AND at > now() - interval '1 minute'"
    "), pruned AS ("
    "  DELETE FROM link_mints WHERE user_id = :user AND at <= now() - interval '1 minute'"
    "), minted AS ("
    "  INSERT INTO link_mints (user_id, at) SELECT :user, now() FROM recent WHERE n < :limit RETURNING at"
    ")"
    " SELECT n, extract(epoch FROM oldest + interval '1 minute' - now()) AS frees_in FROM recent"
)


async def _take_mint_place(session: AsyncSession, user_id: uuid.UUID, limit: int) -> None:
    # Per user over all orgs (SPEC §25), in the database's clock; needs the user's tenant context (RLS).
    await lock_user(session, user_id)
    row = (await session.execute(_MINT_WINDOW, {"user": user_id, "limit": limit})).one()
    if row.n >= limit:
        wait = max(1, math.ceil(float(row.frees_in)))
        raise LinkRateLimited(
            f"At most {limit} download links a minute; try again in {wait} s.", headers={"Retry-After": str(wait)}
        )


async def _checked(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    # Headers (Content-Length) are sent before the body: a short body must abort, not end quietly.
    sent = 0
    async for chunk in chunks:
        sent += len(chunk)
        yield chunk
    if sent != size:
        raise ResultMissing(f"result ended after {sent} of {size} bytes")
