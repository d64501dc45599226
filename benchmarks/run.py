"""`make bench`: exports through the real API and a real worker process, each beside PostgreSQL's own COPY.

Uses DATABASE_URL when set (a superuser/owner URL), else an embedded server in a temporary folder. One run:

1. a fresh database, migrated; two orgs seeded set-based (`space.demo`): 100,000 tickets, and 1,000,000
   tickets plus 1,000,000 tasks; then VACUUM ANALYZE, as autovacuum would have done to any table that size, and a
   CHECKPOINT, so the seeding's own writes are on disk before any case runs, not written back during one;
2. `space api` and `space worker` as two child processes, warmed up by one small unmeasured export of each
   kind; per case: PostgreSQL's COPY of the same rows to a file (psycopg), then create the export through
   the API, poll until completed, download it to a file.
   export_seconds = completedAt - createdAt as the database recorded them; download_seconds = wall time of
   the GET; peak RSS = VmHWM of each process, reset (/proc/<pid>/clear_refs) before each case. The
   `archive_1m` case (the 1M org's tickets and snapshot in one ZIP, 2,000,000 rows) is measured against the
   sum of the two COPYs;
3. fairness: another `space api` + `space worker` pair; the 100k org gets 20 queued CSV exports (its
   owner's rate limits raised for this phase only), then a small org (1,000 tickets) asks for one; its
   waiting time is startedAt - createdAt from the ledger, beside how many backlog exports were still queued
   when it asked and how many started while it waited;
4. many downloads at once through one `space api` (SPACE_DOWNLOAD_CONCURRENCY raised to 100 so that none is
   refused: the cases measure what a download costs, not the cap) of a ~40 MB CSV (the 1M org's unassigned
   tickets), over plain sockets: 100 that stop reading after their first part (the API's resident set with
   all of them stalled, minus before), then 20 read in full at once (aggregate throughput, peak RSS);
5. link downloads: the 1M CSV whole with the bearer token, whole through a download link, and as 64 equal
   ranges through that link (one after another, and 8 at a time), in a fresh `space api` (median of 7 rounds; `--links-only`
   runs just this case, on a database of its own); then the same file the same ways from `benchmarks.floor`, a bare
   Litestar app serving it from memory (`floor_*`: what the stack and the client cost per range before Space does
   anything); and where the CPU went meanwhile (`bearer_*_s`, `segments_*_s`: seconds of the API, of every
   PostgreSQL process and of the bench's own client during the whole download and the 8 segments; on 2 cores their
   sum against the wall time says how busy the machine was);
6. `space up` (API and worker in one process, one event loop): the 1M tickets export again while the
   status route is polled back to back; its latencies show whether the export blocks the event loop;
7. workers_scaling (`benchmarks.scaling`): 8 orgs of 500,000 tickets, one CSV export each asked at once, with
   one `space worker` process and then two (concurrency 1 each): total time, its ratio, and the database's
   share of the CPU;
8. the S3 result store (SPEC §15): moto's standalone server on a free port, then the 1M CSV and snapshot cases
   again with SPACE_RESULT_STORE=s3://..., each beside its COPY in the same run, the median of three rounds
   (each result deleted once measured: moto keeps objects in its memory); the download follows the 303 to the
   presigned GET (download_seconds covers both requests). Lines `case=s3_...`, also in results/s3.json.

9. wide rows (issue 17): 200,000 tickets and, in another org, 200,000 tasks whose titles are 500 four-byte
   characters (2,000 bytes; `WIDE_TITLES`), seeded set-based like the others; `tickets_csv_wide` and
   `snapshot_wide` each beside their COPY, in an API and worker pair of their own (warmed up on the small
   org), so their memory is not another case's high-water mark. Lines `case=..._wide`, also in
   results/wide.json.

10. workbooks (SPEC §20, §24): `tickets_xlsx_100k` and `tickets_xlsx_1m` run with the cases of step 2, each beside
   the tickets CSV's COPY of the same rows. `--phases xlsx` runs only these two (orgs of tickets only, no tasks;
   with `--tickets` equal to `--small-tickets`, the one case), lines also in results/xlsx.json.
11. incremental runs (SPEC §21, §24): `make bench` then runs `benchmarks.incremental` (also `--only incremental`)
   on a database of its own: a schedule's complete first run over `--tickets` tickets (the full export), then
   1,000 of them changed and its incremental run, both through the real pipeline in one process. Line
   `case=incremental_1m ... ratio=...` (target under 0.05), also in results/incremental.json.

11. restore (SPEC §23, §24; `benchmarks.restore`): the archive of an org of `--small-tickets` and of `--tickets`
   tickets restored through `POST /imports` by a real worker, each beside PostgreSQL's COPY FROM of the same
   tickets, with the worker's peak RSS; on a database of its own (`--restore-only` runs just this), lines
   `case=restore_...`, also in results/restore.json.

`--phases` picks some of them (`cases,links,fairness,downloads,up,scaling,s3,wide,xlsx,restore`; default: all).

Prints one line per case (and the fairness line) on stdout and writes them to benchmarks/results/latest.json
(fairness: results/fairness.json; the download cases: results/downloads.json); progress and the status-route latencies go to stderr (and
results/status_latency.json; workers_scaling: results/workers_scaling.json).

    python -m benchmarks.run [--tickets 1000000] [--small-tickets 100000] [--tasks 1000000]
                             [--scaling-orgs 8] [--scaling-tickets 500000] [--only workers_scaling|incremental]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql
from sqlalchemy import make_url
from tests.helpers import free_port, space_env

from space.config import load_settings
from space.db import Database, app_url
from space.db.migrate import upgrade
from space.demo import seed_org
from space.exports.storage.postgres import READ_PART_BYTES

RESULTS = Path(__file__).resolve().parent / "results"
TIMEOUT = 600.0
PROJECTS = 20
"""Projects of the large org (space.demo makes min(20, tasks / 10))."""
BACKLOG = 20
"""Queued exports of one org in the fairness phase."""
SMALL_TICKETS = 1_000
"""Tickets of the small org whose export the fairness phase times."""
PHASES = ("cases", "links", "fairness", "downloads", "up", "scaling", "s3", "wide", "xlsx", "restore")
WIDE_ROWS = 200_000
"""Tickets, and tasks, of the wide-row cases."""
WIDE_CHARS = 500
"""Characters of a wide title (the API's limit), each of four bytes in UTF-8."""
MEDIAN_ROUNDS = 3
"""Each wide and S3 case runs its COPY and its export this many times in the run; the median ratio is the case."""


def wide_titles(n: int = 8) -> list[str]:
    """`n` titles of WIDE_CHARS four-byte characters (emoji, in a fixed pseudo-random order)."""
    pick = random.Random(17)
    return ["".join(chr(pick.randrange(0x1F300, 0x1F650)) for _ in range(WIDE_CHARS)) for _ in range(n)]


@dataclass
class Case:
    """One measured case, exactly the fields of its printed line."""

    case: str
    rows: int
    export_seconds: float
    download_seconds: float
    copy_seconds: float
    export_ratio: float
    download_ratio: float
    worker_peak_rss_mib: float
    api_peak_rss_mib: float

    def line(self) -> str:
        """`case=<name> rows=<n> export_seconds=<s> ...`."""
        return " ".join(f"{k}={_fmt(v)}" for k, v in asdict(self).items())


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


@dataclass
class Org:
    """A seeded org and the tokens of its people."""

    id: str
    people: dict[str, str]


def log(message: str) -> None:
    """Progress on stderr (stdout carries only the result lines)."""
    print(message, file=sys.stderr, flush=True)


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


def spawn(command: str, url: str, port: int, **settings: str) -> subprocess.Popen[bytes]:
    """`space <command>` as a child process on the given database, with default settings unless given."""
    return subprocess.Popen(
        [sys.executable, "-c", "from space.cli import main; main()", command],
        env=space_env(url, SPACE_PORT=str(port), SPACE_HOST="127.0.0.1", **settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


_FLOOR_UVICORN = ("--http", "httptools", "--no-access-log", "--log-level", "warning")


def spawn_floor(served: Path, port: int) -> subprocess.Popen[bytes]:
    """`benchmarks.floor` serving the file `served` from memory, by uvicorn with httptools as `space api` is."""
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "benchmarks.floor:app", "--port", str(port), *_FLOOR_UVICORN],
        env={**os.environ, "SPACE_BENCH_FLOOR_FILE": str(served)},
    )


def _status(proc: subprocess.Popen[bytes], field: str) -> float:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(proc: subprocess.Popen[bytes]) -> float:
    """VmHWM (peak resident set since the last reset) of a live child, from /proc."""
    return _status(proc, "VmHWM")


def rss_mib(proc: subprocess.Popen[bytes]) -> float:
    """VmRSS (resident set now) of a live child, from /proc."""
    return _status(proc, "VmRSS")


def reset_peak_rss(proc: subprocess.Popen[bytes]) -> None:
    """Start a new peak: VmHWM := current RSS (Linux: `5` into clear_refs)."""
    Path(f"/proc/{proc.pid}/clear_refs").write_text("5")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then wait (kill after a while)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def seed(url: str, orgs: dict[str, tuple[int, int]]) -> dict[str, Org]:
    """Orgs named as given with (tickets, tasks) each, seeded side by side; then VACUUM ANALYZE and CHECKPOINT."""
    settings = load_settings({}, database_url=url)
    assert settings.database_url
    db = Database(app_url(settings.database_url), application_name="space-bench-seed")
    try:
        seeded = await asyncio.gather(*(seed_org(db, name, tickets=n, tasks=m) for name, (n, m) in orgs.items()))
    finally:
        await db.dispose()
    out: dict[str, Org] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, people in zip(orgs, seeded, strict=True):
            row = conn.execute("SELECT id FROM organizations WHERE name = %s", (name,)).fetchone()
            assert row is not None
            out[name] = Org(str(row[0]), {p.role: p.token for p in people})
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return out


async def wait_healthy(client: httpx.AsyncClient, proc: subprocess.Popen[bytes], path: str = "/health") -> None:
    """Until GET `path` answers 200."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(path)).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the API did not start")
        await asyncio.sleep(0.1)


def _empty(folder: Path) -> None:
    for f in folder.iterdir():
        f.unlink()


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


async def create_and_wait(
    client: httpx.AsyncClient,
    org: Org,
    role: str,
    kind: str,
    *,
    poll: float = 0.25,
    filters: dict[str, str] | None = None,
) -> tuple[dict[str, Any], list[float]]:
    """Create an export as `role`, poll its status until it finishes. Returns it and each poll's latency.

    The export's time is what the database recorded, not when a poll saw it finish: polling slowly only
    keeps the API from taking CPU from the export.
    """
    auth = {"Authorization": f"Bearer {org.people[role]}"}
    body: dict[str, Any] = {"kind": kind, **({"filters": filters} if filters else {})}
    r = await client.post(f"/orgs/{org.id}/exports", json=body, headers=auth)
    r.raise_for_status()
    export_id = r.json()["id"]
    latencies: list[float] = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        started = time.perf_counter()
        status = (await client.get(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).json()
        latencies.append(time.perf_counter() - started)
        if status["state"] in ("completed", "failed", "cancelled"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"export not finished: {status}")
        if poll:
            await asyncio.sleep(poll)
    if status["state"] != "completed":
        raise RuntimeError(f"export {status['state']}: {status['errorCode']}")
    return status, latencies


async def delete_export(client: httpx.AsyncClient, org: Org, role: str, export_id: str) -> None:
    """DELETE the export as `role` (its creator): its result goes with it."""
    auth = {"Authorization": f"Bearer {org.people[role]}"}
    (await client.delete(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).raise_for_status()


async def download(client: httpx.AsyncClient, org: Org, role: str, export_id: str, out: Path) -> tuple[float, int]:
    """GET the result into a file. Returns (seconds, bytes)."""
    auth = {"Authorization": f"Bearer {org.people[role]}"}
    size = 0
    started = time.perf_counter()
    with out.open("wb") as f:
        async with client.stream("GET", f"/orgs/{org.id}/exports/{export_id}/result", headers=auth) as resp:
            if resp.status_code == 303:
                # The S3 store: the bytes come from the presigned URL, fetched as a browser would (no token).
                async with (
                    httpx.AsyncClient(timeout=TIMEOUT) as store,
                    store.stream("GET", resp.headers["location"]) as got,
                ):
                    got.raise_for_status()
                    async for chunk in got.aiter_raw():
                        size += len(chunk)
                        f.write(chunk)
                return time.perf_counter() - started, size
            resp.raise_for_status()
            async for chunk in resp.aiter_raw():
                size += len(chunk)
                f.write(chunk)
    return time.perf_counter() - started, size


S3_BUCKET = "space-bench"


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's standalone S3 server on a free port (the tests' launcher), with the AWS variables pointing at it and
    the bench's bucket made; yields the endpoint."""
    from tests.exports.s3_fixtures import aws_environment
    from tests.exports.s3_fixtures import moto_server as launched

    credentials = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
    with launched() as endpoint, aws_environment(**credentials, AWS_ENDPOINT_URL=endpoint):
        import boto3

        boto3.client("s3").create_bucket(Bucket=S3_BUCKET)
        yield endpoint


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


COPY_PARTS = {"archive": ["tickets_csv", "snapshot"], "tickets_xlsx": ["tickets_csv"]}
"""Kinds whose baseline is another kind's COPY, or several: the archive holds every ticket and the snapshot; a
workbook holds the tickets CSV's rows (SPEC §24: within 3x of the CSV's COPY)."""
ARCHIVE_ROW_LIMIT = 2_000_000
"""The archive case's rows (1M tickets, 1M projects and tasks) pass the default row limit, which counts the
archive as a whole: the cases' worker runs with this one (no other case comes near either)."""


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


async def separate_processes(
    url: str,
    orgs: dict[str, Org],
    plan: list[tuple[str, str, str]],
    tmp: Path,
    warm_org: str | None = None,
    rounds: int = 1,
    delete_measured: bool = False,
    **settings: str,
) -> tuple[list[Case], list[str]]:
    """Each case through `space api` + `space worker` (with these extra settings), beside its COPY; warmed up on
    `warm_org` (default: the first case's org). With several `rounds`, each round runs the COPY and the export
    again, one after the other, and the case is the round of the median export ratio, with the highest peaks of
    all rounds (every round is logged). `delete_measured` deletes each export once downloaded (its result too)."""
    port = free_port()
    api = spawn("api", url, port, **settings)
    worker = spawn("worker", url, port, **{"SPACE_EXPORT_ROW_LIMIT": str(ARCHIVE_ROW_LIMIT), **settings})
    cases: list[Case] = []
    export_ids: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
            # One small unmeasured export of each kind first: pools, lazily imported code and the allocator's
            # arenas are then in place, so the first case's memory is not a fresh process's.
            for role, kind in (("member", "tickets_csv"), ("admin", "snapshot"), ("member", "tickets_xlsx")):
                warm_up = orgs[warm_org or plan[0][1]]
                warm, _ = await create_and_wait(client, warm_up, role, kind)
                await download(client, warm_up, role, warm["id"], tmp / "warm-up")
                if delete_measured:
                    await delete_export(client, warm_up, role, warm["id"])
            for name, org_name, kind in plan:
                org = orgs[org_name]
                measured: list[Case] = []
                for _ in range(rounds):
                    export_id, case = await _measure(client, url, (api, worker), org, name, kind, tmp)
                    if delete_measured:
                        await delete_export(client, org, "owner", export_id)
                    export_ids.append(export_id)
                    measured.append(case)
                    if rounds > 1:
                        log(f"{name}: round {len(measured)}: {case.line()}")
                median = sorted(measured, key=lambda c: c.export_ratio)[len(measured) // 2]
                median.worker_peak_rss_mib = max(c.worker_peak_rss_mib for c in measured)
                median.api_peak_rss_mib = max(c.api_peak_rss_mib for c in measured)
                cases.append(median)
    finally:
        stop(worker)
        stop(api)
    return cases, export_ids


async def _measure(
    client: httpx.AsyncClient,
    url: str,
    procs: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]],
    org: Org,
    name: str,
    kind: str,
    tmp: Path,
) -> tuple[str, Case]:
    """One round of a case: its COPY, then the export through `procs` (API, worker) and its download. Returns
    the export's id and the case's line."""
    api, worker = procs
    log(f"{name}: COPY ...")
    # The archive's baseline is the sum of its two parts' COPYs, run one after the other here.
    copy_s = sum(copy_rows(url, part, org.id, tmp / f"copy-{name}-{part}")[0] for part in COPY_PARTS.get(kind, [kind]))
    for proc in procs:
        reset_peak_rss(proc)
    log(f"{name}: export through the API and the worker ...")
    status, _ = await create_and_wait(client, org, "owner", kind)
    download_s, size = await download(client, org, "owner", status["id"], tmp / f"export-{name}")
    assert size == status["byteSize"], (size, status["byteSize"])
    export_s = _ts(status["completedAt"]) - _ts(status["createdAt"])
    queued = _ts(status["startedAt"]) - _ts(status["createdAt"])
    log(f"{name}: waited {queued:.3f} s for a worker, ran {export_s - queued:.3f} s, {size} bytes")
    case = Case(
        case=name,
        rows=int(status["rowCount"]),
        export_seconds=export_s,
        download_seconds=download_s,
        copy_seconds=copy_s,
        export_ratio=export_s / copy_s,
        download_ratio=download_s / copy_s,
        worker_peak_rss_mib=peak_rss_mib(worker),
        api_peak_rss_mib=peak_rss_mib(api),
    )
    _empty(tmp)
    return str(status["id"]), case


RANGES = 64
"""The link-download case fetches the result as this many ranges of equal size (the last takes the rest)."""
SEGMENTS = 8
"""The ranges are also fetched SEGMENTS at a time, as download managers fetch segments (SPEC §24: 8)."""
CPU_REQUESTS = 200
"""Requests of one round of a per-request CPU measure (status GET, 1-byte ranged GET, the floor's request)."""
LINK_ROUNDS = 7
"""Rounds of the link-download case; each measures bearer, link and ranges back to back; medians are kept. Seven,
not three: on this shared 2-core machine one round of the whole download varied by a third between runs of the
same code, and a ratio divides by it (a round of all four takes about a second)."""


async def _get_into(client: httpx.AsyncClient, url: str, fd: int, at: int, headers: dict[str, str]) -> int:
    """Stream one GET into the file `fd` from offset `at`; the bytes received."""
    size = 0
    async with client.stream("GET", url, headers=headers) as resp:
        resp.raise_for_status()
        async for chunk in resp.aiter_raw():
            os.pwrite(fd, chunk, at + size)
            size += len(chunk)
    return size


async def _ranges(client: httpx.AsyncClient, url: str, fd: int, bounds: list[tuple[int, int]], at_once: int) -> int:
    """Fetch every range of `bounds` into its place in `fd`, `at_once` of them in flight (a download manager's
    segments); the bytes received."""
    todo = list(bounds)

    async def segment() -> int:
        got = 0
        while todo:
            a, b = todo.pop(0)
            got += await _get_into(client, url, fd, a, {"Range": f"bytes={a}-{b}"})
        return got

    return sum(await asyncio.gather(*(segment() for _ in range(at_once))))


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command's name (the 3rd field, `state`, is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _pid_cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime: its children that ended, once waited for
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """The CPU a live child has used so far (user + system), from its own counters in /proc/<pid>/stat."""
    return _pid_cpu_seconds(proc.pid)


def database_cpu_seconds() -> float:
    """The CPU PostgreSQL has used so far on this machine: every live postgres process, and for the postmaster
    also its backends that ended (their CPU is added to its children's counters when it reaps them). The bench's
    machine runs nothing else on the server meanwhile."""
    postgres: dict[int, int] = {}  # pid: parent pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):  # a backend that ended meanwhile
                if (entry / "comm").read_text().strip() == "postgres":
                    postgres[int(entry.name)] = int(_stat(int(entry.name))[1])
    total = 0.0
    for pid, parent in postgres.items():
        with contextlib.suppress(OSError, IndexError):
            total += _pid_cpu_seconds(pid, reaped=parent not in postgres)
    return total


def own_cpu_seconds() -> float:
    """The CPU this process (the bench's client) has used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def request_cpu_ms(
    client: httpx.AsyncClient, proc: subprocess.Popen[bytes], url: str, headers: dict[str, str], status: int
) -> float:
    """Milliseconds of `proc`'s CPU per GET of `url` (answered `status`): the median of LINK_ROUNDS rounds of
    CPU_REQUESTS sequential requests each, measured by the server process's own counters."""
    per_request = []
    for _ in range(LINK_ROUNDS):
        before = cpu_seconds(proc)
        for _ in range(CPU_REQUESTS):
            r = await client.get(url, headers=headers)
            assert r.status_code == status, (url, r.status_code)
        per_request.append((cpu_seconds(proc) - before) * 1000 / CPU_REQUESTS)
    return statistics.median(per_request)


_CLOCKS = ("seconds", "server_cpu", "database_cpu", "client_cpu")
"""What a download round measures: its wall time, then the CPU seconds the server process, every PostgreSQL
process and the bench's own client used meanwhile (on 2 cores, their sum over the wall time says how busy the
machine was)."""


async def _download_rounds(
    client: httpx.AsyncClient,
    server: subprocess.Popen[bytes],
    out: Path,
    size: int,
    whole: dict[str, tuple[str, dict[str, str]]],
    ranged: str,
) -> dict[str, dict[str, float]]:
    """Medians of LINK_ROUNDS rounds (each of _CLOCKS), each downloading `size` bytes from `server` into `out`
    once per `whole` entry (name: url and headers), then as RANGES ranges of `ranged`, one after another and
    SEGMENTS at a time."""
    step = size // RANGES
    bounds = [(i * step, size - 1 if i == RANGES - 1 else (i + 1) * step - 1) for i in range(RANGES)]
    rounds: dict[str, list[tuple[float, float, float, float]]] = {
        name: [] for name in [*whole, "ranges", "ranges_parallel"]
    }
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)

    def others() -> tuple[float, float]:
        # Reading PostgreSQL's counters scans /proc (about a millisecond): done outside the wall time and the
        # client's own CPU, before they start and after they stop.
        return cpu_seconds(server), database_cpu_seconds()

    try:
        await _get_into(client, ranged, fd, 0, {})  # warm-up
        for _ in range(LINK_ROUNDS):
            for name, measured in rounds.items():
                server_before, database_before = others()
                client_before, started = own_cpu_seconds(), time.perf_counter()
                if name in whole:
                    got = await _get_into(client, whole[name][0], fd, 0, whole[name][1])
                else:
                    got = await _ranges(client, ranged, fd, bounds, 1 if name == "ranges" else SEGMENTS)
                seconds, client_cpu = time.perf_counter() - started, own_cpu_seconds() - client_before
                server_after, database_after = others()
                measured.append((seconds, server_after - server_before, database_after - database_before, client_cpu))
                assert got == size, (name, got, size)
    finally:
        os.close(fd)
    return {
        name: {clock: statistics.median(r[i] for r in measured) for i, clock in enumerate(_CLOCKS)}
        for name, measured in rounds.items()
    }


async def link_downloads(url: str, org: Org, export_id: str, tmp: Path) -> dict[str, Any]:
    """The 1M CSV downloaded whole with the bearer token, whole through a link, and as RANGES ranges through
    that link (one after another, and SEGMENTS at a time), in a fresh `space api` warmed up by one download;
    median seconds of LINK_ROUNDS rounds. Then the same file the same ways from `benchmarks.floor` (a bare
    Litestar app serving it from memory): what the stack and the client cost before Space does anything."""
    port = free_port()
    api = spawn("api", url, port)
    auth = {"Authorization": f"Bearer {org.people['owner']}"}
    result = f"/orgs/{org.id}/exports/{export_id}/result"
    out = tmp / "link-download"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
            size = int((await client.get(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).json()["byteSize"])
            r = await client.post(f"/orgs/{org.id}/exports/{export_id}/links", headers=auth)
            r.raise_for_status()
            link = r.json()["url"]
            space = await _download_rounds(client, api, out, size, {"bearer": (result, auth), "link": (link, {})}, link)
            status_path = f"/orgs/{org.id}/exports/{export_id}"
            status_cpu = await request_cpu_ms(client, api, status_path, auth, 200)
            range_cpu = await request_cpu_ms(client, api, link, {"Range": "bytes=0-0"}, 206)
    finally:
        stop(api)
    # The floor serves the file the API just sent (`out`), alone on the machine as the API was.
    port = free_port()
    floor = spawn_floor(out, port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, floor, "/file")
            bare = await _download_rounds(
                client, floor, tmp / "floor-download", size, {"whole": ("/file", {})}, "/file"
            )
            floor_cpu = await request_cpu_ms(client, floor, "/file", {"Range": "bytes=0-0"}, 206)
    finally:
        stop(floor)
        _empty(tmp)
    return {
        "case": "link_downloads_1m",
        "bytes": size,
        "ranges": RANGES,
        "bearer_seconds": space["bearer"]["seconds"],
        "link_seconds": space["link"]["seconds"],
        "ranges_seconds": space["ranges"]["seconds"],
        "segments": SEGMENTS,
        "ranges_parallel_seconds": space["ranges_parallel"]["seconds"],
        "link_ratio": space["link"]["seconds"] / space["bearer"]["seconds"],
        "ranges_ratio": space["ranges"]["seconds"] / space["bearer"]["seconds"],
        "ranges_parallel_ratio": space["ranges_parallel"]["seconds"] / space["bearer"]["seconds"],
        "floor_seconds": bare["whole"]["seconds"],
        "floor_ranges_ratio": bare["ranges"]["seconds"] / bare["whole"]["seconds"],
        "floor_ranges_parallel_ratio": bare["ranges_parallel"]["seconds"] / bare["whole"]["seconds"],
        "status_cpu_ms": status_cpu,
        "range_cpu_ms": range_cpu,
        "floor_cpu_ms": floor_cpu,
        "status_above_floor_ms": status_cpu - floor_cpu,
        "range_above_floor_ms": range_cpu - floor_cpu,
        # Where the CPU went (seconds, medians of the rounds): the API, PostgreSQL and the bench's client during
        # the whole download and the 8 segments, and the floor's server and client during its segments.
        **{
            f"{phase}_{who}_s": space[name][f"{who}_cpu"]
            for phase, name in (("bearer", "bearer"), ("segments", "ranges_parallel"))
            for who in ("server", "database", "client")
        },
        **{f"floor_segments_{who}_s": bare["ranges_parallel"][f"{who}_cpu"] for who in ("server", "client")},
    }


async def fairness(url: str, busy: Org, small: Org) -> dict[str, Any]:
    """How long a small org's export waits while another org has BACKLOG exports queued (default settings:
    2 worker slots, 1 export per org at a time), from the ledger's createdAt -> startedAt."""
    port = free_port()
    # One user (who ran a case a moment ago) queues the whole backlog: the rate limits are raised for this API
    # process only.
    limits = {"SPACE_EXPORT_RATE_LIMIT": str(2 * BACKLOG), "SPACE_EXPORT_USER_RATE_LIMIT": str(2 * BACKLOG)}
    api = spawn("api", url, port, **limits)
    worker = spawn("worker", url, port)
    auth = {"Authorization": f"Bearer {busy.people['owner']}"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
            # All at once, so that few of them have started by the time the small org asks.
            posts = [
                client.post(f"/orgs/{busy.id}/exports", json={"kind": "tickets_csv"}, headers=auth)
                for _ in range(BACKLOG)
            ]
            backlog = []
            for r in await asyncio.gather(*posts):
                r.raise_for_status()
                backlog.append(r.json()["id"])
            status, _ = await create_and_wait(client, small, "member", "tickets_csv", poll=0.05)
            asked, started = _ts(status["createdAt"]), _ts(status["startedAt"])
            states = [(await client.get(f"/orgs/{busy.id}/exports/{e}", headers=auth)).json() for e in backlog]
            starts = [_ts(b["startedAt"]) if b["startedAt"] else None for b in states]
            waiting = sum(1 for t in starts if t is None or t >= asked)
            ahead = sum(1 for t in starts if t is not None and asked <= t < started)
            first = min(states, key=lambda b: b["startedAt"] or "~")
            if first["completedAt"] is None:
                first, _ = await _wait_done(client, busy, first["id"])
            # The rest of the backlog is not measured: cancel it.
            for e in backlog:
                await client.delete(f"/orgs/{busy.id}/exports/{e}", headers=auth)
    finally:
        stop(worker)
        stop(api)
    return {
        "case": "fairness",
        "backlog": BACKLOG,
        "backlog_rows": int(first["rowCount"]),
        "backlog_export_seconds": round(_ts(first["completedAt"]) - _ts(first["startedAt"]), 3),
        "small_rows": int(status["rowCount"]),
        "small_wait_seconds": round(started - _ts(status["createdAt"]), 3),
        "small_export_seconds": round(_ts(status["completedAt"]) - _ts(status["createdAt"]), 3),
        "backlog_queued_when_small_asked": waiting,
        "backlog_started_while_small_waited": ahead,
    }


async def _wait_done(client: httpx.AsyncClient, org: Org, export_id: str) -> tuple[dict[str, Any], None]:
    auth = {"Authorization": f"Bearer {org.people['owner']}"}
    deadline = time.monotonic() + TIMEOUT
    while True:
        status: dict[str, Any] = (await client.get(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).json()
        if status["completedAt"] is not None:
            return status, None
        if time.monotonic() > deadline:
            raise RuntimeError(f"export not finished: {status}")
        await asyncio.sleep(0.05)


async def in_process(url: str, org: Org, finished: str) -> dict[str, Any]:
    """`space up`: the 1M tickets export in the process that serves HTTP, its status route polled meanwhile."""
    port = free_port()
    up = spawn("up", url, port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, up)
            idle = await poll_idle(client, org, "owner", finished, 50)
            # Another staff member than the cases' owner: the rate limit (3 a minute) is per user and org.
            status, latencies = await create_and_wait(client, org, "admin", "tickets_csv", poll=0)
    finally:
        stop(up)
    busy = sorted(x * 1000 for x in latencies)
    return {
        "case": "space_up_tickets_csv",
        "rows": int(status["rowCount"]),
        "export_seconds": round(_ts(status["completedAt"]) - _ts(status["createdAt"]), 3),
        "status_polls": len(busy),
        "status_p50_ms": round(statistics.median(busy), 1),
        "status_p99_ms": round(busy[min(len(busy) - 1, int(len(busy) * 0.99))], 1),
        "status_max_ms": round(busy[-1], 1),
        "idle_status_p50_ms": round(statistics.median(idle), 1),
        "idle_status_max_ms": round(max(idle), 1),
    }


async def poll_idle(client: httpx.AsyncClient, org: Org, role: str, export_id: str, n: int) -> list[float]:
    """Latencies (ms) of the status route with no export running, for comparison."""
    auth = {"Authorization": f"Bearer {org.people[role]}"}
    out = []
    for _ in range(n):
        started = time.perf_counter()
        (await client.get(f"/orgs/{org.id}/exports/{export_id}", headers=auth)).raise_for_status()
        out.append((time.perf_counter() - started) * 1000)
    return out


STALLED = 100
"""Downloads held open at once, each stopped after its first part."""
PARALLEL = 20
"""Downloads read in full at once."""
PART = READ_PART_BYTES
"""What a stalled download reads before it stops: the API's part."""
DOWNLOAD_FILTERS = {"assignment": "unassigned"}
"""A third of the 1M tickets: a CSV of about 42 MB (40 MiB), the result the download cases move."""
DOWNLOAD_CONCURRENCY = max(STALLED, PARALLEL)
"""The download phase's API runs with SPACE_DOWNLOAD_CONCURRENCY at this, above the default 64, so that all
the stalled downloads stream together: the case measures what each costs, not the cap."""


class RawGet:
    """A GET on a plain socket that reads only as far as told (a stalled client), or to the end cheaply."""

    def __init__(self, sock: socket.socket, status: int, length: int, received: int) -> None:
        self.sock = sock
        self.status = status
        self.length = length
        self.received = received
        self.ports = (sock.getpeername()[1], sock.getsockname()[1])

    @classmethod
    async def open(cls, port: int, path: str, token: str) -> RawGet:
        """Connect, send the request, read the headers (and whatever body came with them)."""
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(
            sock, f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        )
        raw = b""
        while b"\r\n\r\n" not in raw:
            data = await loop.sock_recv(sock, 65536)
            if not data:
                raise RuntimeError(f"closed before the headers: {raw!r}")
            raw += data
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        return cls(sock, int(lines[0].split()[1]), int(headers.get("content-length", 0)), len(body))

    async def read(self, upto: int) -> int:
        """Read (and drop) body bytes until `upto` of them have arrived in all; the total so far."""
        loop = asyncio.get_running_loop()
        buf = bytearray(PART)
        while self.received < upto:
            n = await loop.sock_recv_into(self.sock, memoryview(buf)[: min(PART, upto - self.received)])
            if not n:
                break
            self.received += n
        return self.received

    def close(self) -> None:
        """Close the connection (unread data: the kernel resets it)."""
        self.sock.close()


def send_queues(ports: set[tuple[int, int]]) -> int:
    """Bytes waiting in the send queues of these (local, remote) server-side sockets (/proc/net/tcp)."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        pair = tuple(int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
        if pair in ports:
            total += int(fields[4].split(":")[0], 16)
    return total


async def still(sample: Any, what: str, polls: int = 10, every: float = 0.1) -> None:
    """Until `sample()` gives the same value `polls` times in a row (a stalled download is the absence of
    progress); at most 60 s."""
    last, same, deadline = None, 0, time.monotonic() + 60
    while same < polls:
        if time.monotonic() > deadline:
            log(f"{what}: still moving after 60 s, measured anyway")
            return
        now = sample()
        same, last = (same + 1 if now == last else 0), now
        await asyncio.sleep(every)


async def downloads(url: str, org: Org) -> list[dict[str, Any]]:
    """The ~40 MB CSV built once; then each download case in an API process of its own."""
    port = free_port()
    api, worker = spawn("api", url, port), spawn("worker", url, port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
            # The member: the other cases' exports count against the owner's and the admin's rate limits.
            status, _ = await create_and_wait(client, org, "member", "tickets_csv", filters=DOWNLOAD_FILTERS)
    finally:
        stop(worker)
        stop(api)
    result = (f"/orgs/{org.id}/exports/{status['id']}/result", org.people["member"], int(status["byteSize"]))
    return [await stalled_downloads(url, *result), await parallel_downloads(url, *result)]


@contextlib.asynccontextmanager
async def download_api(
    url: str, path: str, token: str, size: int
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int]]:
    """A fresh `space api` with the raised cap, warmed up by one full download (pools, arenas), and its port.

    A process per case: the allocator seldom gives memory back, so a case run after another would start
    from the other's high-water mark.
    """
    port = free_port()
    api = spawn("api", url, port, SPACE_DOWNLOAD_CONCURRENCY=str(DOWNLOAD_CONCURRENCY))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            await wait_healthy(client, api)
        warm = await RawGet.open(port, path, token)
        try:
            assert await warm.read(warm.length) == size
        finally:
            warm.close()
        await still(lambda: rss_mib(api), "the API after its warm-up")
        yield api, port
    finally:
        stop(api)


async def stalled_downloads(url: str, path: str, token: str, size: int) -> dict[str, Any]:
    """STALLED downloads held open, each stopped after its first part: how much the API's resident set grows."""
    log(f"stalled_downloads: {STALLED} downloads of {size} bytes, each stopped after its first part ...")
    async with download_api(url, path, token, size) as (api, port):
        before = rss_mib(api)
        reset_peak_rss(api)
        held = [await RawGet.open(port, path, token) for _ in range(STALLED)]
        try:
            for g in held:
                await g.read(PART)
            ports = {g.ports for g in held}
            # Stalled: every server socket's send queue full (the kernel takes no more) and the API still.
            await still(lambda: (send_queues(ports), rss_mib(api)), "stalled_downloads")
            stalled = rss_mib(api)
            return {
                "case": "stalled_downloads",
                "downloads": STALLED,
                "refused": sum(g.status != 200 for g in held),
                "result_mib": round(size / 2**20, 1),
                "download_concurrency": DOWNLOAD_CONCURRENCY,
                "api_rss_before_mib": round(before, 1),
                "api_rss_stalled_mib": round(stalled, 1),
                "api_rss_growth_mib": round(stalled - before, 1),
                "api_peak_rss_mib": round(peak_rss_mib(api), 1),
            }
        finally:
            for g in held:
                g.close()


async def parallel_downloads(url: str, path: str, token: str, size: int) -> dict[str, Any]:
    """PARALLEL full downloads at once: aggregate throughput and the API's peak resident set."""
    log(f"parallel_downloads: {PARALLEL} full downloads of {size} bytes at once ...")
    async with download_api(url, path, token, size) as (api, port):

        async def full() -> int:
            g = await RawGet.open(port, path, token)
            try:
                return await g.read(g.length) if g.status == 200 else -1
            finally:
                g.close()

        reset_peak_rss(api)
        started = time.perf_counter()
        sizes = await asyncio.gather(*(full() for _ in range(PARALLEL)))
        seconds = time.perf_counter() - started
        assert sizes == [size] * PARALLEL, sizes
        return {
            "case": "parallel_downloads",
            "downloads": PARALLEL,
            "result_mib": round(size / 2**20, 1),
            "download_concurrency": DOWNLOAD_CONCURRENCY,
            "seconds": round(seconds, 3),
            "throughput_mib_s": round(PARALLEL * size / 2**20 / seconds, 1),
            "api_peak_rss_mib": round(peak_rss_mib(api), 1),
        }


async def scaling(url: str, orgs: int, tickets: int) -> dict[str, Any]:
    """The workers_scaling case on its own orgs (seeded here)."""
    from benchmarks.scaling import workers_scaling

    log(f"workers_scaling: seeding {orgs} orgs of {tickets} tickets ...")
    started = time.perf_counter()
    seeded = await seed(url, {f"BenchScale{i}": (tickets, 0) for i in range(orgs)})
    log(f"seeded and vacuumed in {time.perf_counter() - started:.1f} s")
    return await workers_scaling(url, list(seeded.values()), tickets)


def _version(url: str) -> None:
    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    log(f"PostgreSQL {version[0] if version else '?'}, {os.cpu_count()} CPUs")


async def run_scaling_only(orgs: int, tickets: int) -> dict[str, Any]:
    """Only the workers_scaling case, against a fresh database."""
    with server() as admin, fresh_database(admin) as url:
        _version(url)
        return await scaling(url, orgs, tickets)


async def run(
    tickets: int,
    small_tickets: int,
    tasks: int,
    scaling_orgs: int,
    scaling_tickets: int,
    phases: set[str] | None = None,
) -> tuple[list[Case], dict[str, Any], dict[str, Any], list[dict[str, Any]], dict[str, Any], list[Case], list[Case]]:
    """Every case, in one run against a fresh database."""
    with server() as admin, fresh_database(admin) as url, tempfile.TemporaryDirectory() as tmp:
        _version(url)
        phases = phases or set(PHASES)
        started = time.perf_counter()
        orgs: dict[str, Org] = {}
        if phases == {"xlsx"}:
            log(
                f"seeding {small_tickets} and {tickets} tickets ..."
                if tickets != small_tickets
                else f"seeding {tickets} tickets ..."
            )
            sizes = {"Bench100k": (small_tickets, 0)} | ({"Bench1M": (tickets, 0)} if tickets != small_tickets else {})
            orgs = await seed(url, sizes)
        elif phases - {"wide"}:
            log(f"seeding {small_tickets} tickets; {tickets} tickets and {tasks} tasks ...")
            # The snapshot's rows are its projects (20) and tasks; the default row limit is 1,000,000.
            orgs = await seed(
                url,
                {
                    "Bench100k": (small_tickets, 0),
                    "Bench1M": (tickets, tasks - PROJECTS),
                    "BenchSmall": (SMALL_TICKETS, 0),
                },
            )
        else:
            orgs = await seed(url, {"BenchSmall": (SMALL_TICKETS, 0)})
        log(f"seeded and vacuumed in {time.perf_counter() - started:.1f} s")
        xlsx_plan = [
            (f"tickets_xlsx_{_size(small_tickets)}", "Bench100k", "tickets_xlsx"),
            (f"tickets_xlsx_{_size(tickets)}", "Bench1M", "tickets_xlsx"),
        ]
        plan = [
            (f"tickets_csv_{_size(small_tickets)}", "Bench100k", "tickets_csv"),
            (f"tickets_csv_{_size(tickets)}", "Bench1M", "tickets_csv"),
            # Before the archive: the links and `up` phases take the second case's and the last case's exports.
            *xlsx_plan,
            (f"snapshot_{_size(tasks)}", "Bench1M", "snapshot"),
            (f"archive_{_size(tickets)}", "Bench1M", "archive"),
        ]
        cases: list[Case] = []
        fair: dict[str, Any] = {}
        latency: dict[str, Any] = {}
        many: list[dict[str, Any]] = []
        scaled: dict[str, Any] = {}
        s3: list[Case] = []
        wide: list[Case] = []
        if phases & {"cases", "links", "up"}:
            # Four exports of the 1M org's owner within a minute: past the default per-org rate limit (3).
            cases, cases_export_ids = await separate_processes(url, orgs, plan, Path(tmp), SPACE_EXPORT_RATE_LIMIT="10")
        elif "xlsx" in phases:
            # Only the workbook cases (`--phases xlsx`), each beside the CSV's COPY of its rows in this run.
            xlsx_plan = xlsx_plan if tickets != small_tickets else xlsx_plan[:1]
            cases, _ = await separate_processes(url, orgs, xlsx_plan, Path(tmp))
        if "links" in phases:
            log(f"link downloads: {plan[1][0]} whole by bearer and by link, and as {RANGES} ranges ...")
            many.append(await link_downloads(url, orgs["Bench1M"], cases_export_ids[1], Path(tmp)))
        if "fairness" in phases:
            log(f"fairness: {BACKLOG} exports queued in Bench100k, then one in BenchSmall ...")
            fair = await fairness(url, orgs["Bench100k"], orgs["BenchSmall"])
        if "downloads" in phases:
            many = [*await downloads(url, orgs["Bench1M"]), *many]
        if "up" in phases:
            log("space up: the tickets export in the HTTP process, status polled back to back ...")
            latency = await in_process(url, orgs["Bench1M"], cases_export_ids[-1])
            log(" ".join(f"{k}={v}" for k, v in latency.items()))
        if "scaling" in phases:
            scaled = await scaling(url, scaling_orgs, scaling_tickets)
        if "s3" in phases:
            log("S3 result store: moto's server, the 1M cases again ...")
            with moto_server():
                s3_plan = [(f"s3_{name}", org_name, kind) for name, org_name, kind in plan[1:3]]
                # The median of three rounds, as the wide cases: one COPY of the 1M tickets took 1.5-2.8 s in
                # consecutive runs here, and moto shares the same two cores. moto holds every object in its own
                # memory, so each result is deleted once measured; kept, each case's upload ran in a moto hundreds
                # of MB larger than the last (on this VM memory first touched is slow: the complete of a 263 MB
                # snapshot went from 0.7 to 1.8-2.5 s with three results kept).
                s3, _ = await separate_processes(
                    url,
                    orgs,
                    s3_plan,
                    Path(tmp),
                    rounds=MEDIAN_ROUNDS,
                    delete_measured=True,
                    SPACE_RESULT_STORE=f"s3://{S3_BUCKET}/results",
                    SPACE_EXPORT_RATE_LIMIT=str(len(s3_plan) * MEDIAN_ROUNDS),
                )
        if "wide" in phases:
            wide = await wide_rows(url, orgs, Path(tmp))
    return cases, fair, latency, many, scaled, s3, wide


async def wide_rows(url: str, orgs: dict[str, Org], tmp: Path) -> list[Case]:
    """The wide-row cases: WIDE_ROWS tickets and WIDE_ROWS tasks of 2,000-byte titles, each beside its COPY."""
    log(f"wide rows: seeding {WIDE_ROWS} tickets and {WIDE_ROWS} tasks of {WIDE_CHARS * 4}-byte titles ...")
    started = time.perf_counter()
    titles = wide_titles()
    settings = load_settings({}, database_url=url)
    assert settings.database_url
    db = Database(app_url(settings.database_url), application_name="space-bench-seed")
    try:
        people = await asyncio.gather(
            seed_org(db, "BenchWideTickets", tickets=WIDE_ROWS, tasks=0, titles=titles),
            # The snapshot's rows are its projects (space.demo makes 20) and their tasks: WIDE_ROWS in all.
            seed_org(db, "BenchWideTasks", tickets=0, tasks=WIDE_ROWS - PROJECTS, titles=titles),
        )
    finally:
        await db.dispose()
    with psycopg.connect(url, autocommit=True) as conn:
        for name, seeded in zip(("BenchWideTickets", "BenchWideTasks"), people, strict=True):
            row = conn.execute("SELECT id FROM organizations WHERE name = %s", (name,)).fetchone()
            assert row is not None
            orgs[name] = Org(str(row[0]), {p.role: p.token for p in seeded})
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    log(f"seeded and vacuumed in {time.perf_counter() - started:.1f} s")
    plan = [("tickets_csv_wide", "BenchWideTickets", "tickets_csv"), ("snapshot_wide", "BenchWideTasks", "snapshot")]
    # Three rounds, the median kept: on a shared 2-core machine a single COPY of these rows varied from 3.4 to
    # 9.9 s between runs of the same code, more than the target's whole margin.
    cases, _ = await separate_processes(
        url, orgs, plan, tmp, warm_org="BenchSmall", rounds=MEDIAN_ROUNDS, SPACE_EXPORT_RATE_LIMIT=str(MEDIAN_ROUNDS)
    )
    return cases


async def run_links(tickets: int, runs: int = 1) -> list[dict[str, Any]]:
    """Only the link-download case (`--links-only`): one org of `tickets` tickets, its CSV built by a worker; then
    the case `runs` times over (`--runs`), each in a fresh `space api` and floor, on that one seeded database."""
    with server() as admin, fresh_database(admin) as url, tempfile.TemporaryDirectory() as tmp:
        log(f"seeding {tickets} tickets ...")
        org = (await seed(url, {"Bench1M": (tickets, 0)}))["Bench1M"]
        port = free_port()
        api, worker = spawn("api", url, port), spawn("worker", url, port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
                await wait_healthy(client, api)
                status, _ = await create_and_wait(client, org, "owner", "tickets_csv")
        finally:
            stop(worker)
            stop(api)
        lines = []
        for n in range(runs):
            log(f"link downloads {n + 1}/{runs}: {status['byteSize']} bytes whole, by link, as {RANGES} ranges ...")
            lines.append(await link_downloads(url, org, status["id"], Path(tmp)))
            log(" ".join(f"{k}={_fmt(v)}" for k, v in lines[-1].items()))
        return lines


async def run_restore(tickets: int, small: int) -> list[dict[str, Any]]:
    """Only the restore case (`--restore-only`, benchmarks.restore): orgs of `small` and `tickets` tickets."""
    from benchmarks.restore import restore_case

    with server() as admin, fresh_database(admin) as url, tempfile.TemporaryDirectory() as tmp:
        log(f"seeding {small} and {tickets} tickets ...")
        orgs = await seed(url, {"BenchSmall": (small, 0), "Bench1M": (tickets, 0)})
        port = free_port()
        api, worker = spawn("api", url, port), spawn("worker", url, port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
                await wait_healthy(client, api)
                return [
                    await restore_case(client, url, orgs[name], n, worker, Path(tmp))
                    for name, n in (("BenchSmall", small), ("Bench1M", tickets))
                ]
        finally:
            stop(worker)
            stop(api)


def _size(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its lines."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tickets", type=int, default=1_000_000, help="tickets of the large case (1000000)")
    parser.add_argument("--small-tickets", type=int, default=100_000, help="tickets of the small case (100000)")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks in the snapshot (1000000)")
    parser.add_argument("--scaling-orgs", type=int, default=8, help="orgs (one export each) of workers_scaling (8)")
    parser.add_argument("--scaling-tickets", type=int, default=500_000, help="tickets per workers_scaling org (500000)")
    parser.add_argument("--only", choices=["workers_scaling", "incremental"], help="run only this case")
    parser.add_argument("--links-only", action="store_true", help="only the link-download case (results/links.json)")
    parser.add_argument("--restore-only", action="store_true", help="only the restore case (results/restore.json)")
    parser.add_argument("--runs", type=int, default=1, help="with --links-only: runs of the case on one seed (1)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"some of {','.join(PHASES)} (all)")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    if phases - set(PHASES):
        parser.error(f"unknown phase(s): {', '.join(sorted(phases - set(PHASES)))}")
    RESULTS.mkdir(exist_ok=True)
    if args.links_only:
        runs = asyncio.run(run_links(args.tickets, args.runs))
        for links in runs:
            print(" ".join(f"{k}={_fmt(v)}" for k, v in links.items()), flush=True)
        (RESULTS / "links.json").write_text(json.dumps(runs[0] if len(runs) == 1 else runs, indent=2) + "\n")
        return
    if args.only == "incremental":
        # SPEC §21, §24: a schedule's complete run over --tickets, then 1,000 changed and its incremental run.
        from benchmarks.incremental import main as incremental

        incremental(["--tickets", str(args.tickets), "--changed", "1000"])
        return
    if args.restore_only:
        restored = asyncio.run(run_restore(args.tickets, args.small_tickets))
        for line in restored:
            print(" ".join(f"{k}={_fmt(v)}" for k, v in line.items()))
        (RESULTS / "restore.json").write_text(json.dumps(restored, indent=2) + "\n")
        return
    if args.only == "workers_scaling":
        scaled = asyncio.run(run_scaling_only(args.scaling_orgs, args.scaling_tickets))
        print(" ".join(f"{k}={_fmt(v)}" for k, v in scaled.items()))
        (RESULTS / "workers_scaling.json").write_text(json.dumps(scaled, indent=2) + "\n")
        return
    restored: list[dict[str, Any]] = []
    if "restore" in phases:
        # On a database of its own (benchmarks.restore), before the others: its lines are printed with theirs.
        restored = asyncio.run(run_restore(args.tickets, args.small_tickets))
        (RESULTS / "restore.json").write_text(json.dumps(restored, indent=2) + "\n")
    others = phases - {"restore"}
    cases, fair, latency, many, scaled, s3, wide = (
        asyncio.run(run(args.tickets, args.small_tickets, args.tasks, args.scaling_orgs, args.scaling_tickets, others))
        if others
        else ([], {}, {}, [], {}, [], [])
    )
    for line in restored:
        print(" ".join(f"{k}={_fmt(v)}" for k, v in line.items()))
    for case in cases:
        print(case.line())
    if fair:
        print(" ".join(f"{k}={_fmt(v)}" for k, v in fair.items()))
    for line in many:
        print(" ".join(f"{k}={_fmt(v)}" for k, v in line.items()))
    if scaled:
        print(" ".join(f"{k}={_fmt(v)}" for k, v in scaled.items()))
    for case in [*s3, *wide]:
        print(case.line())
    # Only what this run measured is written: a run of some phases leaves the others' files as they were.
    if "cases" in phases:
        (RESULTS / "latest.json").write_text(json.dumps([asdict(c) for c in cases], indent=2) + "\n")
    elif "xlsx" in phases:
        (RESULTS / "xlsx.json").write_text(json.dumps([asdict(c) for c in cases], indent=2) + "\n")
    if fair:
        (RESULTS / "fairness.json").write_text(json.dumps(fair, indent=2) + "\n")
    if many:
        (RESULTS / "downloads.json").write_text(json.dumps(many, indent=2) + "\n")
    if latency:
        (RESULTS / "status_latency.json").write_text(json.dumps(latency, indent=2) + "\n")
    if scaled:
        (RESULTS / "workers_scaling.json").write_text(json.dumps(scaled, indent=2) + "\n")
    if s3:
        (RESULTS / "s3.json").write_text(json.dumps([asdict(c) for c in s3], indent=2) + "\n")
    if wide:
        (RESULTS / "wide.json").write_text(json.dumps([asdict(c) for c in wide], indent=2) + "\n")


if __name__ == "__main__":
    main()
