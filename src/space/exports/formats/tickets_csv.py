"""The `tickets_csv` kind (SPEC §7): tickets matching the export's filters, as CSV.

Every record is `csv_head || assignee cell || csv_tail`, columns PostgreSQL computed when the ticket (and the
user) was written (migration 0004), so a batch costs the database little more than reading the rows; one
`string_agg` per batch returns finished bytes, and Python only hashes, counts and cuts them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec
from psycopg.types.string import ByteaBinaryLoader
from sqlalchemy import ColumnElement, Select, Text, bindparam, column, func, literal, literal_column, select, table
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import compiled, driver_connection, server_version
from space.exports.formats.base import BATCH_BYTES, Batch, ExportRequest, Order, Pace, bigint_param
from space.exports.increments import Since
from space.exports.models import ExportScope
from space.orgs.models import Membership
from space.tickets.filters import TicketFilters, parse_filters, ticket_conditions
from space.tickets.models import Ticket

FILE = "tickets.csv"
"""The CSV's file, as a failure's words and the archive's member name call it."""
CSV_HEADER = ("number", "title", "status", "priority", "assignee", "createdAt", "updatedAt")
BOM = "\ufeff".encode()
CRLF = "\r\n"

# users.csv_name is a generated column of migration 0004 that only the export reads; the User model of the
# auth domain does not map it.
_users = table("users", column("id"), column("csv_name", Text))


class TicketsCsvRequest(ExportRequest, tag="tickets_csv"):
    """`{"kind": "tickets_csv", "filters": {...}, "delimiter": "," | ";"}`: tickets matching the filters."""

    filters: TicketFilters = msgspec.field(default_factory=TicketFilters)
    delimiter: Literal[",", ";"] = ","

    def ledger_filters(self) -> dict[str, Any]:
        """The filters as the export's row keeps them (the worker parses them back)."""
        filters: dict[str, Any] = msgspec.to_builtins(self.filters)
        return filters

    def ledger_delimiter(self) -> str:
        """The delimiter asked for."""
        return self.delimiter


async def open_tickets_csv(session: AsyncSession, order: Order, membership_id: uuid.UUID) -> TicketsCsv:
    """The export's CSV, from its stored filters; `membership_id` is the creator's (for `assignment=mine`)."""
    # Own scope: the creator condition beside RLS lets the (org_id, creator_id, number) index serve it.
    creator = order.creator_id if order.scope is ExportScope.own else None
    return TicketsCsv.from_stored(
        order.org_id, order.filters, membership_id, order.delimiter, creator, getattr(order, "since", None)
    )


class TicketsCsv:
    """SPEC §7 tickets CSV: BOM, CRLF, every field quoted, formula guard on text cells (stored by 0004)."""

    def __init__(
        self,
        org_id: uuid.UUID,
        filters: TicketFilters,
        membership_id: uuid.UUID | None,
        delimiter: str,
        creator_id: uuid.UUID | None = None,
        since: Since | None = None,
    ) -> None:
        self.org_id = org_id
        self.conditions = ticket_conditions(filters, membership_id)
        self.delimiter = delimiter
        self.creator_id = creator_id
        self.since = since

    @classmethod
    def from_stored(
        cls,
        org_id: uuid.UUID,
        filters: dict[str, Any],
        membership_id: uuid.UUID | None,
        delimiter: str,
        creator_id: uuid.UUID | None = None,
        since: Since | None = None,
    ) -> TicketsCsv:
        """Build from the filters as stored on the export; `creator_id` for own scope (RLS enforces it too);
        `since`: an incremental run's start (only the tickets written since)."""
        return cls(org_id, parse_filters(filters), membership_id, delimiter, creator_id, since)

    def _where(self) -> list[ColumnElement[bool]]:
        where = [Ticket.org_id == self.org_id, *self.conditions]
        if self.creator_id is not None:
            where.append(Ticket.creator_id == self.creator_id)
        if self.since is not None:
            where.append(self.since.changed(literal_column("tickets.row_xid")))
        return where

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """Matching tickets visible under the export's RLS context, the rows of the one file."""
        n = await session.scalar(select(func.count()).select_from(Ticket).where(*self._where()))
        return {FILE: int(n or 0)}

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """BOM and the quoted header record."""
        return BOM + (self.delimiter.join(f'"{h}"' for h in CSV_HEADER) + CRLF).encode()

    async def _assignee_cells(self, session: AsyncSession) -> str:
        # membership id -> the assignee's guarded, quoted name, read once in the snapshot. A per-row join
        # would have to run as a nested loop (only that keeps the rows in `number` order), costing one probe
        # per ticket and membership; a jsonb lookup is a binary search over the org's memberships.
        cells = (
            select(func.jsonb_object_agg(sql_cast(Membership.id, Text), _users.c.csv_name))
            .select_from(Membership)
            .join(_users, _users.c.id == Membership.user_id)
            .where(Membership.org_id == self.org_id)
        )
        return str(await session.scalar(select(func.coalesce(cells.scalar_subquery(), literal({}, JSONB)).cast(Text))))

    def _line(self) -> ColumnElement[str]:
        # The map is a parameter evaluated once per statement (an InitPlan), never parsed per row.
        cells = select(sql_cast(bindparam("cells", type_=Text), JSONB)).scalar_subquery()
        assignee = func.coalesce(cells.op("->>", return_type=Text)(sql_cast(Ticket.assignee_id, Text)), '""')
        if self.delimiter == ",":
            return Ticket.csv_head.op("||")(assignee).op("||")(Ticket.csv_tail)
        sep = literal(self.delimiter, Text)
        head = func.space_csv_head_sep(Ticket.csv_head, Ticket.number, Ticket.status, Ticket.priority, sep)
        return head.op("||")(assignee).op("||")(func.space_csv_tail_sep(Ticket.csv_tail, sep))

    def _batch_params(self, done: int) -> dict[str, int]:
        """The next batch's parameters besides the keyset's, after `done` records: none for the CSV."""
        return {}

    def _batch(self, ordered: bool) -> Select[Any]:
        page = (
            select(Ticket.number.label("key"), self._line().label("line"))
            .where(*self._where(), Ticket.number > bindparam("after", type_=Ticket.number.type))
            .order_by(Ticket.number)
            .limit(bigint_param("limit"))
            .subquery()
        )
        # The page's bytes before each record (the window runs over the page in its order, no sort): the batch
        # keeps the records that start under the budget.
        width = func.octet_length(page.c.line)
        before = func.sum(width).over(order_by=page.c.key, rows=(None, 0)) - width
        sized = select(page.c.key, page.c.line, before.label("before")).subquery()
        kept = sized.c.before < bigint_param("budget")
        # PostgreSQL 16+ feeds an ORDER BY aggregate from the already sorted page for free; 15 would sort each
        # batch again, and there an aggregate over a sorted subquery keeps the subquery's order (the
        # documented idiom: nothing between the Limit and the Aggregate can reorder rows; the window keeps it).
        empty = literal_column("''", Text)
        order = aggregate_order_by(empty, sized.c.key) if ordered else empty
        return select(
            func.count().label("page"),
            func.count().filter(kept).label("rows"),
            func.max(sized.c.key).filter(kept).label("last"),
            func.string_agg(sized.c.line, order).filter(kept),
        )

    async def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """Tickets by `number`, keyset, at most `size` records and about `budget` bytes a batch."""
        ordered = await server_version(session) >= 160000
        sql, params = compiled(session, self._batch(ordered))
        params["cells"] = await self._assignee_cells(session)
        conn = await driver_connection(session)
        pace = Pace(size, budget)
        after = 0
        done = 0
        async with conn.cursor(binary=True) as cur:
            cur.adapters.register_loader("text", ByteaBinaryLoader)
            while True:
                limit = pace.limit
                batch = {**params, **self._batch_params(done), "after": after, "limit": limit, "budget": budget}
                await cur.execute(sql, batch)
                row = await cur.fetchone()
                if row is None or not row[1]:
                    return
                page: int = row[0]
                rows: int = row[1]
                last: int = row[2]
                data: bytes = row[3]
                yield Batch(rows=rows, last=last, data=data)
                done += rows
                if rows == page < limit:  # nothing cut, and the page ran out before its limit: the last batch
                    return
                pace.saw(rows, len(data))
                after = last

    def footer(self) -> bytes:
        """Nothing after the last record."""
        return b""
