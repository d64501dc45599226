"""The `snapshot` kind (SPEC §7): the org's live projects, then the tasks of live projects, as one JSON document.

Tasks come back as rows (UUIDs as text, timestamps as datetimes) and msgspec encodes them: that work runs in the
worker's process, beside the database backend that reads, instead of on that one backend. A keyset is read by
`_pages` (two cursors a kind, the next page's query running while this one is encoded) and encoded by
`Snapshot._keyset`. Pages of wide rows come with their text as bytes, and a title that needs no escaping
(`tasks.title_plain`, kept on write) goes out as it is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import psycopg
from psycopg.types.string import ByteaBinaryLoader
from sqlalchemy import ColumnElement, Select, Text, Uuid, any_, bindparam, func, literal_column, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import compiled, driver_connection
from space.exports.formats.base import (
    BATCH_BYTES,
    Batch,
    ExportRequest,
    Order,
    Pace,
    bigint_param,
    rfc3339,
)
from space.exports.increments import Since
from space.orgs import service as orgs
from space.projects.models import Project, Task

SCHEMA_VERSION = 1
_PROJECT_XID: ColumnElement[Any] = literal_column("projects.row_xid")
_TASK_XID: ColumnElement[Any] = literal_column("tasks.row_xid")
FILE = "snapshot.json"
"""The snapshot's file, as a failure's words and the archive's member name call it."""
_ENCODE_ROWS = 2000
ENCODE_BYTES = 128 * 1024
"""About this many bytes of snapshot rows are encoded at a time (at most _ENCODE_ROWS rows)."""
WIDE_ROW_BYTES = 1024
"""Snapshot rows wider than this on average (name or title and the rest) make the next page a wide one."""
# A snapshot batch's rows arrive whole in the worker's memory (libpq keeps a query's result until it is
# done with), two batches at a time while the next is read ahead: at most this many rows per batch keeps
# that near 4 MB. A CSV batch is one string and keeps the configured size.
SNAPSHOT_BATCH_ROWS = 5000
_JSON_ROW_BYTES = 240
"""A snapshot row's JSON besides its name or title (keys, ids, stamps): its width is that text plus this."""
_ZERO = dt.timedelta(0)


class SnapshotRequest(ExportRequest, tag="snapshot"):
    """`{"kind": "snapshot"}`: the org's live projects and tasks as JSON (staff only)."""


async def open_snapshot(session: AsyncSession, order: Order, membership_id: uuid.UUID) -> Snapshot:
    """The org's snapshot, its name read inside the snapshot transaction like every other byte of the file."""
    return Snapshot(order.org_id, await orgs.org_name(session, order.org_id), getattr(order, "since", None))


# Timestamps arrive as datetimes (binary, in the snapshot's UTC session) and msgspec writes them as RFC 3339
# with a `Z`. It leaves out a fraction of zero, so a whole-second value goes in as text with its six digits.
# Encoding goes by the values' own types, never the annotation, so the annotation says what both spellings are
# on the wire, for the JSON Schema (formats.archive): an RFC 3339 date-time string.
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
    """A wide page's task row, its text columns as bytes (see `_pages`), the same JSON as `SnapshotTask`:
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

    def __init__(self, org_id: uuid.UUID, org_name: str, since: Since | None = None) -> None:
        self.org_id = org_id
        self.org_name = org_name
        self.since = since
        """An incremental run's start: only what was written since, and `deleted` (None: complete)."""
        self.deleted: dict[str, list[str]] = {"projects": [], "tasks": []}

    def _live(self) -> list[ColumnElement[bool]]:
        return [Project.org_id == self.org_id, Project.deleted_at.is_(None)]

    def _projects(self) -> list[ColumnElement[bool]]:
        return [*self._live(), *self._changed(_PROJECT_XID)]

    def _changed(self, row_xid: Any) -> list[ColumnElement[bool]]:
        return [] if self.since is None else [self.since.changed(row_xid)]

    def _tasks(self) -> list[ColumnElement[bool]]:
        return [Task.org_id == self.org_id, *self._live(), *self._changed(_TASK_XID)]

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """Live projects plus their tasks, the rows of the one file."""
        projects = await session.scalar(select(func.count()).select_from(Project).where(*self._projects()))
        tasks = await session.scalar(
            select(func.count()).select_from(Task).join(Project, Project.id == Task.project_id).where(*self._tasks())
        )
        return {FILE: int(projects or 0) + int(tasks or 0)}

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
        live = list((await session.execute(select(Project.id).where(*self._live()))).scalars())
        tasks = select(
            sql_cast(Task.id, Text).label("key"),
            sql_cast(Task.project_id, Text),
            Task.title,
            Task.status,
            Task.due_date,
            Task.created_at,
            Task.updated_at,
        ).where(
            Task.org_id == self.org_id,
            Task.project_id == any_(bindparam("live", type_=ARRAY(Uuid))),
            *self._changed(_TASK_XID),
        )
        width = func.octet_length(Task.title) + _JSON_ROW_BYTES
        wide = WidePages((Task.title_plain,), _raw_task)
        async for batch in self._keyset(
            session, (size, budget), tasks, (Task.id, width), SnapshotTask, {"live": live}, wide
        ):
            yield batch
        if self.since is not None:
            await self._read_deleted(session)

    async def _read_deleted(self, session: AsyncSession) -> None:
        # Projects deleted since the previous run (a deletion is an UPDATE of the project: its row is the
        # tombstone), and the tasks they took with them.
        assert self.since is not None
        gone = (
            select(Project.id)
            .where(Project.org_id == self.org_id, Project.deleted_at.is_not(None), self.since.changed(_PROJECT_XID))
            .order_by(Project.id)
        )
        projects = list((await session.execute(gone)).scalars())
        tasks = (
            select(Task.id)
            .where(Task.org_id == self.org_id, Task.project_id == any_(bindparam("gone", type_=ARRAY(Uuid))))
            .order_by(Task.id)
        )
        self.deleted = {
            "projects": [str(p) for p in projects],
            "tasks": [str(t) for t in (await session.execute(tasks, {"gone": projects})).scalars()],
        }

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
        """The keyset's rows as batches of JSON objects, each after a comma but the very first: the pages as
        `_pages` reads them, encoded a slice at a time."""
        first = True
        # Closed with this generator: the reader's cursors and its read-ahead end before the transaction.
        async with contextlib.aclosing(_pages(session, bounds, query, order, values, wide)) as pages:
            async for page in pages:
                # About ENCODE_BYTES at a time become Python objects and bytes; the slices go out as they are made
                # (memory stays at a slice), the batch's row count with its last slice. Between slices the event
                # loop runs: the next page's rows, which the database sends meanwhile, are taken off the socket
                # (a Unix socket holds about 200 KB; a full one stops the backend).
                step = max(1, min(_ENCODE_ROWS, ENCODE_BYTES * page.rows // max(1, page.upto)))
                row = wide.row if wide is not None and page.wide else None
                done = 0
                while part := await page.cursor.fetchmany(step):
                    if done:
                        await asyncio.sleep(0)
                    if part[0][page.stamp].utcoffset() != _ZERO:
                        raise RuntimeError("the snapshot's session must be in UTC")
                    data = self._encode(part, out, row)
                    done += len(part)
                    rows = page.rows if done == page.rows else 0
                    yield Batch(rows=rows, last=page.last, data=memoryview(data)[1 if first else 0 :])
                    first = False

    def _encode(
        self,
        part: list[tuple[Any, ...]],
        out: type[msgspec.Struct],
        row: Callable[[tuple[Any, ...]], msgspec.Struct] | None,
    ) -> bytearray:
        """Rows as JSON objects, a comma before each. `row` makes a wide page's rows (text as bytes); a text page's
        are `out`'s fields in order, then `upto`, which the encoding leaves out."""
        data = bytearray()
        self._encoder.encode_into(
            [row(r) for r in part]
            if row is not None
            else [
                out(*r[:-1]) if r[-2].microsecond and r[-3].microsecond else out(*_whole_seconds(r[:-1])) for r in part
            ],
            data,
        )
        del data[-1]  # the list's ']'
        data[0] = ord(",")  # the list's '[' becomes the comma after the previous object
        return data

    def footer(self) -> bytes:
        """Closes the tasks array and the object; an incremental run's `deleted` ids come last."""
        if self.since is None:
            return b"]}"
        return b'],"deleted":' + msgspec.json.encode(self.deleted) + b"}"


@dataclass(frozen=True)
class _Page:
    """A keyset page, its rows waiting on `cursor`: `rows` of them, about `upto` bytes, the last one's key `last`;
    `wide`: its text columns came as bytes, with the wide columns after the rest (`stamp`: its `updatedAt`)."""

    cursor: psycopg.AsyncCursor[Any]
    rows: int
    last: str
    upto: int
    wide: bool
    stamp: int


async def _pages(
    session: AsyncSession,
    bounds: tuple[int, int],
    query: Select[*tuple[Any, ...]],
    order: tuple[Any, ColumnElement[int]],
    values: dict[str, Any],
    wide: WidePages | None,
) -> AsyncGenerator[_Page]:
    """`query`'s rows by `order`'s key, a page at a time, each at most `bounds` (rows, bytes) and read while the
    one before it is taken off its cursor: the page handed out is the caller's until it asks for the next one."""
    # UUIDs arrive as text (uuid objects only to print them again would cost more than all the rest); timestamps
    # as datetimes, which the C loader makes and msgspec writes faster than to_char would. Each row ends with
    # `upto`, the page's estimated bytes up to and including it (read from the last row only, for the pace).
    # Wide rows: after a page whose rows averaged over WIDE_ROW_BYTES, the next is read with `wide`'s columns and
    # its text as UTF-8 bytes, for `wide.row`, which passes text that needs no escaping on as it is: for
    # 2,000-byte titles, decoding and encoding them again was most of the worker's time.
    size, budget = bounds
    key, width = order
    wide_columns = wide.columns if wide is not None else ()
    plain_sql = _statements(session, query, key, width, ())
    wide_sql = _statements(session, query, key, width, wide_columns)
    conn = await driver_connection(session)
    pace = Pace(size, budget)

    async def run(cur: psycopg.AsyncCursor[Any], last: str | None) -> psycopg.AsyncCursor[Any]:
        sql, params = (wide_sql if cur in wide_cursors else plain_sql)[last is not None]
        # Never prepared: each batch is planned with its values, so the array stays a constant.
        await cur.execute(
            sql, {**params, **values, "after": last, "limit": pace.limit, "budget": budget}, prepare=False
        )
        return cur

    # Two cursors a kind (text as str, text as bytes): while one's page is handed out, the other's query runs in
    # the database. The cursor of the page just handed out is never the next one's.
    async with contextlib.AsyncExitStack() as stack:
        cursors = [await stack.enter_async_context(conn.cursor(binary=True)) for _ in range(4)]
        for cur in cursors[2:]:
            cur.adapters.register_loader("text", ByteaBinaryLoader)
        plain_cursors, wide_cursors = cursors[:2], cursors[2:]
        ahead: asyncio.Task[psycopg.AsyncCursor[Any]] | None = asyncio.create_task(run(plain_cursors[0], None))
        try:
            while ahead is not None:
                cur = await ahead
                ahead = None
                rows = cur.rowcount
                if rows <= 0:
                    return  # a page cut by the budget has fewer rows than its limit too; only an empty one ends
                last, upto, as_bytes = await _last_row(cur)
                pace.saw(rows, upto)
                plain_cursors.reverse()
                wide_cursors.reverse()
                kind = wide_cursors if wide is not None and upto > WIDE_ROW_BYTES * rows else plain_cursors
                ahead = asyncio.create_task(run(kind[0], last))
                await asyncio.sleep(0)  # let it send the query before the caller's CPU work
                stamp = -2 - (len(wide_columns) if as_bytes else 0)
                yield _Page(cur, rows, last, upto, as_bytes, stamp)
        finally:
            if ahead is not None:
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    await ahead


def _statements(
    session: AsyncSession,
    query: Select[*tuple[Any, ...]],
    key: Any,
    width: ColumnElement[int],
    columns: tuple[Any, ...],
) -> list[tuple[str, dict[str, Any]]]:
    """The compiled statements of a keyset's first page and of the pages after `:after`, with `columns` added."""
    after = query.where(key > bindparam("after", type_=key.type))
    return [compiled(session, _sized(q.add_columns(*columns) if columns else q, key, width)) for q in (query, after)]


async def _last_row(cur: psycopg.AsyncCursor[Any]) -> tuple[str, int, bool]:
    """The key and `upto` of a page's last row, and whether its text came as bytes; the cursor is left at the
    page's first row."""
    await cur.scroll(cur.rowcount - 1, mode="absolute")
    final = await cur.fetchone()
    assert final is not None
    await cur.scroll(0, mode="absolute")
    last, upto = final[0], final[-1]
    if isinstance(last, bytes):
        return last.decode(), upto, True
    return last, upto, False


def _sized(query: Select[*tuple[Any, ...]], key: Any, width: ColumnElement[int]) -> Select[Any]:
    """A snapshot page: `query` by `key`, LIMIT :limit rows, cut where the running sum of `width` (each row's
    estimated bytes) passes :budget. Its columns: the query's, then `upto`, the bytes up to each row."""
    # `ord` is the key itself (a uuid), not its text: the window and the outer query then keep the page's index
    # order without a sort, and the order is the keyset's whatever the collation.
    extra = ("width", "ord")
    page = (
        query.add_columns(width.label("width"), key.label("ord")).order_by(key).limit(bigint_param("limit")).subquery()
    )
    data = [c for c in page.c if c.name not in extra]
    upto = func.sum(page.c.width).over(order_by=page.c.ord, rows=(None, 0))
    sized = select(*data, upto.label("upto"), page.c.width, page.c.ord).subquery()
    return (
        select(*(c for c in sized.c if c.name not in extra))
        .where(sized.c.upto - sized.c.width < bigint_param("budget"))
        .order_by(sized.c.ord)
    )
