"""The two output formats. PostgreSQL formats each keyset batch into final bytes (one string_agg per batch),
so the worker never turns rows into Python values: memory is one batch, whatever the number of rows.

Every query carries `org_id = :org` beside the RLS policy: the planner then uses the org index instead of
evaluating the policy per row.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from sqlalchemy import ColumnElement, Select, Text, cast, func, literal, select
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncSession

from space.auth.models import User
from space.orgs.models import Membership
from space.projects.models import Project, Task
from space.tickets.filters import TicketFilters, parse_filters, ticket_conditions
from space.tickets.models import Ticket

CSV_HEADER = ("number", "title", "status", "priority", "assignee", "createdAt", "updatedAt")
BOM = "\ufeff".encode()
CRLF = "\r\n"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Batch:
    """One keyset batch, already formatted: `rows` records in `data`, ending at key `last`."""

    rows: int
    last: Any
    data: bytes


class Writer(Protocol):
    """A format: count the rows, then header, batches in stable order, footer."""

    async def count(self, session: AsyncSession) -> int:
        """Rows the export will contain (inside the read transaction)."""
        ...

    def header(self, snapshot_at: str) -> bytes:
        """Bytes before the first record."""
        ...

    def batches(self, session: AsyncSession, size: int) -> AsyncIterator[Batch]:
        """Records in stable order, `size` rows at a time, keyset-paginated."""
        ...

    def footer(self) -> bytes:
        """Bytes after the last record."""
        ...


def iso(column: Any) -> ColumnElement[str]:
    """RFC 3339 in UTC with microseconds, independent of the session's TimeZone."""
    return func.to_char(func.timezone("UTC", column), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')


def _last(key: Any) -> Any:
    # The batch's greatest key, for any type (there is no max(uuid)).
    return func.array_agg(aggregate_order_by(key, key.desc()), type_=ARRAY(key.type))[1]


async def _run_batch(session: AsyncSession, stmt: Select[Any]) -> Batch | None:
    row = (await session.execute(stmt)).one()
    if not row.rows:
        return None
    return Batch(rows=int(row.rows), last=row.last, data=bytes(row.data))


class TicketsCsv:
    """SPEC §7 tickets CSV: BOM, CRLF, every field quoted, formula guard on text cells (SQL functions of 0003)."""

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

    def header(self, snapshot_at: str) -> bytes:
        """BOM and the quoted header record."""
        return BOM + (self.delimiter.join(f'"{h}"' for h in CSV_HEADER) + CRLF).encode()

    def _line(self) -> ColumnElement[str]:
        quote, guard = func.space_csv_quote, func.space_csv_guard
        # status and priority are CHECK-constrained words: the guard could never change them.
        cells: list[ColumnElement[str]] = [
            quote(cast(Ticket.number, Text)),
            quote(guard(Ticket.title)),
            quote(Ticket.status),
            quote(Ticket.priority),
            quote(guard(User.name)),
            quote(iso(Ticket.created_at)),
            quote(iso(Ticket.updated_at)),
        ]
        sep = literal(self.delimiter, Text)
        line: ColumnElement[str] = cells[0]
        for cell in cells[1:]:
            line = line.op("||")(sep).op("||")(cell)
        return line.op("||")(literal(CRLF, Text))

    async def batches(self, session: AsyncSession, size: int) -> AsyncIterator[Batch]:
        """Tickets by `number`, keyset."""
        after = 0
        while True:
            page = (
                select(Ticket.number.label("key"), self._line().label("line"))
                .select_from(Ticket)
                .outerjoin(Membership, Membership.id == Ticket.assignee_id)
                .outerjoin(User, User.id == Membership.user_id)
                .where(*self._where(), Ticket.number > after)
                .order_by(Ticket.number)
                .limit(size)
                .subquery()
            )
            stmt = select(
                func.count().label("rows"),
                _last(page.c.key).label("last"),
                func.convert_to(
                    func.string_agg(page.c.line, aggregate_order_by(literal("", Text), page.c.key)), "UTF8"
                ).label("data"),
            )
            batch = await _run_batch(session, stmt)
            if batch is None:
                return
            yield batch
            if batch.rows < size:
                return
            after = batch.last

    def footer(self) -> bytes:
        """Nothing after the last record."""
        return b""


class Snapshot:
    """SPEC §7 JSON snapshot: live projects, then the tasks of live projects, each by id."""

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

    def header(self, snapshot_at: str) -> bytes:
        """The envelope up to the projects array."""
        enc = msgspec.json.encode
        return b'{"schemaVersion":%d,"organizationId":%s,"organizationName":%s,"snapshotAt":%s,"projects":[' % (
            SCHEMA_VERSION,
            enc(str(self.org_id)),
            enc(self.org_name),
            enc(snapshot_at),
        )

    async def batches(self, session: AsyncSession, size: int) -> AsyncIterator[Batch]:
        """Projects, the separator between the arrays, then tasks."""
        project = func.json_build_object(
            "id",
            Project.id,
            "name",
            Project.name,
            "version",
            Project.version,
            "createdAt",
            iso(Project.created_at),
            "updatedAt",
            iso(Project.updated_at),
        )
        async for batch in self._keyset(session, size, Project.id, project, Project, self._projects()):
            yield batch
        yield Batch(rows=0, last=None, data=b'],"tasks":[')
        task = func.json_build_object(
            "id",
            Task.id,
            "projectId",
            Task.project_id,
            "title",
            Task.title,
            "status",
            Task.status,
            "dueDate",
            Task.due_date,
            "createdAt",
            iso(Task.created_at),
            "updatedAt",
            iso(Task.updated_at),
        )
        async for batch in self._keyset(session, size, Task.id, task, Task, self._tasks(), join=True):
            yield batch

    async def _keyset(
        self,
        session: AsyncSession,
        size: int,
        key: Any,
        obj: Any,
        table: Any,
        where: list[ColumnElement[bool]],
        *,
        join: bool = False,
    ) -> AsyncIterator[Batch]:
        after: uuid.UUID | None = None
        first = True
        while True:
            q = select(key.label("key"), cast(obj, Text).label("obj")).select_from(table)
            if join:
                q = q.join(Project, Project.id == Task.project_id)
            q = q.where(*where)
            if after is not None:
                q = q.where(key > after)
            page = q.order_by(key).limit(size).subquery()
            stmt = select(
                func.count().label("rows"),
                _last(page.c.key).label("last"),
                func.convert_to(
                    func.string_agg(page.c.obj, aggregate_order_by(literal(",", Text), page.c.key)), "UTF8"
                ).label("data"),
            )
            batch = await _run_batch(session, stmt)
            if batch is None:
                return
            data = batch.data if first else b"," + batch.data
            first = False
            yield Batch(rows=batch.rows, last=batch.last, data=data)
            if batch.rows < size:
                return
            after = batch.last

    def footer(self) -> bytes:
        """Closes the tasks array and the object."""
        return b"]}"
