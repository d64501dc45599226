"""Who may read one export, decided by the database in one round trip (SPEC §6, §10; issue 35).

The status GET and the result route ask one statement everything SPEC §6 needs, at every request: the caller
(a bearer token's hash, or a download link's user and the unrevoked bearer token it was minted with), the
org's state, the caller's membership, their export's row and the database's now. Nothing of it is cached: a
removed member, a revoked token or a deleting org is refused by the very next request.

It runs like the result store's part reads: one read of `db.reads` (the org's tenant setting and the statement in
one pipeline, one implicit transaction up to its Sync; decision 0105), under RLS as the app role. Through a unit of
work it was a transaction for the bearer token and another for the org, membership and row: eight to ten round
trips and most of a status GET's CPU (decision 0099). The statement is compiled once per process.

A link's ranged request also learns here whether the link's ranges were audited within the minute (SPEC §25):
then the audit trail has its row and the request writes none, with no transaction of its own. And its first part
of the result's bytes comes in the same round trip (`Opening`, the result store's statement for it): read under
the org's tenant as every part is, held in the API and handed out only once this request's authorization allowed
it, dropped otherwise. A range then costs one round trip, not two (decision 0104).
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Dialect, Text, and_, bindparam, exists, func, inspect, literal_column, select, true

from space.audit.models import AuditAction, AuditEvent
from space.audit.service import RANGE_AUDIT_SECONDS
from space.auth.models import ApiToken, User
from space.auth.service import Principal, bearer_hash, unknown_token
from space.db import Database, Tenant
from space.db.reads import Read
from space.destinations.models import OUTBOX_TO_DELIVERY, DestinationDelivery
from space.destinations.schemas import Delivery
from space.errors import LinkInvalid, NotFound
from space.exports.links import LinkGrant
from space.exports.models import ExportJob
from space.exports.storage.protocol import Opening
from space.orgs.models import Membership, Organization, OrgState


def _attributes(cls: type[Any]) -> list[tuple[Any, str]]:
    """Every column of a model's table with the name of the attribute it maps to."""
    mapper = inspect(cls)
    return [(column, mapper.get_property_by_column(column).key) for column in cls.__table__.columns]


_ORG = _attributes(Organization)
_MEMBER = _attributes(Membership)
_JOB = _attributes(ExportJob)
_BOUND = frozenset({"org", "export", "user", "token", "hash", "link"})


@dataclass(frozen=True)
class Access:
    """What the database says of a caller and one export of theirs, now."""

    principal: Principal
    org: Organization | None
    """None when the org is not there (or not visible)."""
    membership: Membership | None
    job: ExportJob | None
    """The caller's own (not deleted) export of that id, or None."""
    now: dt.datetime
    range_audited: bool
    """A link's ranges have their audit row of this minute already (only asked for a link's ranged request)."""
    delivery: Delivery | None
    """The export's latest delivery to a destination (SPEC §22), or None."""


@functools.cache
def _compiled(dialect: Dialect, by_link: bool, with_delivery: bool) -> tuple[str, dict[str, Any]]:
    audited = exists().where(
        AuditEvent.org_id == bindparam("org"),
        # Literals, as the partial index audit_events_link_ranges_idx writes them (a prepared statement's generic
        # plan could not match a parameter to its expression and predicate).
        AuditEvent.action == literal_column(f"'{AuditAction.export_downloaded.value}'"),
        AuditEvent.details.op("->>")(literal_column("'link'")) == bindparam("link", type_=Text),
        AuditEvent.at > func.now() - dt.timedelta(seconds=RANGE_AUDIT_SECONDS),
    )
    caller = (
        and_(User.id == bindparam("user"), ApiToken.id == bindparam("token"))
        if by_link
        else ApiToken.token_hash == bindparam("hash")
    )
    # The export's latest delivery (SPEC §22), in the same statement, for the status GET that shows it; the result
    # route (every range of a download) has no use for it and leaves it out.
    d = DestinationDelivery
    latest = (
        select(d.destination_id, d.state, d.delivered_at, d.error_code)
        .where(d.org_id == bindparam("org"), d.export_id == bindparam("export"))
        .order_by(d.created_at.desc(), d.id)
        .limit(1)
        .lateral("latest_delivery")
    )
    stmt = (
        select(
            User.id,
            User.email,
            User.name,
            ApiToken.id,
            *(c for c, _ in _ORG),
            *(c for c, _ in _MEMBER),
            *(c for c, _ in _JOB),
            func.now(),
            audited,
        )
        .select_from(ApiToken)
        .join(User, User.id == ApiToken.user_id)
        .outerjoin(Organization, Organization.id == bindparam("org"))
        .outerjoin(Membership, and_(Membership.org_id == Organization.id, Membership.user_id == User.id))
        .outerjoin(
            ExportJob,
            and_(
                ExportJob.id == bindparam("export"),
                ExportJob.org_id == bindparam("org"),
                ExportJob.creator_id == User.id,
                ExportJob.deleted_at.is_(None),
            ),
        )
        .where(caller, ApiToken.revoked_at.is_(None))
    )
    if with_delivery:
        stmt = stmt.add_columns(*latest.c).outerjoin(latest, true())
    c = stmt.compile(dialect=dialect)
    return c.string, {k: v for k, v in c.params.items() if k not in _BOUND}


def _entity(cls: type[Any], attributes: list[tuple[Any, str]], values: Any) -> Any:
    """A transient instance of the model (read only: it is in no session), its values put straight into the
    instance's dictionary as the ORM's own loading puts a row's: the constructor would set each attribute through
    its instrumentation (about 35 µs for an export row, 2 µs so; decision 0104)."""
    instance = inspect(cls).class_manager.new_instance()
    instance.__dict__.update(zip((name for _, name in attributes), values, strict=True))
    return instance


async def authorize(
    db: Database,
    org_id: uuid.UUID,
    export_id: uuid.UUID,
    *,
    token_hash: bytes | None = None,
    link_user: tuple[uuid.UUID, uuid.UUID] | None = None,
    link_id: str | None = None,
    with_delivery: bool = False,
    opening: Opening | None = None,
) -> Access | None:
    """The caller of `token_hash` (a bearer token's), or `link_user` ((user id, bearer token id) of a link), with
    the org, their membership and their export `export_id`; None when there is no such caller (an unknown or
    revoked token). `link_id`: also whether that link's ranges were audited within the minute. `with_delivery`:
    also the export's latest delivery (else `delivery` is None). `opening`: a read's first part (of this org's
    bytes), fetched in the same round trip into `opening.rows`, for the caller to use only if authorized."""
    sql, params = _compiled(db.engine.dialect, link_user is not None, with_delivery)
    params = {**params, "org": org_id, "export": export_id, "link": link_id}
    if link_user is None:
        params["hash"] = token_hash
    else:
        params["user"], params["token"] = link_user
    if opening is not None and opening.key.org_id != org_id:
        raise ValueError("an opening of another org's bytes")  # the tenant setting is this org's
    # The part in binary, as the store reads its parts: the bytes as they are stored.
    more = [] if opening is None else [Read(opening.statement, opening.params, binary=True)]
    rows, *part = await db.reads.read(Tenant(org_id=org_id), Read(sql, params), *more)
    if opening is not None:
        opening.rows = part[0]
    if not rows:
        return None
    row = rows[0]
    principal = Principal(user_id=row[0], email=row[1], name=row[2], token_id=row[3])
    at = 4
    org_values, at = row[at : at + len(_ORG)], at + len(_ORG)
    member_values, at = row[at : at + len(_MEMBER)], at + len(_MEMBER)
    job_values, at = row[at : at + len(_JOB)], at + len(_JOB)
    return Access(
        principal=principal,
        org=None if org_values[0] is None else _entity(Organization, _ORG, org_values),
        membership=None if member_values[0] is None else _entity(Membership, _MEMBER, member_values),
        job=None if job_values[0] is None else _entity(ExportJob, _JOB, job_values),
        now=row[at],
        range_audited=bool(row[at + 1]),
        delivery=_delivery(row[at + 2 :]) if with_delivery else None,
    )


def _delivery(values: Any) -> Delivery | None:
    destination_id, state, delivered_at, error_code = values
    if state is None:
        return None
    return Delivery(
        destination_id=destination_id,
        state=OUTBOX_TO_DELIVERY[state],
        delivered_at=delivered_at,
        error_code=error_code,
    )


_NO_ID = uuid.UUID(int=0)
"""Stands in for a malformed path id: the caller is still looked up (401 comes first), and nothing has this id."""


def _path_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        return _NO_ID


async def by_bearer(
    db: Database, authorization: str | None, org_id: str, export_id: str, *, with_delivery: bool = False
) -> tuple[Access, Organization]:
    """The bearer token's caller and their export: 401 for no, a malformed, unknown or revoked token; 404 when
    the org is not there (or deleted), as every org route answers. `with_delivery`: the export's latest delivery
    too (the status GET)."""
    found = await authorize(
        db,
        _path_id(org_id),
        _path_id(export_id),
        token_hash=bearer_hash(authorization),
        with_delivery=with_delivery,
    )
    if found is None:
        raise unknown_token()
    return _in_org(found)


async def by_link(
    db: Database, grant: LinkGrant, *, ranged: bool, opening: Opening | None = None
) -> tuple[Access, Organization]:
    """A verified link's user and their export (the link names both ids): `link_invalid` when the user or the
    bearer token the link was minted with is gone or revoked; 404 when the org is. `ranged`: a `Range` was
    asked, so whether the link's ranges were audited this minute is asked too. `opening`: the range's first part,
    fetched in the same round trip (see `authorize`)."""
    found = await authorize(
        db,
        grant.org_id,
        grant.export_id,
        link_user=(grant.user_id, grant.token_id),
        link_id=grant.link_id if ranged else None,
        opening=opening,
    )
    if found is None:
        raise LinkInvalid()
    return _in_org(found)


def _in_org(found: Access) -> tuple[Access, Organization]:
    if found.org is None or found.org.state == OrgState.deleted:
        raise NotFound()
    return found, found.org
