"""Incremental runs (SPEC §21), built on the database's own snapshots, never on timestamps.

Every row of tickets, projects and tasks carries `row_xid`, the id of the transaction that last wrote it (a
trigger, migration 0021). An incremental run records the snapshot it read (`pg_current_snapshot()` inside its
REPEATABLE READ transaction). The next run reads the rows whose `row_xid` that snapshot did not see,
`NOT pg_visible_in_snapshot(row_xid, previous)`, and that its own snapshot sees (its transaction decides).
A row committed while the previous run read, or by a transaction held open across the boundary, is invisible
to the previous snapshot and visible to a later one: it appears in exactly one run, with its latest version.

Every xid the previous snapshot did not see is at least its `xmin`, so `row_xid >= xmin` bounds the read and the
`(org_id, row_xid)` index serves it: a run over a million rows of which a thousand changed reads about those.
`xid8` is 64 bits (epoch and xid), so it never wraps; a run's recorded snapshot stays comparable for as long as
the database lives. A database restored from a dump is another database (another oid, its own xid counter):
the snapshots recorded before it mean nothing there, so the first run after a restore is complete (decision 0096).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Text, and_, func, literal, text
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.asyncio import AsyncSession

from space.exports.snapshots import PgSnapshot


@dataclass(frozen=True)
class Since:
    """Where an incremental run begins: the previous successful run, its `snapshotAt` and its database snapshot."""

    export_id: uuid.UUID
    snapshot_at: dt.datetime
    snapshot: str

    def changed(self, row_xid: Any) -> ColumnElement[bool]:
        """Rows the previous run's snapshot did not see (rows written before migration 0021 have none: seen)."""
        snap = sql_cast(literal(self.snapshot, Text), PgSnapshot())
        return and_(row_xid >= func.pg_snapshot_xmin(snap), ~func.pg_visible_in_snapshot(row_xid, snap))


@dataclass(frozen=True)
class Xact:
    """An incremental run's own snapshot and database, kept for the next run, and where it began (None: complete)."""

    snapshot: str
    database: int
    since: Since | None

    def columns(self) -> dict[str, Any]:
        """The ledger columns the publish sets."""
        return {
            "xact_snapshot": sql_cast(literal(self.snapshot, Text), PgSnapshot()),
            "xact_database": self.database,
            "since": self.since.snapshot_at if self.since else None,
            "since_export_id": self.since.export_id if self.since else None,
        }


_CURRENT = text(
    "SELECT pg_current_snapshot()::text AS snapshot,"
    " (SELECT oid FROM pg_database WHERE datname = current_database())::bigint AS database"
)
_PREVIOUS = text(
    "SELECT j.id, j.snapshot_at, j.xact_snapshot::text AS snapshot, j.xact_database::bigint AS database,"
    " pg_snapshot_xmax(j.xact_snapshot) <= pg_snapshot_xmax(pg_current_snapshot()) AS ordered"
    " FROM export_jobs j"
    " WHERE j.org_id = :org AND j.schedule_id = :schedule AND j.state = 'completed'"
    " AND j.xact_snapshot IS NOT NULL AND j.id <> :me"
    " ORDER BY j.completed_at DESC, j.id DESC LIMIT 1"
)


async def begin(session: AsyncSession, org_id: uuid.UUID, schedule_id: uuid.UUID | None, export_id: uuid.UUID) -> Xact:
    """Inside the run's REPEATABLE READ transaction: its snapshot, and the previous successful run of its schedule
    to continue from. None to continue from when there is none, or when that run's snapshot belongs to another
    database (a restore) or lies ahead of this one (the xid counter went back): the run is complete."""
    current = (await session.execute(_CURRENT)).one()
    since = None
    if schedule_id is not None:
        prev = (await session.execute(_PREVIOUS, {"org": org_id, "schedule": schedule_id, "me": export_id})).first()
        if prev is not None and prev.database == current.database and prev.ordered:
            since = Since(prev.id, prev.snapshot_at, prev.snapshot)
    return Xact(current.snapshot, int(current.database), since)
