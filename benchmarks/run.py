"""`make bench`: a tickets CSV export and a JSON snapshot through the real API and a real worker process,
each beside PostgreSQL's own COPY of the same rows (CSV; JSON built by PostgreSQL), in the same run.

Uses DATABASE_URL when set (a superuser/owner URL), else an embedded server in a temporary folder. Each run
makes a fresh database, seeds it set-based, starts `space api` and `space worker` as child processes, and
drops the database at the end. Prints one line per case and writes benchmarks/results/latest.json.

    python -m benchmarks.run [--rows 100000] [--tasks 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psycopg
from psycopg import sql
from sqlalchemy import make_url

from space.config import load_settings
from space.db import Database, app_url
from space.db.migrate import upgrade
from space.demo import seed_org

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT = 900.0


@dataclass
class Case:
    """One measured case. export_seconds = completedAt - createdAt as the database recorded them;
    queue_seconds = startedAt - createdAt (the part spent before a worker claimed it)."""

    case: str
    rows: int
    export_seconds: float
    queue_seconds: float
    download_seconds: float
    copy_seconds: float
    export_ratio: float
    download_ratio: float
    export_rows_per_second: float
    copy_rows_per_second: float
    bytes: int
    copy_bytes: int
    worker_peak_rss_mib: float
    api_peak_rss_mib: float

    def line(self) -> str:
        """The one-line summary."""
        return " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in asdict(self).items())


@contextlib.contextmanager
def server() -> Iterator[str]:
    """A superuser URL: DATABASE_URL, or an embedded server for the run."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from space.embedded import embedded_server

    with tempfile.TemporaryDirectory(prefix="space-bench-") as tmp, embedded_server(Path(tmp), "postgres") as u:
        yield u


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """CREATE a database for this run, migrate it, DROP it afterwards."""
    name = f"space_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def free_port() -> int:
    """An unused local TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spawn(command: str, url: str, port: int) -> subprocess.Popen[bytes]:
    """`space <command>` as a child process on the given database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_")}
    env.update({"DATABASE_URL": url, "SPACE_PORT": str(port), "SPACE_HOST": "127.0.0.1"})
    return subprocess.Popen(
        [sys.executable, "-c", "from space.cli import main; main()", command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def peak_rss_mib(proc: subprocess.Popen[bytes]) -> float:
    """VmHWM (peak resident set) of a live child, from /proc."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then wait (kill after a while)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def seed(url: str, rows: int, tasks: int) -> tuple[str, str]:
    """An org with `rows` tickets and `tasks` tasks (tricky titles); returns (org id, the owner's token)."""
    settings = load_settings({}, database_url=url)
    assert settings.database_url
    db = Database(app_url(settings.database_url), application_name="space-bench-seed")
    try:
        people = await seed_org(db, "Bench", tickets=rows, tasks=tasks)
    finally:
        await db.dispose()
    owner = next(p for p in people if p.role == "owner")
    with psycopg.connect(url) as conn:
        org = conn.execute("SELECT id FROM organizations WHERE name = 'Bench'").fetchone()
    assert org is not None
    return str(org[0]), owner.token


async def wait_healthy(client: httpx.AsyncClient) -> None:
    """Until GET /health answers."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.TransportError):
            if (await client.get("/health")).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        await asyncio.sleep(0.1)


async def export_through_api(
    client: httpx.AsyncClient, org_id: str, kind: str, out: Path
) -> tuple[float, float, float, int, int]:
    """Create, wait for completed, download. Returns (export s, queue s, download s, rows, bytes)."""
    r = await client.post(f"/orgs/{org_id}/exports", json={"kind": kind})
    r.raise_for_status()
    export_id = r.json()["id"]
    deadline = time.monotonic() + TIMEOUT
    while True:
        status = (await client.get(f"/orgs/{org_id}/exports/{export_id}")).json()
        if status["state"] in ("completed", "failed", "cancelled"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"export not finished: {status}")
        await asyncio.sleep(0.05)
    if status["state"] != "completed":
        raise RuntimeError(f"export {status['state']}: {status['errorCode']}")
    created = _ts(status["createdAt"])
    completed = _ts(status["completedAt"])
    started = time.perf_counter()
    size = 0
    with out.open("wb") as f:
        async with client.stream("GET", f"/orgs/{org_id}/exports/{export_id}/result") as resp:
            resp.raise_for_status()
            async for chunk in resp.aiter_raw():
                size += len(chunk)
                f.write(chunk)
    download = time.perf_counter() - started
    queued = _ts(status["startedAt"]) - created
    return completed - created, queued, download, int(status["rowCount"]), size


def _ts(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


COPY_QUERIES = {
    # The same rows and columns as the export, as PostgreSQL's own CSV.
    "tickets_csv": "COPY (SELECT t.number, t.title, t.status, t.priority, u.name, t.created_at, t.updated_at"
    " FROM tickets t LEFT JOIN memberships m ON m.id = t.assignee_id LEFT JOIN users u ON u.id = m.user_id"
    " WHERE t.org_id = {org} ORDER BY t.number) TO STDOUT (FORMAT csv, HEADER)",
    # The same rows as JSON built by PostgreSQL: live projects, then their tasks, by id.
    "snapshot": "COPY (SELECT row_to_json(x) FROM ("
    " SELECT p.id, p.name, p.version, p.created_at, p.updated_at, NULL::uuid AS project_id, NULL AS status,"
    " NULL::date AS due_date, 0 AS part FROM projects p WHERE p.org_id = {org} AND p.deleted_at IS NULL"
    " UNION ALL SELECT t.id, t.title, NULL, t.created_at, t.updated_at, t.project_id, t.status, t.due_date, 1"
    " FROM tasks t JOIN projects p ON p.id = t.project_id AND p.deleted_at IS NULL WHERE t.org_id = {org}"
    " ORDER BY part, id) x) TO STDOUT",
}


def copy_rows(url: str, kind: str, org_id: str, out: Path) -> tuple[float, int]:
    """PostgreSQL's own COPY of the same rows to a file (as the owner). Returns (seconds, bytes)."""
    query = sql.SQL(COPY_QUERIES[kind]).format(org=sql.Literal(org_id))
    size = 0
    started = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur, out.open("wb") as f, cur.copy(query) as copy:
        for data in copy:
            size += len(data)
            f.write(data)
    return time.perf_counter() - started, size


async def run(rows: int, tasks: int) -> list[Case]:
    """Every case, in one run against a fresh database."""
    cases: list[Case] = []
    with server() as admin, fresh_database(admin) as url, tempfile.TemporaryDirectory() as tmp:
        print(f"seeding {rows} tickets and {tasks} tasks ...", file=sys.stderr)
        org_id, token = await seed(url, rows, tasks)
        port = free_port()
        api = spawn("api", url, port)
        worker = spawn("worker", url, port)
        measured = []
        try:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=TIMEOUT) as c:
                await wait_healthy(c)
                for kind in ("tickets_csv", "snapshot"):
                    print(f"{kind}: exporting through the API and the worker ...", file=sys.stderr)
                    result = await export_through_api(c, org_id, kind, Path(tmp) / f"export-{kind}")
                    # Peak RSS so far (VmHWM never decreases): it includes every earlier case.
                    measured.append((kind, result, peak_rss_mib(worker), peak_rss_mib(api)))
        finally:
            stop(worker)
            stop(api)
        for kind, (export_s, queue_s, download_s, n, size), worker_rss, api_rss in measured:
            print(f"{kind}: COPY ...", file=sys.stderr)
            copy_s, copy_size = copy_rows(url, kind, org_id, Path(tmp) / f"copy-{kind}")
            cases.append(
                Case(
                    case=kind,
                    rows=n,
                    export_seconds=export_s,
                    queue_seconds=queue_s,
                    download_seconds=download_s,
                    copy_seconds=copy_s,
                    export_ratio=export_s / copy_s,
                    download_ratio=download_s / copy_s,
                    export_rows_per_second=n / export_s,
                    copy_rows_per_second=n / copy_s,
                    bytes=size,
                    copy_bytes=copy_size,
                    worker_peak_rss_mib=worker_rss,
                    api_peak_rss_mib=api_rss,
                )
            )
    return cases


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=100_000, help="tickets to export (default 100000)")
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks in the snapshot (default 100000)")
    args = parser.parse_args(argv)
    cases = asyncio.run(run(args.rows, args.tasks))
    for case in cases:
        print(case.line())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps([asdict(c) for c in cases], indent=2) + "\n")


if __name__ == "__main__":
    main()
