"""The archive's lossless data files (SPEC §23, schemaVersion 2): `data/members.jsonl`, `data/projects.jsonl`,
`data/tasks.jsonl`, `data/tickets.jsonl`, one JSON object a line, raw values (never formula-guarded).

PostgreSQL writes every line (docs/decisions/0098-restore.md): each is one text expression of fixed key order,
`to_json` for text (the same escapes every time), timestamps by `to_char` in UTC with six fraction digits, ids as
their text. `COPY (...) TO STDOUT` in CSV mode with control characters as delimiter and quote (which `to_json`
always escapes, so nothing is ever quoted) sends the lines as they are, each followed by `\n`. Lines go in a
stable order (memberships, projects and tasks by id, tickets by number): the same rows give the same bytes and
the same SHA-256, which restore's verification compares with the manifest (`imports.verify`).

The same statements, given `map_table` (a temporary table `(kind, new, old)` of a restore with new ids),
write a restored org's files in the archive's own ids, ordered by them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator

import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from space.db import driver_connection
from space.exports.formats.base import BATCH_BYTES, Batch

MEMBERS, PROJECTS, TASKS, TICKETS = (
    "data/members.jsonl",
    "data/projects.jsonl",
    "data/tasks.jsonl",
    "data/tickets.jsonl",
)
FILES = (MEMBERS, PROJECTS, TASKS, TICKETS)
MEDIA_TYPE = "application/x-ndjson"
_PIECE = 256 * 1024
_COPY = "COPY ({}) TO STDOUT (FORMAT csv, DELIMITER E'\\x01', QUOTE E'\\x02')"


def _ts(col: str) -> str:
    return f"""'"' || to_char({col} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '"'"""


def _opt(expr: str) -> str:
    return f"coalesce({expr}, 'null')"


def _id(col: str) -> str:
    return f"""'"' || {col}::text || '"'"""


def _mapped(kind: str, col: str, alias: str, map_table: str | None) -> tuple[str, str]:
    """The archive's id for `col` (after a restore's mapping) and the join that finds it."""
    if map_table is None:
        return col, ""
    join = f" LEFT JOIN {map_table} {alias} ON {alias}.kind = '{kind}' AND {alias}.new = {col}"
    return f"coalesce({alias}.old, {col})", join


def statement(name: str, map_table: str | None = None) -> str:
    """The SELECT of one data file's lines for the org `%(org)s`, in the file's order."""
    if name == MEMBERS:
        mid, j1 = _mapped("membership", "m.id", "mm", map_table)
        uid, j2 = _mapped("user", "u.id", "mu", map_table)
        line = (
            f"""'{{"membershipId":' || {_id(mid)} || ',"userId":' || {_id(uid)} || ',"email":' || to_json(u.email)"""
            """ || ',"name":' || to_json(u.name) || ',"role":' || to_json(m.role) || '}'"""
        )
        return (
            f"SELECT {line} FROM memberships m JOIN users u ON u.id = m.user_id{j1}{j2}"
            f" WHERE m.org_id = %(org)s ORDER BY {mid}"
        )
    if name == PROJECTS:
        pid, j1 = _mapped("project", "p.id", "mp", map_table)
        line = (
            f"""'{{"id":' || {_id(pid)} || ',"name":' || to_json(p.name) || ',"version":' || p.version::text"""
            f""" || ',"deletedAt":' || {_opt(_ts("p.deleted_at"))} || ',"createdAt":' || {_ts("p.created_at")}"""
            f""" || ',"updatedAt":' || {_ts("p.updated_at")} || '}}'"""
        )
        return f"SELECT {line} FROM projects p{j1} WHERE p.org_id = %(org)s ORDER BY {pid}"
    if name == TASKS:
        tid, j1 = _mapped("task", "t.id", "mt", map_table)
        pid, j2 = _mapped("project", "t.project_id", "mp", map_table)
        due = _opt("""'"' || to_char(t.due_date, 'YYYY-MM-DD') || '"'""")
        line = (
            f"""'{{"id":' || {_id(tid)} || ',"projectId":' || {_id(pid)} || ',"title":' || to_json(t.title)"""
            f""" || ',"status":' || to_json(t.status) || ',"dueDate":' || {due}"""
            f""" || ',"createdAt":' || {_ts("t.created_at")} || ',"updatedAt":' || {_ts("t.updated_at")} || '}}'"""
        )
        return f"SELECT {line} FROM tasks t{j1}{j2} WHERE t.org_id = %(org)s ORDER BY {tid}"
    assert name == TICKETS, name
    cid, j1 = _mapped("user", "k.creator_id", "mc", map_table)
    aid, j2 = _mapped("membership", "k.assignee_id", "ma", map_table)
    line = (
        """'{"number":' || k.number::text || ',"title":' || to_json(k.title) || ',"body":' || to_json(k.body)"""
        """ || ',"status":' || to_json(k.status) || ',"priority":' || to_json(k.priority)"""
        f""" || ',"creatorId":' || {_id(cid)} || ',"assigneeId":' || {_opt(_id(aid))}"""
        f""" || ',"createdAt":' || {_ts("k.created_at")} || ',"updatedAt":' || {_ts("k.updated_at")} || '}}'"""
    )
    return f"SELECT {line} FROM tickets k{j1}{j2} WHERE k.org_id = %(org)s ORDER BY k.number"


async def copy_lines(
    conn: psycopg.AsyncConnection[object], name: str, org_id: uuid.UUID, map_table: str | None = None
) -> AsyncIterator[tuple[bytes, int]]:
    """A data file's bytes, about _PIECE at a time, with the lines in each piece (in the caller's transaction)."""
    sql = _COPY.format(statement(name, map_table))
    buf = bytearray()
    lines = 0
    async with conn.cursor() as cur, cur.copy(sql, {"org": org_id}) as copy:
        async for data in copy:
            buf += data
            lines += 1
            if len(buf) >= _PIECE:
                yield bytes(buf), lines
                buf.clear()
                lines = 0
    if buf:
        yield bytes(buf), lines


_COUNTS = {
    MEMBERS: "SELECT count(*) FROM memberships WHERE org_id = :org",
    PROJECTS: "SELECT count(*) FROM projects WHERE org_id = :org",
    TASKS: "SELECT count(*) FROM tasks WHERE org_id = :org",
    TICKETS: "SELECT count(*) FROM tickets WHERE org_id = :org",
}


class DataFile:
    """One data file as a Format of the archive: no header or footer, the lines as COPY sends them."""

    def __init__(self, org_id: uuid.UUID, name: str) -> None:
        self.org_id = org_id
        self.name = name

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """The file's lines (every row of its table in the org)."""
        return {self.name: int(await session.scalar(text(_COUNTS[self.name]), {"org": self.org_id}) or 0)}

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """Nothing before the first line."""
        return b""

    async def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """The lines, a piece at a time, read on the snapshot connection."""
        conn = await driver_connection(session)
        async for data, lines in copy_lines(conn, self.name, self.org_id):
            yield Batch(rows=lines, last=None, data=data)

    def footer(self) -> bytes:
        """Nothing after the last line."""
        return b""
