"""The audit trail: `record` (every service that changes an org's data calls it in its own transaction), the
keyset-paged read, and where a request comes from (`client_ip`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, literal, select
from sqlalchemy.ext.asyncio import AsyncSession

from space import cursors
from space.audit.models import AuditAction, AuditEvent
from space.audit.schemas import AuditActor, AuditItem, AuditPage, AuditTarget
from space.auth.models import User
from space.config import Network
from space.db import Database, Tenant, UnitOfWork
from space.db.locks import lock_link_audit
from space.errors import InvalidRequest
from space.exports.models import ExportJob
from space.orgs.models import Organization


@dataclass(frozen=True)
class Target:
    """What an audit row is about."""

    type: str
    id: str

    @classmethod
    def export(cls, export_id: uuid.UUID) -> Target:
        """An export."""
        return cls("export", str(export_id))

    @classmethod
    def user(cls, user_id: uuid.UUID) -> Target:
        """A user (the member an action was about)."""
        return cls("user", str(user_id))

    @classmethod
    def org(cls, org_id: uuid.UUID) -> Target:
        """The organization itself."""
        return cls("org", str(org_id))


async def record(
    session: AsyncSession,
    org_id: uuid.UUID,
    action: AuditAction,
    target: Target,
    *,
    actor_id: uuid.UUID | None,
    ip: str | None = None,
    details: dict[str, Any] | None = None,
) -> None:
    """Add an audit row to the caller's transaction: it commits, or rolls back, with the change it records."""
    # The session's tenant context must be the org: the insert policy checks it (a row can't land elsewhere).
    session.add(
        AuditEvent(
            id=uuid.uuid4(),
            org_id=org_id,
            actor_id=actor_id,
            action=action.value,
            target_type=target.type,
            target_id=target.id,
            ip=ip,
            details=details or {},
        )
    )
    await session.flush()


RANGE_AUDIT_SECONDS = 60
"""One link's ranged requests are audited at most once in this many seconds (SPEC §25)."""


async def record_download(
    db: Database,
    org_id: uuid.UUID,
    user_id: uuid.UUID,
    export_id: uuid.UUID,
    *,
    via: str,
    byte_range: str | None,
    size: int | None,
    ip: str | None,
    redirect: bool = False,
    link_id: str | None = None,
    range_audited: bool = False,
) -> None:
    """`export.downloaded`, in a transaction of its own, as the response starts (the request's has committed).

    `size` None: the download was handed to the object store (`redirect`), which sends what it is asked. A link's
    ranged requests (`link_id` and a `byte_range`) write one row a minute, marked `coalesced`: a resumable client
    asks hundreds of ranges, and the trail must not grow with them. Whole downloads are recorded every time.
    `range_audited`: the caller already found that minute's row (without the lock: a row found needs none).
    """
    if link_id is not None and byte_range is not None and range_audited:
        # The request's authorization found this minute's row already (`exports.access`): no transaction at all.
        return
    details: dict[str, Any] = {"via": via, "range": byte_range, "bytes": size}
    if redirect:
        details["redirect"] = True
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=org_id, user_id=user_id)) as uow:
        if link_id is not None and byte_range is not None:
            # Answered from the trail itself (append-only: no row is ever updated to count the ranges it stands
            # for), under the link's lock, so two ranges at once can't both find no row.
            await lock_link_audit(uow.session, link_id)
            if await _range_audited(uow.session, org_id, link_id):
                return
            details.update(link=link_id, coalesced=True)
        await record(
            uow.session,
            org_id,
            AuditAction.export_downloaded,
            Target.export(export_id),
            actor_id=user_id,
            ip=ip,
            details=details,
        )


async def _range_audited(session: AsyncSession, org_id: uuid.UUID, link_id: str) -> bool:
    # The database's clock on both sides (rows are stamped by it); index audit_events_link_ranges_idx.
    found = await session.scalar(
        select(literal(1))
        .where(
            AuditEvent.org_id == org_id,
            AuditEvent.action == AuditAction.export_downloaded.value,
            AuditEvent.details["link"].astext == link_id,
            AuditEvent.at > func.now() - dt.timedelta(seconds=RANGE_AUDIT_SECONDS),
        )
        .limit(1)
    )
    return found is not None


# --- reading the trail -------------------------------------------------------------------------------------------

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_CURSOR_VERSION = 2
# A cursor names the last row of a page by its id, one of the org's own rows that the page already shows, and
# nothing else: the trail's order (`seq`) is installation-wide, and a cursor made of it told an admin how many
# audited actions other orgs took between two of theirs (issue 29). Version 1 cursors (of seq) are refused.


def encode_cursor(row_id: uuid.UUID) -> str:
    """The opaque cursor of the page that follows the row `row_id` (older rows)."""
    return cursors.encode_cursor(row_id, _CURSOR_VERSION)


def decode_cursor(cursor: str) -> uuid.UUID:
    """The row a cursor names; 400 `invalid_request` (naming `before`) for anything this service did not make."""
    row_id = cursors.decode_cursor(cursor, _CURSOR_VERSION)
    if row_id is None:
        raise _not_a_cursor()
    return row_id


def _not_a_cursor() -> InvalidRequest:
    return InvalidRequest("before: not a cursor of this trail.", errors=[{"key": "before"}])


async def page(session: AsyncSession, org_id: uuid.UUID, before: str | None, limit: int) -> AuditPage:
    """The org's trail newest first, `limit` rows older than the cursor `before` (from the newest when None)."""
    stmt = (
        select(AuditEvent, User.name)
        .outerjoin(User, User.id == AuditEvent.actor_id)
        .where(AuditEvent.org_id == org_id)
        .order_by(AuditEvent.seq.desc())
        # One more than asked: whether an older page exists, without counting.
        .limit(limit + 1)
    )
    if before is not None:
        # Where the named row stands, found among this org's rows only: another org's row id is no cursor here.
        position = await session.scalar(
            select(AuditEvent.seq).where(AuditEvent.org_id == org_id, AuditEvent.id == decode_cursor(before))
        )
        if position is None:
            raise _not_a_cursor()
        stmt = stmt.where(AuditEvent.seq < position)
    rows = (await session.execute(stmt)).all()
    shown = rows[:limit]
    labels = await _target_labels(session, org_id, [event for event, _ in shown])
    items = [_item(event, name, labels) for event, name in shown]
    more = len(rows) > limit
    return AuditPage(items=items, next=encode_cursor(rows[limit - 1][0].id) if more else None)


# (target type, target id) -> (name, kind): what a reader of the trail needs instead of an id.
_Labels = dict[tuple[str, str], tuple[str | None, str | None]]


async def _target_labels(session: AsyncSession, org_id: uuid.UUID, events: Sequence[AuditEvent]) -> _Labels:
    # Two small IN lookups by primary key after the page is known, instead of joins on a text id: the trail's
    # order and cursor stay those of audit_events alone. An export or user that is gone is simply not found.
    ids: dict[str, set[uuid.UUID]] = {"export": set(), "user": set()}
    for event in events:
        if event.target_type in ids:
            with contextlib.suppress(ValueError):
                ids[event.target_type].add(uuid.UUID(event.target_id))
    labels: _Labels = {}
    if ids["user"]:
        users = await session.execute(select(User.id, User.name).where(User.id.in_(ids["user"])))
        labels.update({("user", str(uid)): (name, None) for uid, name in users.all()})
    if ids["export"]:
        jobs = await session.execute(
            select(ExportJob.id, ExportJob.kind).where(ExportJob.org_id == org_id, ExportJob.id.in_(ids["export"]))
        )
        labels.update({("export", str(eid)): (None, kind) for eid, kind in jobs.all()})
    if any(event.target_type == "org" for event in events):
        org_name = await session.scalar(select(Organization.name).where(Organization.id == org_id))
        labels[("org", str(org_id))] = (org_name, None)
    return labels


def _item(event: AuditEvent, name: str | None, labels: _Labels) -> AuditItem:
    actor = None if event.actor_id is None else AuditActor(user_id=event.actor_id, name=name or "")
    target_name, kind = labels.get((event.target_type, event.target_id), (None, None))
    return AuditItem(
        id=event.id,
        at=event.at,
        actor=actor,
        action=event.action,
        target=AuditTarget(type=event.target_type, id=event.target_id, name=target_name, kind=kind),
        ip=None if event.ip is None else str(event.ip),
        details=event.details,
    )


# --- where a request comes from ----------------------------------------------------------------------------------


def client_ip(peer: str | None, forwarded_for: Sequence[str], trusted: Iterable[Network]) -> str | None:
    """The caller's address: the connection's peer, or, when that peer is a trusted proxy, the nearest address in
    `X-Forwarded-For` that is not one (the header's left part is whatever the client chose to send)."""
    address = _address(peer, zone_ok=True)
    if address is None:
        return None
    networks = tuple(trusted)
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
    # Walk back from the peer: each trusted proxy vouches for the address it received the request from.
    while hops and _trusted(address, networks):
        hop = _address(hops.pop())
        if hop is None:
            # A garbled entry (a zone, a port, a name): the last address a trusted proxy vouched for is as far as
            # the header is believed.
            break
        address = hop
    return str(address)


def _address(text: str | None, *, zone_ok: bool = False) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not text:
        return None
    text = text.strip()
    if "%" in text:
        # An IPv6 zone ("fe80::1%eth0") names a link of the host that saw the address, and PostgreSQL's inet has no
        # room for it. The connection's own peer is real, so its zone is dropped; a forwarded one is not believed.
        if not zone_ok:
            return None
        text = text.split("%", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: tuple[Network, ...]) -> bool:
    return any(address.version == n.version and address in n for n in networks)
