"""The two output formats: each counts its rows and reads them as finished bytes, in keyset batches, inside
the export's snapshot transaction.

Tickets CSV: every record is `csv_head || assignee cell || csv_tail`, columns PostgreSQL computed when the
ticket (and the user) was written (migration 0004), so a batch costs the database little more than reading
the rows; one `string_agg` per batch returns finished bytes, and Python only hashes, counts and cuts them.

Snapshot: tasks come back as rows (UUIDs as text, timestamps as datetimes) and msgspec encodes them: that
work runs in the worker's process, beside the database backend that reads, instead of on that one backend.
Pages of wide rows come with their text as bytes, and a title that needs no escaping (`tasks.title_plain`,
kept on write) goes out as it is stored (`Snapshot._keyset`).

Batches are bounded twice: by rows (`SPACE_EXPORT_BATCH_ROWS`) and by bytes (`SPACE_EXPORT_BATCH_BYTES`). The
byte budget is cut in SQL, by a running sum of each row's width over the keyset page: a batch keeps its rows
while the bytes before them are under the budget, so it holds at least one row and passes the budget by less
than its last row, and the next batch continues after the last row kept. Rows are user text of any width
(within the field limits), so a batch's memory, and the largest message the connection carries, is bounded
in bytes whatever the rows are like. `Pace` keeps the page's LIMIT near the cut, so the database reads few
rows past it.

Batches are read on the snapshot connection itself with psycopg, in binary (text arrives as raw UTF-8
bytes, no hex, no decode/encode round trip). The statements are still built with SQLAlchemy from the one
ticket filter builder. Every query carries `org_id = :org` beside the RLS policy, which still applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import msgspec
import psycopg
from psycopg.types.string import ByteaBinaryLoader
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Text,
    Uuid,
    any_,
    bindparam,
    column,
    func,
    literal,
    literal_column,
    select,
    table,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import compiled, driver_connection, server_version
from space.orgs.models import Membership
from space.projects.models import Project, Task
from space.tickets.filters import TicketFilters, parse_filters, ticket_conditions
from space.tickets.models import Ticket

CSV_HEADER = ("number", "title", "status", "priority", "assignee", "createdAt", "updatedAt")
BOM = "\ufeff".encode()
CRLF = "\r\n"
SCHEMA_VERSION = 1
_ENCODE_ROWS = 2000
ENCODE_BYTES = 128 * 1024
"""About this many bytes of snapshot rows are encoded at a time (at most _ENCODE_ROWS rows)."""
WIDE_ROW_BYTES = 1024
"""Snapshot rows wider than this on average (name or title and the rest) make the next page a wide one."""
# A snapshot batch's rows arrive whole in the worker's memory (libpq keeps a query's result until it is
# done with), two batches at a time while the next is read ahead: at most this many rows per batch keeps
# that near 4 MB. A CSV batch is one string and keeps the configured size.
SNAPSHOT_BATCH_ROWS = 5000
BATCH_BYTES = 2 * 1024 * 1024
"""The byte budget of a batch when the caller names none (the default of SPACE_EXPORT_BATCH_BYTES)."""
_JSON_ROW_BYTES = 240
"""A snapshot row's JSON besides its name or title (keys, ids, stamps): its width is that text plus this."""
_ZERO = dt.timedelta(0)

# users.csv_name is a generated column of migration 0004 that only the export reads; the User model of the
# auth domain does not map it.
_users = table("users", column("id"), column("csv_name", Text))


@dataclass(frozen=True)
class Batch:
    """One keyset batch, already formatted: `rows` records in `data`, ending at key `last`."""

    rows: int
    last: Any
    data: bytes | bytearray | memoryview


class Format(Protocol):
    """An output format: counts its rows, then reads header, batches in stable order, footer."""

    async def count(self, session: AsyncSession) -> int:
        """Rows the export will contain (inside the read transaction)."""
        ...

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """Bytes before the first record; `snapshot_at` is the moment the read's snapshot stands for."""
        ...

    def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """Records in stable order, keyset-paginated, at most `size` rows and about `budget` bytes at a time."""
        ...

    def footer(self) -> bytes:
        """Bytes after the last record."""
        ...


def _param(name: str) -> ColumnElement[int]:
    # Cast: psycopg sends a Python int as the smallest type that holds it, so one statement would be
    # prepared once per type.
    return sql_cast(bindparam(name), BigInteger)


class Pace:
    """The next keyset page's LIMIT: `size` rows, fewer once the rows are known to be wide.

    The budget itself is cut in SQL; the page's rows after the cut are read and dropped by the database. So the
    limit follows the width of the last batch: just over the rows that fit the budget at that width.
    """

    def __init__(self, size: int, budget: int) -> None:
        self.size = size
        self.budget = budget
        self.limit = size

    def saw(self, rows: int, width: int) -> None:
        """The last batch held `rows` rows of `width` bytes in all."""
        if rows > 0:
            per_row = max(1, -(-width // rows))
            self.limit = max(1, min(self.size, -(-self.budget // per_row) + 1))


def rfc3339(t: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds, always six digits (as the CSV's stored timestamps are written)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class TicketsCsv:
    """SPEC §7 tickets CSV: BOM, CRLF, every field quoted, formula guard on text cells (stored by 0004)."""

    def __init__(
        self,
        org_id: uuid.UUID,
        filters: TicketFilters,
        membership_id: uuid.UUID | None,
        delimiter: str,
        creator_id: uuid.UUID | None = None,
    ) -> None:
        self.org_id = org_id
        self.conditions = ticket_conditions(filters, membership_id)
        self.delimiter = delimiter
        self.creator_id = creator_id

    @classmethod
    def from_stored(
        cls,
        org_id: uuid.UUID,
        filters: dict[str, Any],
        membership_id: uuid.UUID | None,
        delimiter: str,
        creator_id: uuid.UUID | None = None,
    ) -> TicketsCsv:
        """Build from the filters as stored on the export; `creator_id` for own scope (RLS enforces it too)."""
        return cls(org_id, parse_filters(filters), membership_id, delimiter, creator_id)

    def _where(self) -> list[ColumnElement[bool]]:
        where = [Ticket.org_id == self.org_id, *self.conditions]
        if self.creator_id is not None:
            where.append(Ticket.creator_id == self.creator_id)
        return where

    async def count(self, session: AsyncSession) -> int:
        """Matching tickets visible under the export's RLS context."""
        n = await session.scalar(select(func.count()).select_from(Ticket).where(*self._where()))
        return int(n or 0)

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

    def _batch(self, ordered: bool) -> Select[Any]:
        page = (
            select(Ticket.number.label("key"), self._line().label("line"))
            .where(*self._where(), Ticket.number > bindparam("after", type_=Ticket.number.type))
            .order_by(Ticket.number)
            .limit(_param("limit"))
            .subquery()
        )
        # The page's bytes before each record (the window runs over the page in its order, no sort): the batch
        # keeps the records that start under the budget.
        width = func.octet_length(page.c.line)
        before = func.sum(width).over(order_by=page.c.key, rows=(None, 0)) - width
        sized = select(page.c.key, page.c.line, before.label("before")).subquery()
        kept = sized.c.before < _param("budget")
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
        async with conn.cursor(binary=True) as cur:
            cur.adapters.register_loader("text", ByteaBinaryLoader)
            while True:
                limit = pace.limit
                await cur.execute(sql, {**params, "after": after, "limit": limit, "budget": budget})
                row = await cur.fetchone()
                if row is None or not row[1]:
                    return
                page: int = row[0]
                rows: int = row[1]
                last: int = row[2]
                data: bytes = row[3]
                yield Batch(rows=rows, last=last, data=data)
                if rows == page < limit:  # nothing cut, and the page ran out before its limit: the last batch
                    return
                pace.saw(rows, len(data))
                after = last

    def footer(self) -> bytes:
        """Nothing after the last record."""
        return b""


# Timestamps arrive as datetimes (binary, in the snapshot's UTC session) and msgspec writes them as RFC 3339
# with a `Z`. It leaves out a fraction of zero, so a whole-second value goes in as text with its six digits.
# Encoding goes by the values' own types, never the annotation, so the annotation says what both spellings are
# on the wire, for the JSON Schema (exports.archive): an RFC 3339 date-time string.
Stamp = Annotated[str, msgspec.Meta(extra_json_schema={"format": "date-time"})]
# UUIDs arrive as text; the schema still says what they are.
Id = Annotated[str, msgspec.Meta(extra_json_schema={"format": "uuid"})]

# The snapshot's types: the writer encodes rows into the two item types (without validating them), and
# `SnapshotDocument` describes the whole file for its JSON Schema. `forbid_unknown_fields` only shapes that
# schema (`additionalProperties: false`: a recipient can check that nothing else, an email say, is in it).


class SnapshotProject(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A live project; `version` is its own edit counter."""

    id: Id
    name: str
    version: int
    created_at: Stamp
    updated_at: Stamp


class SnapshotTask(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A task of a live project."""

    id: Id
    project_id: Id
    title: str
    status: Literal["todo", "doing", "done"]
    due_date: dt.date | None
    created_at: Stamp
    updated_at: Stamp


class SnapshotDocument(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """An organization's live projects and their tasks (Space snapshot, schemaVersion 1)."""

    schema_version: Literal[1]
    organization_id: Id
    organization_name: str
    snapshot_at: Stamp
    projects: list[SnapshotProject]
    tasks: list[SnapshotTask]


def _quoted(value: bytes) -> Any:
    """UTF-8 text that needs no escaping, as the JSON string msgspec would write (Any: it stands for a str)."""
    return msgspec.Raw(b'"' + value + b'"')


def _raw_task(row: tuple[Any, ...]) -> SnapshotTask:
    """A wide page's task row, its text columns as bytes (see `Snapshot._keyset`), the same JSON as `SnapshotTask`:
    a title that holds no byte msgspec escapes (`title_plain`, migration 0014) goes out as it is stored."""
    key, project, title, status, due, created, updated, plain, _ = row
    if not (created.microsecond and updated.microsecond):
        created, updated = _stamp(created), _stamp(updated)
    text = _quoted(title) if plain else title.decode()
    return SnapshotTask(_quoted(key), _quoted(project), text, status.decode(), due, created, updated)


@dataclass(frozen=True)
class WidePages:
    """How a keyset reads a page of wide rows: with `columns` added, text as bytes, each row made by `row`."""

    columns: tuple[Any, ...]
    row: Callable[[tuple[Any, ...]], msgspec.Struct]


def _whole_seconds(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # Rare (one value in a million): the last two columns, as the text msgspec would not write.
    *head, created, updated = row
    return (*head, _stamp(created), _stamp(updated))


def _stamp(t: dt.datetime) -> dt.datetime | str:
    return rfc3339(t) if t.microsecond == 0 else t


class Snapshot:
    """SPEC §7 JSON snapshot: live projects, then the tasks of live projects, each by id."""

    _encoder = msgspec.json.Encoder()

    def __init__(self, org_id: uuid.UUID, org_name: str) -> None:
        self.org_id = org_id
        self.org_name = org_name

    def _projects(self) -> list[ColumnElement[bool]]:
        return [Project.org_id == self.org_id, Project.deleted_at.is_(None)]

    def _tasks(self) -> list[ColumnElement[bool]]:
        return [Task.org_id == self.org_id, Project.org_id == self.org_id, Project.deleted_at.is_(None)]

    async def count(self, session: AsyncSession) -> int:
        """Live projects plus their tasks."""
        projects = await session.scalar(select(func.count()).select_from(Project).where(*self._projects()))
        tasks = await session.scalar(
            select(func.count()).select_from(Task).join(Project, Project.id == Task.project_id).where(*self._tasks())
        )
        return int(projects or 0) + int(tasks or 0)

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """The envelope up to the projects array."""
        enc = msgspec.json.encode
        return b'{"schemaVersion":%d,"organizationId":%s,"organizationName":%s,"snapshotAt":%s,"projects":[' % (
            SCHEMA_VERSION,
            enc(str(self.org_id)),
            enc(self.org_name),
            enc(rfc3339(snapshot_at)),
        )

    async def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """Projects, the separator between the arrays, then tasks (at most SNAPSHOT_BATCH_ROWS rows and about
        `budget` bytes per batch)."""
        size = min(size, SNAPSHOT_BATCH_ROWS)
        projects = select(
            sql_cast(Project.id, Text).label("key"),
            Project.name,
            Project.version,
            Project.created_at,
            Project.updated_at,
        ).where(*self._projects())
        width = func.octet_length(Project.name) + _JSON_ROW_BYTES
        async for batch in self._keyset(session, (size, budget), projects, (Project.id, width), SnapshotProject, {}):
            yield batch
        yield Batch(rows=0, last=None, data=b'],"tasks":[')
        # The live projects' ids, read in the snapshot, as a constant array: PostgreSQL probes it through a
        # hash table, where a join would look each task's project up in an index.
        live = list((await session.execute(select(Project.id).where(*self._projects()))).scalars())
        tasks = select(
            sql_cast(Task.id, Text).label("key"),
            sql_cast(Task.project_id, Text),
            Task.title,
            Task.status,
            Task.due_date,
            Task.created_at,
            Task.updated_at,
        ).where(Task.org_id == self.org_id, Task.project_id == any_(bindparam("live", type_=ARRAY(Uuid))))
        width = func.octet_length(Task.title) + _JSON_ROW_BYTES
        wide = WidePages((Task.title_plain,), _raw_task)
        async for batch in self._keyset(
            session, (size, budget), tasks, (Task.id, width), SnapshotTask, {"live": live}, wide
        ):
            yield batch

    async def _keyset(
        self,
        session: AsyncSession,
        bounds: tuple[int, int],
        query: Select[*tuple[Any, ...]],
        order: tuple[Any, ColumnElement[int]],
        out: type[msgspec.Struct],
        values: dict[str, Any],
        wide: WidePages | None = None,
    ) -> AsyncIterator[Batch]:
        # UUIDs arrive as text (uuid objects only to print them again would cost more than all the rest);
        # timestamps as datetimes, which the C loader makes and msgspec writes faster than to_char would.
        # Each row ends with `upto`, the page's estimated bytes up to and including it (read from the last row
        # only, for the pace; the encoding leaves it out).
        # Wide rows: after a page whose rows averaged over WIDE_ROW_BYTES, the next is read with `wide`'s columns
        # and its text as UTF-8 bytes, and turned into rows by `wide.row`, which passes text that needs no
        # escaping on as it is: for 2,000-byte titles, decoding and encoding them again was most of the
        # worker's time.
        size, budget = bounds
        key, width = order
        after = query.where(key > bindparam("after", type_=key.type))
        wide_columns = wide.columns if wide is not None else ()
        plain_sql = [compiled(session, _sized(q, key, width)) for q in (query, after)]
        wide_sql = [compiled(session, _sized(q.add_columns(*wide_columns), key, width)) for q in (query, after)]
        conn = await driver_connection(session)
        pace = Pace(size, budget)

        async def run(cur: psycopg.AsyncCursor[Any], last: str | None) -> psycopg.AsyncCursor[Any]:
            sql, params = (wide_sql if cur in wide_cursors else plain_sql)[last is not None]
            # Never prepared: each batch is planned with its values, so the array stays a constant.
            bound = {**params, **values, "after": last, "limit": pace.limit, "budget": budget}
            await cur.execute(sql, bound, prepare=False)
            return cur

        # Two cursors a kind (text as str, text as bytes): while one's result is turned into JSON here, the
        # other's query runs in the database.
        async with contextlib.AsyncExitStack() as stack:
            cursors = [await stack.enter_async_context(conn.cursor(binary=True)) for _ in range(4)]
            for cur in cursors[2:]:
                cur.adapters.register_loader("text", ByteaBinaryLoader)
            plain_cursors, wide_cursors = cursors[:2], cursors[2:]
            ahead: asyncio.Task[psycopg.AsyncCursor[Any]] | None = asyncio.create_task(run(plain_cursors[0], None))
            first = True
            try:
                while ahead is not None:
                    cur = await ahead
                    ahead = None
                    rows = cur.rowcount
                    if rows <= 0:
                        return
                    await cur.scroll(rows - 1, mode="absolute")
                    final = await cur.fetchone()
                    assert final is not None
                    last, upto = final[0], final[-1]
                    as_bytes = isinstance(last, bytes)
                    if as_bytes:
                        last = last.decode()
                    stamp = -2 - (len(wide_columns) if as_bytes else 0)  # the last timestamp (updated)
                    await cur.scroll(0, mode="absolute")
                    # A page cut by the budget has fewer rows than its limit too; only an empty one is the end.
                    pace.saw(rows, upto)
                    plain_cursors.reverse()
                    wide_cursors.reverse()
                    kind = wide_cursors if wide is not None and upto > WIDE_ROW_BYTES * rows else plain_cursors
                    ahead = asyncio.create_task(run(kind[0], last))
                    await asyncio.sleep(0)  # let it send the query before the CPU work below
                    # About ENCODE_BYTES at a time become Python objects and bytes; the slices go out as they are
                    # made (memory stays at a slice), the batch's row count with its last slice. Between slices
                    # the event loop runs: the next page's rows, which the database sends meanwhile, are taken
                    # off the socket (a Unix socket holds about 200 KB; a full one stops the backend).
                    step = max(1, min(_ENCODE_ROWS, ENCODE_BYTES * rows // max(1, upto)))
                    done = 0
                    while part := await cur.fetchmany(step):
                        if done:
                            await asyncio.sleep(0)
                        if part[0][stamp].utcoffset() != _ZERO:
                            raise RuntimeError("the snapshot's session must be in UTC")
                        data = bytearray()
                        self._encoder.encode_into(
                            [wide.row(row) for row in part]  # type: ignore[union-attr]
                            if as_bytes
                            else [
                                out(*row[:-1])
                                if row[-2].microsecond and row[-3].microsecond
                                else out(*_whole_seconds(row[:-1]))
                                for row in part
                            ],
                            data,
                        )
                        del data[-1]  # the list's ']'
                        data[0] = ord(",")  # the list's '[' becomes the comma after the previous object
                        done += len(part)
                        yield Batch(
                            rows=rows if done == rows else 0, last=last, data=memoryview(data)[1 if first else 0 :]
                        )
                        first = False
            finally:
                if ahead is not None:
                    ahead.cancel()
                    with contextlib.suppress(BaseException):
                        await ahead

    def footer(self) -> bytes:
        """Closes the tasks array and the object."""
        return b"]}"


def _sized(query: Select[*tuple[Any, ...]], key: Any, width: ColumnElement[int]) -> Select[Any]:
    """A snapshot page: `query` by `key`, LIMIT :limit rows, cut where the running sum of `width` (each row's
    estimated bytes) passes :budget. Its columns: the query's, then `upto`, the bytes up to each row."""
    # `ord` is the key itself (a uuid), not its text: the window and the outer query then keep the page's index
    # order without a sort, and the order is the keyset's whatever the collation.
    extra = ("width", "ord")
    page = query.add_columns(width.label("width"), key.label("ord")).order_by(key).limit(_param("limit")).subquery()
    data = [c for c in page.c if c.name not in extra]
    upto = func.sum(page.c.width).over(order_by=page.c.ord, rows=(None, 0))
    sized = select(*data, upto.label("upto"), page.c.width, page.c.ord).subquery()
    return (
        select(*(c for c in sized.c if c.name not in extra))
        .where(sized.c.upto - sized.c.width < _param("budget"))
        .order_by(sized.c.ord)
    )
