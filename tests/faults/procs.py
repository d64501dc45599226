"""Real processes and real faults: `space worker` / `space api` subprocesses, the database as its owner sees
it, and a pause that holds a real worker in the middle of an export's read with nothing but row locks.

Nothing here reaches into the product: the processes are the installed console script, the pause is
PostgreSQL's own locking, and every wait polls a real state with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from space.db import Database
from space.exports.maintenance import cleanup
from space.exports.storage.postgres import PgResultStore
from tests.exports.fixtures import add_tickets, download, parse_csv, wait_for
from tests.helpers import Api, Org, free_port, space_env

SPACE = Path(sys.executable).with_name("space")
"""The installed console script (`.venv/bin/space`)."""

WAIT = 60.0
"""Longest any single wait of the fault tests may take before it fails (a recovery spans a lease, a sweep
and SAQ's abort wait of 5 s; on a busy two-core machine that needs headroom)."""

SCENARIO_SECONDS = 600
"""pytest-timeout of the longest scenarios (many processes, dozens of exports, each step a wait of up to WAIT):
on a loaded two-core machine they ran past the suite's 120 s while every wait still held, and the bound that
fires must be the one that says what it waited for."""

LEASE_SECONDS = 3
FAULT_SETTINGS: dict[str, str] = {
    # Short leases so a lost worker's export is claimable again within seconds.
    "SPACE_EXPORT_LEASE_SECONDS": str(LEASE_SECONDS),
    # Small batches and chunks: an export of a few hundred rows takes many progress writes and chunks.
    # A batch (about 2 KB) is smaller than a chunk (8 KB), so progress is written before the first chunk.
    "SPACE_EXPORT_BATCH_ROWS": "20",
    "SPACE_EXPORT_CHUNK_BYTES": "8192",
    "SPACE_EXPORT_RETRIES": "3",
    "SPACE_WORKER_CONCURRENCY": "2",
    # No fault scenario sends much outbound: two slots of the lane keep its queue's connections few, as five
    # processes share the machine's PostgreSQL with the rest of the suite.
    "SPACE_OUTBOUND_CONCURRENCY": "2",
    # Several workers run on this host at once: none serves metrics unless a test gives it a port of its own.
    "SPACE_WORKER_METRICS_PORT": "0",
}
ROWS = 400
"""Tickets per export: 20 batches of 20 rows, about 40 KB in 8 KB chunks."""
WORKER_APP = "space-worker"
"""application_name of a worker process's database connections (space.worker.build_worker)."""


def process_env(database_url: str, **settings: str) -> dict[str, str]:
    """The environment of a Space process (`space_env`) with the fault settings, then `settings`."""
    return space_env(database_url, **{**FAULT_SETTINGS, **settings})


async def wait_until(check: Callable[[], Awaitable[Any]], what: str, within: float = WAIT) -> Any:
    """Poll `check` until it returns something truthy, with the fault tests' longer default bound."""
    return await wait_for(check, what, within)


@dataclass
class Proc:
    """One `space` subprocess; its stdout and stderr go to a log file."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @classmethod
    async def start(cls, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Proc:
        """Spawn `space <args>`."""
        log_path = log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                str(SPACE), *args, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
            )
        return cls(name, process, log_path)

    @property
    def alive(self) -> bool:
        """Whether the process has not exited yet."""
        return self.process.returncode is None

    def send(self, sig: signal.Signals) -> None:
        """Send a signal."""
        self.process.send_signal(sig)

    async def wait(self, within: float = WAIT) -> int:
        """Wait for the exit; its return code (negative: killed by that signal)."""
        try:
            return await asyncio.wait_for(self.process.wait(), within)
        except TimeoutError:
            raise AssertionError(f"{self.name} did not exit within {within:.0f} s\n{self.log()}") from None

    async def kill(self) -> None:
        """SIGKILL unless it has exited; reap it."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()

    def log(self) -> str:
        """What the process printed so far (the tail)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} (exit {self.process.returncode}) ---\n{text[-6000:]}"


class Procs:
    """The processes a test started; `close()` kills whatever is still running."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.started: list[Proc] = []

    async def worker(self, name: str, **settings: str) -> Proc:
        """Start `space worker` with the fault settings (plus `settings`)."""
        proc = await Proc.start(name, ["worker"], process_env(self.database_url, **settings), self.log_dir)
        self.started.append(proc)
        return proc

    async def api(self, name: str = "api", **settings: str) -> tuple[Proc, str]:
        """Start `space api` on a free port; returns it and its base URL once /health answers."""
        port = free_port()
        env = process_env(self.database_url, SPACE_HOST="127.0.0.1", SPACE_PORT=str(port), **settings)
        proc = await Proc.start(name, ["api"], env, self.log_dir)
        self.started.append(proc)
        base = f"http://127.0.0.1:{port}"

        async def healthy() -> bool:
            if not proc.alive:
                raise AssertionError(f"the API process exited\n{proc.log()}")
            try:
                async with httpx.AsyncClient(base_url=base, timeout=2) as c:
                    return (await c.get("/health")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(healthy, "the API process to answer /health")
        return proc, base

    async def close(self) -> None:
        """Kill every process still running."""
        for proc in self.started:
            await proc.kill()

    def logs(self) -> str:
        """Every process's output, for a failure message."""
        return "\n".join(p.log() for p in self.started)


class Owner:
    """The database as its owner (a superuser: RLS does not apply) sees it: observation and fault injection."""

    def __init__(self, url: str) -> None:
        self.url = url

    @contextlib.asynccontextmanager
    async def conn(self) -> AsyncIterator[psycopg.AsyncConnection[dict[str, Any]]]:
        """An autocommit connection."""
        async with await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, row_factory=dict_row, application_name="space-faults"
        ) as conn:
            yield conn

    async def fetch(self, query: str, *params: Any) -> list[dict[str, Any]]:
        """Rows of a query."""
        async with self.conn() as conn:
            cur = await conn.execute(query, params)  # type: ignore[arg-type]
            return await cur.fetchall() if cur.description else []

    async def export(self, export_id: str | uuid.UUID) -> dict[str, Any]:
        """The export's ledger row."""
        [row] = await self.fetch("SELECT * FROM export_jobs WHERE id = %s", str(export_id))
        return row

    async def chunks(self, export_id: str | uuid.UUID) -> dict[str, int]:
        """Stored chunks of the export, per execution id."""
        rows = await self.fetch(
            "SELECT execution_id::text AS e, count(*) AS n FROM export_chunks WHERE export_id = %s GROUP BY 1",
            str(export_id),
        )
        return {r["e"]: int(r["n"]) for r in rows}

    async def queue_entries(self, export_id: str | uuid.UUID) -> list[dict[str, Any]]:
        """SAQ's rows for the export (key = export id): status and SAQ's own attempt count."""
        return await self.fetch(
            "SELECT status, (convert_from(job, 'UTF8')::jsonb ->> 'attempts')::int AS attempts"
            " FROM saq.saq_jobs WHERE key = %s",
            str(export_id),
        )

    async def wait_export(
        self, export_id: str | uuid.UUID, done: Callable[[dict[str, Any]], bool], what: str, within: float = WAIT
    ) -> dict[str, Any]:
        """Poll the ledger row until `done(row)`."""

        async def check() -> dict[str, Any] | None:
            row = await self.export(export_id)
            return row if done(row) else None

        result: dict[str, Any] = await wait_until(check, f"export {export_id}: {what}", within)
        return result

    async def finished(self, export_id: str | uuid.UUID, within: float = WAIT) -> dict[str, Any]:
        """Wait until the export is completed, failed or cancelled."""
        return await self.wait_export(
            export_id, lambda r: r["state"] in ("completed", "failed", "cancelled"), "finished", within
        )

    async def blocked_by(self, holder_pid: int, app: str = WORKER_APP) -> list[dict[str, Any]]:
        """Backends tagged `app` waiting on a lock that `holder_pid` holds."""
        return await self.fetch(
            "SELECT pid, query FROM pg_stat_activity"
            " WHERE application_name = %s AND %s = ANY (pg_blocking_pids(pid)) AND datname = current_database()",
            app,
            holder_pid,
        )

    async def chunk_writers_blocked_by(self, holder_pid: int, app: str = WORKER_APP) -> list[dict[str, Any]]:
        """Backends tagged `app` that wait on a lock `holder_pid` holds while writing chunks (they hold
        export_chunks' RowExclusiveLock: an INSERT there has begun), so not, say, the reconciler's wake-up
        waiting on the same org lock."""
        return await self.fetch(
            "SELECT a.pid, a.query FROM pg_stat_activity a"
            " WHERE a.application_name = %s AND %s = ANY (pg_blocking_pids(a.pid)) AND a.datname = current_database()"
            " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted"
            " AND l.relation = 'export_chunks'::regclass AND l.mode = 'RowExclusiveLock')",
            app,
            holder_pid,
        )

    async def readers(self, app: str = WORKER_APP) -> list[dict[str, Any]]:
        """A worker's export read: its oldest transaction that holds a snapshot and waits for the client.

        Found by what the read is (a long transaction with a snapshot, idle while the worker is held
        elsewhere), not by its SQL text, which belongs to the writers.
        """
        return await self.fetch(
            "SELECT pid, backend_xmin::text AS xmin, left(query, 200) AS query FROM pg_stat_activity"
            " WHERE application_name = %s AND state = 'idle in transaction' AND backend_xmin IS NOT NULL"
            " AND datname = current_database() ORDER BY xact_start LIMIT 1",
            app,
        )

    async def activity(self, app: str = WORKER_APP) -> list[dict[str, Any]]:
        """What the backends tagged `app` are doing (for failure messages)."""
        return await self.fetch(
            "SELECT pid, state, wait_event_type, backend_xmin::text AS xmin, xact_start, left(query, 120) AS query"
            " FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            app,
        )

    async def backends(self, app: str = WORKER_APP) -> int:
        """How many sessions tagged `app` the server still has (a killed client's can outlive it briefly)."""
        [row] = await self.fetch(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            app,
        )
        return int(row["n"])

    async def terminate(self, pid: int) -> bool:
        """pg_terminate_backend."""
        [row] = await self.fetch("SELECT pg_terminate_backend(%s) AS ok", pid)
        return bool(row["ok"])


@dataclass
class Paused:
    """What a worker held mid-read had done: its execution, progress and chunks, and its read backend."""

    execution_id: str
    attempt: int
    progress: int
    chunks: int
    read_pid: int
    waiting_pid: int


async def _none(count: Awaitable[int]) -> bool:
    return await count == 0


@dataclass
class MidRead:
    """Holds a real worker in the middle of an export's read, with nothing but PostgreSQL's own locks.

    `arm()` (before the worker starts) takes the org row lock FOR UPDATE, as a member change would. The
    worker claims, reads, reports progress, and sends its first chunk (seq 0) to storage; that insert
    needs a KEY SHARE lock on the org row (the chunk's foreign key), so it waits there.
    `engage()` then inserts, uncommitted, a placeholder for the execution's chunk 1 (its key is the
    execution id the claim wrote), and lets the org lock go: chunk 0 is stored, and the worker's insert of
    chunk 1 waits on the placeholder's transaction (the primary key). Chunks are stored in order, so the
    read stops at the next chunk: it is held mid-read, its REPEATABLE READ transaction open, progress and
    chunk 0 committed, nothing published, and its lease still renewed.
    `release()` rolls the placeholder back and the worker goes on. Leaving the context releases everything.

    Nothing here depends on the writers' SQL or on when progress is written, only on the ledger, the chunk
    table's keys and the read's transaction.
    """

    owner: Owner
    org_id: str
    export_id: str
    _org_lock: psycopg.AsyncConnection[Any] | None = None
    _placeholder: psycopg.AsyncConnection[Any] | None = None
    _attempt: int = 0
    seen: Paused | None = None

    async def __aenter__(self) -> MidRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in (self._placeholder, self._org_lock):
            if conn is not None and not conn.closed:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                with contextlib.suppress(Exception):
                    await conn.close()

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        # The pause's own statements never wait long for a lock: a wrong assumption fails, it does not hang.
        return await psycopg.AsyncConnection.connect(
            self.owner.url, application_name="space-faults-lock", options="-c lock_timeout=20s"
        )

    async def arm(self) -> None:
        """Take the org lock; start the worker after this.

        No worker session may be left from an earlier one (a killed worker's session can still be finishing a
        statement, and would be taken for the new worker's).
        """
        await wait_until(lambda: _none(self.owner.backends()), "the sessions of earlier workers to end")
        self._attempt = (await self.owner.export(self.export_id))["attempt"]
        self._org_lock = await self._connect()
        await self._org_lock.execute("SELECT 1 FROM organizations WHERE id = %s FOR UPDATE", (self.org_id,))

    async def engage(self) -> Paused:
        """Wait for the worker's claim and progress, then for it at chunk 0; move the pause to chunk 1; what the
        worker had done by then."""
        assert self._org_lock is not None, "arm() first"
        org_pid = self._org_lock.info.backend_pid
        # The ledger first: other backends wait on the org lock too (the reconciler's wake-up takes it), so "a
        # worker waits on it" says nothing about the claim. Each wait names what it waited for when it fails.
        # The claim's bound is two waits (what the two steps before it had): it spans the worker's start-up and,
        # for a retry, the lost lease, SAQ's sweep and its abort wait, all slower on a loaded machine.
        row = await self.owner.wait_export(
            self.export_id,
            lambda r: r["state"] == "running" and r["attempt"] == self._attempt + 1 and r["progress"] >= 1,
            "the worker's claim and progress",
            within=2 * WAIT,
        )
        try:
            await wait_until(
                lambda: self.owner.chunk_writers_blocked_by(org_pid), "the worker's chunk 0 to wait for the org lock"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {await self.owner.activity()}") from None
        exec_id = str(row["execution_id"])
        self._placeholder = await self._connect()
        # The placeholder skips its own foreign-key check (replica role: the org lock would hold it too).
        await self._placeholder.execute("SET LOCAL session_replication_role = replica")
        await self._placeholder.execute(
            "INSERT INTO export_chunks (export_id, execution_id, seq, org_id, data) VALUES (%s, %s, 1, %s, '')",
            (self.export_id, exec_id, self.org_id),
        )
        await self._org_lock.rollback()
        holder = self._placeholder.info.backend_pid
        waiting = await wait_until(lambda: self.owner.chunk_writers_blocked_by(holder), "the worker's chunk 1 to wait")
        try:
            readers = await wait_until(self.owner.readers, "the worker's open read transaction", within=20)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {await self.owner.activity()}") from None
        row = await self.owner.export(self.export_id)
        chunks = await self.owner.chunks(self.export_id)
        assert row["state"] == "running" and str(row["execution_id"]) == exec_id, row
        assert chunks.get(exec_id) == 1, chunks
        self.seen = Paused(
            execution_id=exec_id,
            attempt=row["attempt"],
            progress=row["progress"],
            chunks=chunks[exec_id],
            read_pid=readers[0]["pid"],
            waiting_pid=waiting[0]["pid"],
        )
        return self.seen

    async def release(self) -> None:
        """Roll the placeholder back: the worker stores chunk 1 and goes on."""
        if self._placeholder is not None:
            await self._placeholder.rollback()


# -- scenario helpers -------------------------------------------------------------------------------------


def observed(scenario: str, **facts: Any) -> None:
    """One line per scenario with what it saw."""
    print(f"OBSERVED {scenario}: {json.dumps(facts, default=str, sort_keys=True)}")


async def seeded(fapi: Api, db: Database, name: str, rows: int = ROWS) -> tuple[Org, list[str]]:
    """An org whose member created `rows` tickets with unique markers."""
    org = await fapi.org(name)
    markers = [f"{name}-{i:05d}" for i in range(rows)]
    await add_tickets(db, org.id, org.member, markers)
    return org, markers


async def published_csv(fapi: Api, org: Org, export_id: str, row: dict[str, Any], markers: list[str]) -> bytes:
    """Download the result; it matches the ledger's sha256 and size and holds every marker exactly once."""
    r = await download(fapi, org, org.member, export_id)
    assert r.status_code == 200, r.text
    assert hashlib.sha256(r.content).hexdigest() == row["sha256"] and len(r.content) == row["byte_size"]
    records = parse_csv(r.content)
    assert Counter(rec[1] for rec in records[1:]) == Counter(markers)
    return r.content


async def run_cleanup(db: Database) -> dict[str, int]:
    """The cleanup job, as the cron runs it."""
    return await cleanup(db, PgResultStore(db))
