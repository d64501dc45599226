"""The suite's two million-row scenarios, on one database seeded once (seeding is most of their time): an org of
1,000,000 tickets and 1,000,000 projects and tasks.

- An archive of it, built by a real `space worker` process at the default limits (its tickets.csv is past one
  export's row limit, within the archive's own), keeps the worker's memory flat: its peak resident
  set (VmHWM, reset before each export) grows by little more than a small archive's, and the ZIP it stores is
  whole (every CRC checked, the manifest's rows right).
- So does a workbook of its million tickets (SPEC §20), and the workbook it stores is whole.
- Ticket search `q` (SPEC §14) is served by an index there, so it answers within the API's statement timeout.

The database is migrated to head and seeded with its GIN indexes (the trigram indexes of ticket search) set aside,
then rebuilt from their own definitions: built in bulk, as a migration builds them on an existing deployment, and
far faster than a million incremental GIN inserts. (Seeding at an older revision ran today's code against an older
schema, which broke whenever a later migration added a column the code reads.)
One module, so that the suite's workers (pytest-xdist, by file) run both scenarios beside the one seeding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql
from sqlalchemy import make_url, text

from space.app import create_app
from space.config import load_settings
from space.db import APP_ROLE, Tenant, UnitOfWork
from space.demo import DemoUser, seed_org
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultKey
from tests.exports.fixtures import add_tickets, job_row, uid, wait_for
from tests.helpers import TestUser as Person  # not collected as a test class
from tests.helpers import app_database, fresh_database, spawn_worker
from tests.tickets.test_ticket_search import RARE

TICKETS = 1_000_000
TASKS = 999_980
"""With its 20 projects (space.demo), the snapshot part has 1,000,000 rows."""


@dataclass(frozen=True)
class Million:
    """The database (owner URL), the big org and a small one (their people), and the search's known tickets."""

    url: str
    big_id: uuid.UUID
    big: list[DemoUser]
    small: list[DemoUser]
    hits: list[int]
    """The numbers of the tickets that contain RARE (title or body), in order."""
    tickets: int
    """The big org's tickets: the seeded million and the search's four."""


@pytest.fixture(scope="module")
async def million(owner_url: str) -> AsyncIterator[Million]:
    with fresh_database(owner_url, "space_million") as url:
        with _gin_indexes_set_aside(url):
            async with app_database(url, "space-tests-million-seed") as db:
                small = await seed_org(db, "Small", tickets=1_000, tasks=200)
                big = await seed_org(db, "Big", tickets=TICKETS, tasks=TASKS)
                member = next(p for p in big if p.role == "member")
                async with UnitOfWork(db.sessionmaker) as uow:
                    creator = await uow.session.scalar(
                        text("SELECT id FROM users WHERE email = :e"), {"e": member.email}
                    )
                # A user reads their own memberships through app.user_id.
                async with UnitOfWork(db.sessionmaker, Tenant(user_id=creator)) as uow:
                    org_id = await uow.session.scalar(
                        text("SELECT org_id FROM memberships WHERE user_id = :u"), {"u": creator}
                    )
                assert org_id is not None and creator is not None
                who = Person(creator, member.email, "", member.token)
                # A few matches among a million: in titles, in a body, in other cases; and one near miss.
                hits = await add_tickets(db, org_id, who, [f"printer {RARE} jam", f"{RARE.upper()}!"])
                hits += await add_tickets(db, org_id, who, ["plain"], body=f"see {RARE.lower()} log")
                await add_tickets(db, org_id, who, ["Xylophoni que"], body="Xylophoniqu e")
        yield Million(url, org_id, big, small, hits, TICKETS + 4)


@contextlib.contextmanager
def _gin_indexes_set_aside(url: str) -> Iterator[None]:
    """The GIN indexes of tickets, tasks and projects dropped for the block and made again after it, from the
    definitions the catalogue gave (whatever the migrations made them)."""
    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            " AND tablename IN ('tickets', 'tasks', 'projects') AND indexdef LIKE '% USING gin %'"
        ).fetchall()
        # None where the server has no pg_trgm (migration 0005 then makes none; search runs without them).
        for name, _ in found:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    yield
    with psycopg.connect(url, autocommit=True) as conn:
        for _, definition in found:
            conn.execute(definition)


# --- the archive's memory ---------------------------------------------------------------------------------------

GROWTH_MIB = 40
"""How much more the 1M archive's peak may be than the small one's: buffers bounded by batch and chunk sizes."""
WAIT = 600.0


def _mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> None:
    # Linux: VmHWM := the current resident set.
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _owner(people: list[DemoUser]) -> dict[str, str]:
    token = next(p.token for p in people if p.role == "owner")
    return {"Authorization": f"Bearer {token}"}


async def _export(client: AsyncTestClient, org_id: str, auth: dict[str, str], kind: str) -> dict[str, Any]:  # type: ignore[type-arg]
    r = await client.post(f"/orgs/{org_id}/exports", json={"kind": kind}, headers=auth)
    assert r.status_code == 202, r.text
    export_id = r.json()["id"]

    async def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = (await client.get(f"/orgs/{org_id}/exports/{export_id}", headers=auth)).json()
        return body if body["state"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = await wait_for(finished, f"{kind} {export_id}", within=WAIT)
    assert done["state"] == "completed", done
    return done


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to read peak memory")
async def test_a_million_row_archive_keeps_the_worker_memory_flat(million: Million, tmp_path: Path) -> None:
    url, small, big = million.url, million.small, million.big
    rows = million.tickets + TASKS + 20
    # The worker runs with the default limits: tickets.csv's 1,000,004 rows are past one export's row limit
    # (1,000,000), the archive's own (SPACE_ARCHIVE_ROW_LIMIT, per member file) lets it through (SPEC §27).
    worker = await spawn_worker(url)
    try:
        async with AsyncTestClient(app=create_app(load_settings({}, database_url=url))) as client:
            orgs = {o["name"]: o["id"] for o in (await client.get("/orgs", headers=_owner(big))).json()["items"]}
            small_orgs = (await client.get("/orgs", headers=_owner(small))).json()["items"]
            small_id, big_id = small_orgs[0]["id"], orgs["Big"]
            # The small archive warms the worker up (pools, imports, the chunk buffers) and is the baseline.
            await _export(client, small_id, _owner(small), "archive")
            _reset_peak(worker.pid)
            await _export(client, small_id, _owner(small), "archive")
            small_peak = _mib(worker.pid, "VmHWM")
            _reset_peak(worker.pid)
            done = await _export(client, big_id, _owner(big), "archive")
            big_peak = _mib(worker.pid, "VmHWM")
        print(f"OBSERVED worker peak: small archive {small_peak:.1f} MiB, 1M archive {big_peak:.1f} MiB")
        assert big_peak - small_peak < GROWTH_MIB, (small_peak, big_peak)
    finally:
        if worker.returncode is None:
            worker.terminate()
            try:
                await asyncio.wait_for(worker.wait(), 30)
            except TimeoutError:
                worker.kill()
                await worker.wait()
    # The stored ZIP is whole: copied out of the store a part at a time, every member's CRC checked.
    async with app_database(url, "space-tests-archive-read") as db:
        job = await job_row(db, big_id, done["id"])
        assert job.execution_id is not None
        key = ResultKey(uid(big_id), job.id, job.execution_id)
        path = tmp_path / "big.zip"
        with path.open("wb") as f:
            async for part in PgResultStore(db).read(key):
                f.write(part)
    assert path.stat().st_size == done["byteSize"]
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        files = {f["name"]: f for f in json.loads(archive.read("manifest.json"))["files"]}
        assert (
            files["tickets.csv"]["rows"] == million.tickets and files["snapshot.json"]["rows"] == rows - million.tickets
        )
        assert files["data/tickets.jsonl"]["rows"] == million.tickets
        # The export's rows are every data member's: the snapshot's, the CSV's and the data files' (SPEC §23).
        assert done["rowCount"] == sum(f.get("rows", 0) for f in files.values())
        for name, entry in files.items():
            assert archive.getinfo(name).file_size == entry["bytes"], name


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to read peak memory")
async def test_a_million_row_workbook_keeps_the_worker_memory_flat(million: Million, tmp_path: Path) -> None:
    url, small, big = million.url, million.small, million.big
    # The million and the search's four tickets pass the default row limit by four.
    worker = await spawn_worker(url, SPACE_EXPORT_ROW_LIMIT=str(million.tickets))
    try:
        async with AsyncTestClient(app=create_app(load_settings({}, database_url=url))) as client:
            orgs = {o["name"]: o["id"] for o in (await client.get("/orgs", headers=_owner(big))).json()["items"]}
            small_id = (await client.get("/orgs", headers=_owner(small))).json()["items"][0]["id"]
            big_id = orgs["Big"]
            # The million tickets as CSV warm the worker up: its buffers bounded by batch and chunk sizes (the
            # result store's two chunks, a batch-sized connection buffer) are then as full as they get, so what
            # follows measures what a workbook's rows cost. The small workbook is the baseline (asked by the
            # small org's admin: its owner's rate limit may still count the archive test's exports).
            await _export(client, big_id, _owner(big), "tickets_csv")
            admin = {"Authorization": f"Bearer {next(p.token for p in small if p.role == 'admin')}"}
            await _export(client, small_id, admin, "tickets_xlsx")
            _reset_peak(worker.pid)
            await _export(client, small_id, admin, "tickets_xlsx")
            small_peak = _mib(worker.pid, "VmHWM")
            _reset_peak(worker.pid)
            done = await _export(client, big_id, _owner(big), "tickets_xlsx")
            big_peak = _mib(worker.pid, "VmHWM")
        print(f"OBSERVED worker peak: small workbook {small_peak:.1f} MiB, 1M workbook {big_peak:.1f} MiB")
        assert done["rowCount"] == million.tickets
        assert big_peak - small_peak < GROWTH_MIB, (small_peak, big_peak)
    finally:
        if worker.returncode is None:
            worker.terminate()
            try:
                await asyncio.wait_for(worker.wait(), 30)
            except TimeoutError:
                worker.kill()
                await worker.wait()
    # The stored workbook is whole: every part's CRC checked, one sheet row per ticket below the header.
    async with app_database(url, "space-tests-workbook-read") as db:
        job = await job_row(db, big_id, done["id"])
        assert job.execution_id is not None
        key = ResultKey(uid(big_id), job.id, job.execution_id)
        path = tmp_path / "big.xlsx"
        with path.open("wb") as f:
            async for part in PgResultStore(db).read(key):
                f.write(part)
    assert path.stat().st_size == done["byteSize"]
    with zipfile.ZipFile(path) as book:
        assert book.testzip() is None
        # Every row is numbered (`<row r="...">`, record 0097); a tag cut between two reads is counted once.
        rows, tail, tag = 0, b"", b'<row r="'
        with book.open("xl/worksheets/sheet1.xml") as sheet:
            while piece := sheet.read(1 << 20):
                rows += (tail + piece).count(tag) - tail.count(tag)
                tail = piece[-(len(tag) - 1) :]
    assert rows == million.tickets + 1


# --- the search's index -----------------------------------------------------------------------------------------

API_STATEMENT_TIMEOUT_MS = 5000
"""SPEC §14's default for SPACE_API_STATEMENT_TIMEOUT_MS."""
TRIGRAM_INDEXES = ("tickets_title_trgm_idx", "tickets_body_trgm_idx")


def _index_scans(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = ANY(%s)",
            (list(TRIGRAM_INDEXES),),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_search_in_a_million_tickets_is_served_by_the_index(million: Million) -> None:
    url, org_id, hits = million.url, million.big_id, million.hits
    member = next(p for p in million.big if p.role == "member")
    with psycopg.connect(url) as conn:
        if conn.execute("SELECT FROM pg_available_extensions WHERE name = 'pg_trgm'").fetchone() is None:
            pytest.skip("pg_trgm is not available on this server (no contrib): 0005 makes no trigram index here")
        present = conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = ANY(%s)", (list(TRIGRAM_INDEXES),))
        assert present.fetchone() == (2,), "0005 made no trigram index although pg_trgm is available"
    timeout = sql.SQL("ALTER ROLE {} IN DATABASE {} {}").format
    role, database = sql.Identifier(APP_ROLE), sql.Identifier(make_url(url).database or "")
    with psycopg.connect(url, autocommit=True) as conn:
        # What SPEC §14 gives API queries; set for the app role's new connections in this database only.
        conn.execute(
            timeout(role, database, sql.SQL("SET statement_timeout = {}").format(sql.Literal(API_STATEMENT_TIMEOUT_MS)))
        )
    try:
        await _search_by_index(url, org_id, member.token, hits)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(timeout(role, database, sql.SQL("RESET statement_timeout")))


async def _search_by_index(url: str, org_id: uuid.UUID, token: str, hits: list[int]) -> None:
    """The API's search for RARE answers the hits, through the trigram index."""
    scans = _index_scans(url)
    settings = load_settings({}, database_url=url)
    async with AsyncTestClient(app=create_app(settings)) as client:
        r = await client.get(
            f"/orgs/{org_id}/tickets",
            params={"q": RARE.lower(), "pageSize": 100},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert [t["number"] for t in body["items"]] == hits and body["total"] == len(hits)
        assert min(hits) > 1_000_000
        app_db = client.app.state.db
        async with app_db.engine.connect() as conn:
            assert (await conn.scalar(text("SHOW statement_timeout"))) == "5s"

        # The trigram index answered it (the API connection reports its statistics when it goes idle).
        async def used() -> bool:
            return _index_scans(url) > scans

        await wait_for(used, "the trigram index's scan count to grow", within=30)
