"""Tickets: numbered per org, listed through the shared filter builder, triaged by staff."""

from __future__ import annotations

import uuid

from msgspec import UnsetType
from sqlalchemy import any_, bindparam, func, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Uuid

from space.errors import InvalidRequest, NotFound
from space.orgs.models import Membership, Role
from space.orgs.service import key_shared_membership
from space.tickets import models
from space.tickets.filters import Priority, TicketFilters, TicketStatus, like_pattern, ticket_conditions
from space.tickets.schemas import Ticket, TicketCreate, TicketPage, TicketUpdate

# Row-locks the org's counter until commit, so concurrent creates in one org queue here and get 1..n.
_NEXT_NUMBER = text(
    "UPDATE ticket_counters SET last_number = last_number + 1 WHERE org_id = :org RETURNING last_number"
)
_MAX_NUMBER = 2**31 - 1  # the column is a PostgreSQL integer

SEARCH_MAX_IDS = 10_000
"""Matches of `q` up to which the list reads the rows by id. A search matching more is not selective: the
walk in number order (with the ILIKE as a filter) finds a page's rows sooner than reading them all."""


def ticket_out(t: models.Ticket) -> Ticket:
    """The API shape of a ticket."""
    return Ticket(
        number=t.number,
        title=t.title,
        body=t.body,
        status=TicketStatus(t.status),
        priority=Priority(t.priority),
        creator_id=t.creator_id,
        assignee_id=t.assignee_id,
        created_at=t.created_at,
        updated_at=t.updated_at,
    )


def parse_number(value: str) -> int:
    """A ticket number from the path; anything that can't be one is answered like an unknown one (404)."""
    if not (value.isascii() and value.isdigit()) or len(value) > 10 or not 1 <= int(value) <= _MAX_NUMBER:
        raise NotFound()
    return int(value)


async def create_ticket(session: AsyncSession, org_id: uuid.UUID, creator_id: uuid.UUID, data: TicketCreate) -> Ticket:
    """Open a ticket as `creator_id`, with the org's next number."""
    number = (await session.execute(_NEXT_NUMBER, {"org": org_id})).scalar_one_or_none()
    if number is None:
        # Every org gets its counter row in the transaction that creates it.
        raise RuntimeError(f"ticket counter missing for org {org_id}")
    t = models.Ticket(
        id=uuid.uuid4(),
        org_id=org_id,
        number=number,
        title=data.title.strip(),
        body=data.body,
        priority=data.priority.value,
        status=TicketStatus.open.value,
        creator_id=creator_id,
    )
    session.add(t)
    await session.flush()
    await session.refresh(t)
    return ticket_out(t)


async def list_tickets(
    session: AsyncSession, viewer: Membership, filters: TicketFilters, page: int, page_size: int
) -> TicketPage:
    """One page of the tickets `viewer` may see (RLS narrows customers to their own), by number."""
    conds = [models.Ticket.org_id == viewer.org_id, *ticket_conditions(filters, viewer.id)]
    if viewer.role == Role.customer:
        # RLS already narrows a customer to their own tickets, but its setting-based predicate is opaque to the
        # planner: it walked the org's whole (org_id, number) index to find a few rows (0.6 s at 1M tickets).
        # Said plainly, the (org_id, creator_id, number) index answers the page and the count directly.
        conds.append(models.Ticket.creator_id == viewer.user_id)
    if filters.q:
        ids = await _search(session, filters.q)
        if ids is not None:
            # The ILIKE stays (it decides); the ids let the primary key serve both queries under RLS.
            conds.append(models.Ticket.id == any_(bindparam("search_ids", ids, type_=ARRAY(Uuid))))
    total = await session.scalar(select(func.count()).select_from(models.Ticket).where(*conds))
    rows = await session.execute(
        select(models.Ticket)
        .where(*conds)
        .order_by(models.Ticket.number)
        .offset((page - 1) * page_size)
        .limit(page_size)
    )
    items = [ticket_out(t) for t in rows.scalars()]
    return TicketPage(items=items, total=total or 0, page=page, page_size=page_size)


async def _search(session: AsyncSession, q: str) -> list[uuid.UUID] | None:
    """Ids of the tickets matching `q` in the session's tenant context; None when there are too many.

    Under RLS PostgreSQL never uses an index for ILIKE (it is not LEAKPROOF, so it must wait for the policy's
    predicate), so the app role's own query would scan the org. The SECURITY DEFINER function of migration
    0005 runs it without RLS predicates, bounded to the caller's context, where the trigram indexes serve it.
    """
    found = await session.scalar(select(func.space_ticket_search(like_pattern(q), SEARCH_MAX_IDS, type_=ARRAY(Uuid))))
    return None if found is None else list(found)


async def update_ticket(session: AsyncSession, org_id: uuid.UUID, number: int, data: TicketUpdate) -> Ticket:
    """Change status, priority or assignee; only the fields given change, and `updatedAt` always moves."""
    values: dict[str, object] = {"updated_at": func.now()}
    if not isinstance(data.status, UnsetType):
        values["status"] = data.status.value
    if not isinstance(data.priority, UnsetType):
        values["priority"] = data.priority.value
    if not isinstance(data.assignee_id, UnsetType):
        if data.assignee_id is not None:
            await _ensure_assignable(session, org_id, data.assignee_id)
        values["assignee_id"] = data.assignee_id
    t = (
        await session.execute(
            update(models.Ticket)
            .where(models.Ticket.org_id == org_id, models.Ticket.number == number)
            .values(**values)
            .returning(models.Ticket)
            .execution_options(populate_existing=True)
        )
    ).scalar_one_or_none()
    if t is None:
        raise NotFound()
    return ticket_out(t)


async def _ensure_assignable(session: AsyncSession, org_id: uuid.UUID, membership_id: uuid.UUID) -> None:
    # Locked until commit: a removal racing this assignment either finished first (400 here) or waits, so the
    # UPDATE never meets a vanished assignee (a foreign-key violation, once a 500).
    assignee = await key_shared_membership(session, org_id, membership_id)
    if assignee is None:
        raise InvalidRequest("assigneeId: not a membership id of this organization.")
    if assignee.role == Role.customer:
        raise InvalidRequest("assigneeId: tickets are assigned to staff, not customers.")
