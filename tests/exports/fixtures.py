"""Helpers for the export tests: seed rows directly (as the app role, under the org's RLS context), a gate
that pauses the real worker at named points, and small waiting helpers that poll real states with timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import io
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
from httpx import Response
from sqlalchemy import select, text, update

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.lease import Lease
from space.exports.models import ExportChunk, ExportJob
from space.exports.pipeline import ExportRunner, run_export
from space.projects.models import Project, Task
from space.tickets.models import Ticket, TicketCounter
from space.worker import run_worker
from tests.exports.s3_fixtures import follow, store_for
from tests.helpers import Api, Org, TestUser

WAIT = 15.0
"""Seconds any wait in these tests may take before it fails."""


def tuned(settings: Settings, **overrides: Any) -> Settings:
    """Settings with some export fields changed."""
    return msgspec.structs.replace(settings, **overrides)


def runner(settings: Settings, db: Database) -> ExportRunner:
    """A worker runner on the app-role database, with the result store the settings name."""
    return ExportRunner(settings, db, store_for(settings, db))


def uid(value: str | uuid.UUID) -> uuid.UUID:
    """A UUID from a string or UUID."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


async def add_tickets(
    db: Database,
    org_id: str | uuid.UUID,
    creator: TestUser,
    titles: list[str],
    *,
    status: str = "open",
    priority: str = "normal",
    assignee_id: str | uuid.UUID | None = None,
    body: str = "",
) -> list[int]:
    """Insert tickets with the next numbers of the org; returns their numbers."""
    oid = uid(org_id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        last = await uow.session.scalar(
            update(TicketCounter)
            .where(TicketCounter.org_id == oid)
            .values(last_number=TicketCounter.last_number + len(titles))
            .returning(TicketCounter.last_number)
        )
        assert last is not None
        first = last - len(titles) + 1
        numbers = list(range(first, last + 1))
        uow.session.add_all(
            Ticket(
                id=uuid.uuid4(),
                org_id=oid,
                number=n,
                title=t,
                body=body,
                status=status,
                priority=priority,
                creator_id=creator.id,
                assignee_id=uid(assignee_id) if assignee_id else None,
            )
            for n, t in zip(numbers, titles, strict=True)
        )
    return numbers


async def add_project(
    db: Database, org_id: str | uuid.UUID, name: str, tasks: list[str], *, deleted: bool = False
) -> uuid.UUID:
    """Insert a project and its tasks; `deleted` soft-deletes the project."""
    oid = uid(org_id)
    pid = uuid.uuid4()
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        uow.session.add(Project(id=pid, org_id=oid, name=name))
        await uow.session.flush()
        uow.session.add_all(Task(id=uuid.uuid4(), org_id=oid, project_id=pid, title=t) for t in tasks)
        if deleted:
            await uow.session.execute(text("UPDATE projects SET deleted_at = now() WHERE id = :id"), {"id": pid})
    return pid


async def insert_export(
    db: Database,
    org_id: str,
    creator_id: uuid.UUID,
    *,
    kind: str = "snapshot",
    state: str = "completed",
    completed_ago: dt.timedelta = dt.timedelta(hours=1),
    chunks: int = 0,
) -> uuid.UUID:
    """An export_jobs row (and result chunks) written as the app role under the org's tenant context."""
    export_id, execution_id = uuid.uuid4(), uuid.uuid4()
    oid = uuid.UUID(org_id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid, user_id=creator_id)) as uow:
        await uow.session.execute(
            text(
                "INSERT INTO export_jobs (id, org_id, creator_id, kind, state, scope, execution_id,"
                " created_at, completed_at, progress, expires_at)"
                " VALUES (:id, :org, :creator, :kind, :state, 'team', :exec, now() - :ago, now() - :ago,"
                " CASE WHEN :state = 'completed' THEN 100 ELSE 0 END,"
                # A completed result can be downloaded for the default TTL after its completion, as published.
                " CASE WHEN :state = 'completed' THEN now() - :ago + interval '24 hours' END)"
            ),
            {
                "id": export_id,
                "org": oid,
                "creator": creator_id,
                "kind": kind,
                "state": state,
                "exec": execution_id,
                "ago": completed_ago,
            },
        )
        for seq in range(chunks):
            await uow.session.execute(
                text(
                    "INSERT INTO export_chunks (export_id, execution_id, seq, org_id, data)"
                    " VALUES (:id, :exec, :seq, :org, :data)"
                ),
                {"id": export_id, "exec": execution_id, "seq": seq, "org": oid, "data": b"chunk-%d" % seq},
            )
    return export_id


async def set_org_state(db: Database, org_id: str | uuid.UUID, state: str) -> None:
    """Move an org to a state directly (the lifecycle routes are tested elsewhere)."""
    oid = uid(org_id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        await uow.session.execute(
            text("UPDATE organizations SET state = :s, delete_after = now() + interval '1 day' WHERE id = :id"),
            {"s": state, "id": oid},
        )


async def job_row(db: Database, org_id: str | uuid.UUID, export_id: str | uuid.UUID) -> ExportJob:
    """The ledger row, fresh."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org_id))) as uow:
        job = (
            await uow.session.execute(
                select(ExportJob).where(ExportJob.id == uid(export_id)).execution_options(populate_existing=True)
            )
        ).scalar_one()
        uow.session.expunge(job)
        return job


async def chunk_count(db: Database, org_id: str | uuid.UUID, export_id: str | uuid.UUID) -> int:
    """How many stored chunks an export has, over all its executions."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org_id))) as uow:
        n = await uow.session.scalar(
            select(text("count(*)")).select_from(ExportChunk).where(ExportChunk.export_id == uid(export_id))
        )
        return int(n or 0)


async def expire_lease(db: Database, org_id: str | uuid.UUID, export_id: str | uuid.UUID) -> None:
    """Make the current lease run out now (what a stalled worker's lease does after its time)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org_id))) as uow:
        await uow.session.execute(
            update(ExportJob)
            .where(ExportJob.id == uid(export_id))
            .values(lease_expires_at=text("clock_timestamp() - interval '1 second'"))
        )


def snapshot(job: ExportJob) -> dict[str, Any]:
    """The ledger fields a stale worker must not change."""
    keys = [
        "state",
        "progress",
        "execution_id",
        "error_code",
        "expires_at",
        "completed_at",
        "row_count",
        "byte_size",
        "sha256",
        "attempt",
        "snapshot_at",
        "lease_expires_at",
    ]
    return {k: getattr(job, k) for k in keys}


async def create_export(api: Api, org: Org, user: TestUser, body: dict[str, Any]) -> dict[str, Any]:
    """POST an export and check the 202."""
    r = await api.call("POST", org.path("/exports"), user, json=body)
    assert r.status_code == 202, r.text
    data: dict[str, Any] = r.json()
    assert r.headers["location"] == org.path(f"/exports/{data['id']}")
    return data


async def completed_export(api: Api, db: Database, settings: Settings, org: Org, body: dict[str, Any]) -> str:
    """The owner's export, created through the API and built by the real worker; returns its id."""
    export = await create_export(api, org, org.owner, body)
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    return str(export["id"])


async def wait_for(check: Callable[[], Awaitable[Any]], what: str, within: float = WAIT) -> Any:
    """Poll `check` until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_state(api: Api, org: Org, user: TestUser, export_id: str, states: set[str]) -> dict[str, Any]:
    """Poll the status route until the export is in one of `states`."""

    async def check() -> dict[str, Any] | None:
        r = await api.call("GET", org.path(f"/exports/{export_id}"), user)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body if body["state"] in states else None

    result: dict[str, Any] = await wait_for(check, f"export {export_id} in {states}")
    return result


def parse_csv(body: bytes, delimiter: str = ",") -> list[list[str]]:
    """Records of a CSV export, parsed by the csv module (fields may hold newlines)."""
    assert body.startswith(b"\xef\xbb\xbf"), body[:10]
    return list(csv.reader(io.StringIO(body[3:].decode("utf-8"), newline=""), delimiter=delimiter))


async def download(api: Api, org: Org, user: TestUser, export_id: str) -> Response:
    """GET the result (following an object store's 303 to its presigned URL)."""
    return await follow(await api.call("GET", org.path(f"/exports/{export_id}/result"), user, follow_redirects=False))


@dataclass
class Gate:
    """Pauses the real worker at named points; the test resumes it one arrival at a time.

    `await gate.reached(point)` waits (with a timeout) for the worker to arrive; `gate.resume(point)` lets
    one arrival continue. `open_all()` (call it in `finally`) lets everything through from then on.
    """

    points: set[str]
    seen: list[str] = field(default_factory=list)
    leases: dict[str, Lease] = field(default_factory=dict)
    fail_at: dict[str, BaseException] = field(default_factory=dict)
    _arrivals: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    _go: dict[str, asyncio.Queue[None]] = field(default_factory=dict)
    _open: bool = False

    def __post_init__(self) -> None:
        self._go = {p: asyncio.Queue() for p in self.points}

    async def __call__(self, point: str, lease: Lease) -> None:
        self.seen.append(point)
        self.leases[point] = lease
        if point in self.fail_at:
            raise self.fail_at[point]
        if point in self.points and not self._open:
            await self._arrivals.put(point)
            await self._go[point].get()

    async def reached(self, point: str) -> Lease:
        """Wait (at most WAIT seconds) until the worker is paused at `point`."""
        arrived = await asyncio.wait_for(self._arrivals.get(), WAIT)
        assert arrived == point, (arrived, point)
        return self.leases[point]

    def resume(self, point: str) -> None:
        """Let one paused arrival at `point` continue."""
        self._go[point].put_nowait(None)

    def open_all(self) -> None:
        """Stop pausing; release anyone waiting."""
        self._open = True
        for q in self._go.values():
            for _ in range(100):
                q.put_nowait(None)


@contextlib.asynccontextmanager
async def background(coro: Awaitable[Any], gate: Gate | None = None) -> AsyncIterator[asyncio.Task[Any]]:
    """Run `coro` as a task; on exit open the gate and await the task (so no test leaves it behind)."""
    task: asyncio.Task[Any] = asyncio.ensure_future(coro)
    try:
        yield task
    finally:
        if gate is not None:
            gate.open_all()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, WAIT)


async def blocked_by(owner_url: str, waiter_app: str, holder_app: str) -> bool:
    """Whether a session tagged `waiter_app` is waiting on a lock held by a session tagged `holder_app`."""
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute(
            """
            SELECT 1 FROM pg_stat_activity w
            JOIN pg_stat_activity h ON h.pid = ANY (pg_blocking_pids(w.pid))
            WHERE w.application_name = %s AND h.application_name = %s AND w.datname = current_database()
            """,
            (waiter_app, holder_app),
        )
        return await cur.fetchone() is not None


async def fail_lease(lease: Lease, code: str) -> None:
    """The lease's fenced failure write in a transaction of its own (LeaseLost when its fence is gone)."""
    async with UnitOfWork(lease.db.sessionmaker, Tenant(org_id=lease.org_id)) as uow:
        await lease.fail_in(uow, code)


@contextlib.asynccontextmanager
async def in_process_worker(settings: Settings) -> AsyncIterator[None]:
    """The real SAQ worker (both lanes), in this process, until the block ends."""
    started = asyncio.Event()
    task = asyncio.create_task(run_worker(settings, started=started))
    try:
        await asyncio.wait_for(started.wait(), WAIT)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)
