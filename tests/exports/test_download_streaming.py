"""Downloads over a real socket (SPEC §11): one part at a time, reads that stop with the client, and the
per-process cap.

A real `space api` process serves a database of this module's own, with SPACE_DOWNLOAD_CONCURRENCY=2; the
test client is a plain socket, so the test decides exactly how much it reads (the AsyncTestClient would buffer
whole bodies). Results are built by the real worker code, in chunks of 1.5 parts.

How chunk reads are counted: PostgreSQL counts them. This module's database (and only it) has one more
policy on `export_chunks`, restrictive and for the app role's SELECTs, whose expression records the export
and chunk of every row a query reads in `test_chunk_reads`. A part query reads one row, so the table lists the
parts the API read, in order, at the moment each read's transaction commits. (The statistics views would
count the same scans, but each backend flushes its counters to them up to 10 s later on PostgreSQL 15, so a
test would have to wait on time; pg_stat_statements is not installed.)

What the API handed to the kernel is read from the kernel: what the client received, plus the client
socket's receive queue and the server socket's send queue (/proc/net/tcp). "Within one part" is then: the
last part the API read begins no further than that (plus the server's own write buffer). That holds at every
moment for a server that reads part by part; the test samples it once the download stands still (reads and
both queues unchanged for a second), which is when a server that read ahead would have done so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psycopg
import pytest
from sqlalchemy import text

from space.config import Settings, load_settings
from space.db import Database, Tenant, UnitOfWork, app_url
from space.exports.downloads import BUSY_RETRY_AFTER
from space.exports.pipeline import run_export
from space.exports.storage.postgres import READ_PART_BYTES, PgResultStore
from space.exports.storage.protocol import READ_PIECE_BYTES, ResultKey, ResultMissing
from tests.exports.fixtures import WAIT, add_tickets, create_export, job_row, runner, tuned, uid, wait_for
from tests.faults.procs import Procs
from tests.helpers import Api, Org, UserFactory, assert_problem, fresh_database

if TYPE_CHECKING:
    from tests.helpers import TestUser

NEEDS_PROC_NET = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads socket queues from /proc")

CAP = 2
"""SPACE_DOWNLOAD_CONCURRENCY of this module's API process."""
CHUNK = 3 * READ_PART_BYTES // 2
"""Stored chunk size: each chunk is read as a whole part and a half part."""
TICKETS = 12_000
TITLE_REPEAT = 64
"""Each ticket's title is 64 different md5 digests (2 KiB): the result is about 25 MiB, far more than socket
buffers, and does not compress, so its chunks are stored as they are and read by parts (packed chunks: see
`test_packed_chunks.py`)."""
SLACK = 4 * READ_PIECE_BYTES
"""What the server may hold in its own write buffer beyond what the kernel took: up to asyncio's 64 KiB
high-water mark plus the piece that crossed it (four pieces leave room, and stay well under a part)."""
RCVBUF = 64 * 1024
"""The test client's socket receive buffer (set before connecting, so it does not grow)."""
QUIET_POLLS = 20
"""A stalled download: the same reads and socket queues this many polls in a row (50 ms apart)."""

COUNT_READS = """
CREATE TABLE test_chunk_reads (n bigserial PRIMARY KEY, export_id uuid NOT NULL, seq integer NOT NULL);
CREATE FUNCTION test_chunk_read(p_export uuid, p_seq integer) RETURNS boolean
  LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = public
  AS $$ INSERT INTO test_chunk_reads (export_id, seq) VALUES (p_export, p_seq) RETURNING true $$;
REVOKE ALL ON FUNCTION test_chunk_read(uuid, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION test_chunk_read(uuid, integer) TO space_app;
CREATE POLICY test_count_reads ON export_chunks AS RESTRICTIVE FOR SELECT TO space_app
  USING (test_chunk_read(export_id, seq));
"""


# -- the module's database, API process and results -------------------------------------------------------


@pytest.fixture(scope="module")
def dl_url(owner_url: str) -> Iterator[str]:
    """A fresh database of this module, migrated, with the chunk-read counter."""
    with fresh_database(owner_url, "space_dl") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(COUNT_READS)
        yield url


@dataclass(frozen=True)
class Part:
    """One part as the API reads it: chunk `seq`, result bytes [start, end)."""

    seq: int
    start: int
    end: int


@dataclass(frozen=True)
class Result:
    """A completed export, its bytes, and the parts a download of it reads, in order."""

    id: str
    owner: TestUser
    body: bytes
    parts: list[Part]

    @property
    def path(self) -> str:
        """The result route (without the org prefix)."""
        return f"/exports/{self.id}/result"


class ChunkReads:
    """The chunk reads COUNT_READS records in the database at `self.url`."""

    url: str

    async def reads(self, result: Result, after: int) -> list[int]:
        """The chunks of `result` read since counter value `after`, in order."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT seq FROM test_chunk_reads WHERE export_id = %s AND n > %s ORDER BY n", (result.id, after)
            )
            return [int(r[0]) for r in await cur.fetchall()]

    async def mark(self) -> int:
        """The counter now: reads after it belong to what follows."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            cur = await conn.execute("SELECT coalesce(max(n), 0) FROM test_chunk_reads")
            row = await cur.fetchone()
            return int(row[0]) if row else 0


@dataclass
class World(ChunkReads):
    """The module's API process, org and results."""

    url: str
    port: int
    org: Org
    api: Api
    big: Result
    """The member's: the downloads the tests stall, read or drop."""
    big2: Result
    """The admin's, same content: a second slot holder."""
    doomed: Result
    """The owner's: its chunks are deleted midway by one test."""
    spare: Result
    """The owner's too: with `big2`, the probe of whether both slots are free (reads of `big` stay the tests')."""
    small: Result
    """The customer's: one part, the probe of whether a slot is free."""

    async def get(self, result: Result, user: TestUser | None = None) -> httpx.Response:
        """A whole GET of the result through httpx (probes and refusals)."""
        return await self.api.call("GET", self.org.path(result.path), user or result.owner)

    async def open(self, result: Result, user: TestUser | None = None) -> RawGet:
        """A GET of the result on a plain socket, headers read, body left to the test."""
        return await RawGet.open(self.port, self.org.path(result.path), (user or result.owner).token)

    async def streaming(self, result: Result) -> RawGet:
        """`open` once a slot is free: a slot an earlier test let go of comes back when the server has seen it."""

        async def attempt() -> RawGet | None:
            g = await self.open(result)
            if g.status == 200:
                return g
            g.close()
            assert g.status == 503, g.status
            return None

        got: RawGet = await wait_for(attempt, "a free download slot")
        return got

    async def slots_free(self) -> None:
        """Wait until both slots can be taken at once (every earlier download has let go of its slot)."""

        async def both() -> bool:
            held = [await self.open(self.big2), await self.open(self.spare)]
            try:
                return all(g.status == 200 for g in held)
            finally:
                for g in held:
                    g.close()

        await wait_for(both, "both download slots to be free")


@pytest.fixture(scope="module")
async def world(dl_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """`space api` on the module's database, an org with ~25 MiB of tickets, and five completed exports."""
    procs = Procs(dl_url, tmp_path_factory.mktemp("downloads-api"))
    settings = load_settings({}, database_url=dl_url)
    db = Database(app_url(dl_url), application_name="space-dl-tests")
    try:
        _, base = await procs.api(SPACE_DOWNLOAD_CONCURRENCY=str(CAP))
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
            api = Api(client, UserFactory(db))  # type: ignore[arg-type]
            org = await api.org("Streams")
            await _long_tickets(db, org, TICKETS)
            results = [
                await _completed(api, db, settings, org, user, dl_url)
                for user in (org.member, org.admin, org.owner, org.owner)
            ]
            small = await _completed(api, db, settings, org, org.customer, dl_url, filters={"q": "no such ticket"})
            assert len(small.parts) == 1 and all(len(r.parts) > 20 for r in results)
            yield World(dl_url, int(base.rsplit(":", 1)[1]), org, api, *results, small=small)
    finally:
        await procs.close()
        await db.dispose()


async def _long_tickets(db: Database, org: Org, count: int) -> None:
    """`count` tickets by the member with 2 KiB titles, set-based, as the app role under the org's context."""
    oid = uid(org.id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        last = await uow.session.scalar(
            text("UPDATE ticket_counters SET last_number = last_number + :n WHERE org_id = :org RETURNING last_number"),
            {"n": count, "org": oid},
        )
        assert last is not None
        await uow.session.execute(
            text(
                "INSERT INTO tickets (id, org_id, number, title, creator_id)"
                " SELECT gen_random_uuid(), :org, :last - :n + i,"
                " (SELECT string_agg(md5(i || '-' || j), '') FROM generate_series(1, :reps) AS j), :creator"
                " FROM generate_series(1, :n) AS i"
            ),
            {"org": oid, "last": last, "n": count, "reps": TITLE_REPEAT, "creator": org.member.id},
        )


async def _completed(
    api: Api,
    db: Database,
    settings: Settings,
    org: Org,
    user: TestUser,
    url: str,
    filters: dict[str, str] | None = None,
) -> Result:
    """A tickets CSV of `user`, built by the worker code in 1.5-part chunks; its bytes and its parts."""
    export = await create_export(api, org, user, {"kind": "tickets_csv", "filters": filters or {}})
    outcome = await run_export(runner(tuned(settings, export_chunk_bytes=CHUNK), db), uid(export["id"]), uid(org.id))
    assert outcome == "completed"
    with psycopg.connect(url) as conn:
        chunks = conn.execute(
            "SELECT c.seq, c.data FROM export_chunks c JOIN export_jobs j"
            " ON j.id = c.export_id AND j.execution_id = c.execution_id WHERE j.id = %s ORDER BY c.seq",
            (export["id"],),
        ).fetchall()
    parts: list[Part] = []
    offset = 0
    for seq, data in chunks:
        for pos in range(0, max(len(data), 1), READ_PART_BYTES):
            size = min(READ_PART_BYTES, len(data) - pos)
            parts.append(Part(seq, offset + pos, offset + pos + size))
        offset += len(data)
    return Result(export["id"], user, b"".join(bytes(d) for _, d in chunks), parts)


# -- a client that reads only what the test says -----------------------------------------------------------


class RawGet:
    """One GET on a plain non-blocking socket: the test reads the body when and as far as it likes."""

    def __init__(self, sock: socket.socket, status: int, headers: dict[str, str], body: bytes) -> None:
        self.sock = sock
        self.status = status
        self.headers = headers
        self.body = bytearray(body)
        self.client_port: int = sock.getsockname()[1]
        self.server_port: int = sock.getpeername()[1]

    @classmethod
    async def open(cls, port: int, path: str, token: str | None, headers: dict[str, str] | None = None) -> RawGet:
        """Connect with a small receive buffer, send the request (with the bearer `token` unless None, and
        `headers`), read the status line and headers."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), WAIT)
            lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"]
            lines += [] if token is None else [f"Authorization: Bearer {token}"]
            lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
            request = "\r\n".join(lines) + "\r\n\r\n"
            await loop.sock_sendall(sock, request.encode())
            raw = b""
            while b"\r\n\r\n" not in raw:
                data = await asyncio.wait_for(loop.sock_recv(sock, 65536), WAIT)
                assert data, f"the server closed before its headers: {raw!r}"
                raw += data
        except BaseException:
            sock.close()
            raise
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        return cls(sock, int(status_line.split()[1]), headers, body)

    @property
    def length(self) -> int:
        """The response's Content-Length."""
        return int(self.headers["content-length"])

    async def read(self, n: int) -> bytes:
        """Read until `n` body bytes have arrived in all (fewer if the server closes first); all received so far."""
        loop = asyncio.get_running_loop()
        while len(self.body) < n:
            data = await asyncio.wait_for(loop.sock_recv(self.sock, min(1 << 20, n - len(self.body))), WAIT)
            if not data:
                break
            self.body += data
        return bytes(self.body)

    async def read_all(self) -> bytes:
        """Read up to Content-Length (or until the server closes)."""
        return await self.read(self.length)

    def queues(self) -> tuple[int, int]:
        """(client receive queue, server send queue) of this connection, in bytes, from the kernel."""
        rx = tx = None
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
            tx_queue, rx_queue = (int(q, 16) for q in fields[4].split(":"))
            if (local, remote) == (self.client_port, self.server_port):
                rx = rx_queue
            elif (local, remote) == (self.server_port, self.client_port):
                tx = tx_queue
        assert rx is not None and tx is not None, "the connection is not in /proc/net/tcp"
        return rx, tx

    def handed(self) -> int:
        """Body bytes the server has handed to the kernel: what arrived here, or waits in either socket."""
        rx, tx = self.queues()
        return len(self.body) + rx + tx

    def close(self) -> None:
        """Close the socket (with unread data the kernel resets the connection: the client is gone)."""
        self.sock.close()


@contextlib.asynccontextmanager
async def opened(world: World, result: Result) -> AsyncIterator[RawGet]:
    """`world.streaming`, closed at the end whatever happens."""
    g = await world.streaming(result)
    try:
        yield g
    finally:
        g.close()


async def stalled(world: World, g: RawGet, result: Result, after: int) -> tuple[list[int], int]:
    """Wait until a download whose client stopped reading stands still; (its reads, bytes handed to the kernel).

    Standing still is the absence of progress, so it is seen as the same sample QUIET_POLLS times in a row.
    Reads are sampled before the socket queues: both only grow, so the pair never shows more reads than the
    bytes it was sampled with allow, and a server under load that looks still too early can only make the
    check easier to pass, never fail a correct server.
    """
    last: tuple[list[int], int] | None = None
    same = 0
    deadline = time.monotonic() + WAIT
    while same < QUIET_POLLS:
        now = (await world.reads(result, after), g.handed())
        same = same + 1 if now == last else 0
        last = now
        if time.monotonic() > deadline:
            raise AssertionError(f"the download did not stand still: {now[1]} bytes handed, reads {now[0]}")
        await asyncio.sleep(0.05)
    assert last is not None
    return last


def _within_one_part(result: Result, reads: list[int], handed: int) -> None:
    """The server read at most one part beyond what it handed to the socket, and read it part by part."""
    assert reads, "nothing was read"
    furthest = min(p.start for p in result.parts if p.seq == max(reads))
    assert furthest <= handed + SLACK, (
        f"read chunk {max(reads)} (from byte {furthest}) when only {handed} bytes had reached the socket"
    )
    # One query per part, in order: no chunk read whole, none ahead.
    read = result.parts[: len(reads)]
    assert reads == [p.seq for p in read], (reads, result.parts[: len(reads) + 2])
    assert read[-1].start <= handed + SLACK, (
        f"read part {len(read)} from byte {read[-1].start} when only {handed} bytes had reached the socket"
    )


# -- the tests ----------------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_download_reads_every_part_once_in_order(world: World) -> None:
    after = await world.mark()
    async with opened(world, world.big) as g:
        assert g.status == 200 and g.length == len(world.big.body)
        body = await g.read_all()
    assert body == world.big.body
    assert hashlib.sha256(body).hexdigest() == g.headers["etag"].strip('"')
    assert await world.reads(world.big, after) == [p.seq for p in world.big.parts]


@pytest.mark.slow
@NEEDS_PROC_NET
async def test_a_client_that_stops_reading_stops_the_reads_within_one_part(world: World) -> None:
    after = await world.mark()
    async with opened(world, world.big) as g:
        assert g.status == 200
        await g.read(READ_PART_BYTES)
        reads, handed = await stalled(world, g, world.big, after)
        print(f"OBSERVED stopped client: {len(reads)} of {len(world.big.parts)} parts read, {handed} bytes handed")
        _within_one_part(world.big, reads, handed)
        assert len(reads) < len(world.big.parts) // 2, (len(reads), handed)
        # Reading on, the rest arrives whole and nothing is read twice.
        assert await g.read_all() == world.big.body
    assert await world.reads(world.big, after) == [p.seq for p in world.big.parts]


@pytest.mark.slow
@NEEDS_PROC_NET
async def test_a_client_that_goes_away_stops_the_reads_and_frees_its_slot(world: World) -> None:
    after = await world.mark()
    gone = await world.streaming(world.big)
    try:
        await gone.read(READ_PART_BYTES)
        reads, handed = await stalled(world, gone, world.big, after)
        _within_one_part(world.big, reads, handed)
        async with opened(world, world.big2) as holder:
            assert holder.status == 200
            assert_problem(await world.get(world.small), 503, "busy")
            gone.close()

            async def accepted() -> bool:
                return (await world.get(world.small)).status_code == 200

            # The slot comes back once the server has seen the client go.
            await wait_for(accepted, "the gone client's slot to be free again")
            after_gone = await world.reads(world.big, after)
            assert after_gone[: len(reads)] == reads and len(after_gone) <= len(reads) + 1, (reads, after_gone)
    finally:
        gone.close()


@pytest.mark.slow
async def test_beyond_the_cap_a_download_is_busy_after_authorization(world: World) -> None:
    org = world.org
    async with opened(world, world.big) as first, opened(world, world.big2) as second:
        # CAP - 1 and CAP downloads stream at once.
        assert (first.status, second.status) == (200, 200)
        await first.read(READ_PART_BYTES)
        await second.read(READ_PART_BYTES)
        body = assert_problem(await world.get(world.small), 503, "busy")
        r = await world.get(world.small)
        assert r.headers["retry-after"] == str(BUSY_RETRY_AFTER), r.headers
        # Authorization still comes first: refusals are the same as with free slots.
        assert_problem(await world.get(world.small, org.member), 404, "not_found")
        assert_problem(await world.api.call("GET", org.path(world.small.path)), 401, "unauthenticated")
        assert_problem(
            await world.api.call("GET", org.path(f"/exports/{uuid.uuid4()}/result"), org.owner), 404, "not_found"
        )
        assert "download" in body["detail"]
        # One finishes: a new one is accepted.
        assert await first.read_all() == world.big.body

        async def accepted() -> httpx.Response | None:
            r = await world.get(world.small)
            return r if r.status_code == 200 else None

        r = await wait_for(accepted, "a slot after the first download ended")
        assert r.content == world.small.body
    await world.slots_free()


@pytest.mark.slow
async def test_a_download_that_fails_midway_frees_its_slot(world: World) -> None:
    async with opened(world, world.doomed) as g:
        assert g.status == 200
        await g.read(READ_PART_BYTES)
        with psycopg.connect(world.url, autocommit=True) as conn:
            conn.execute("DELETE FROM export_chunks WHERE export_id = %s", (world.doomed.id,))
        # The stream aborts where the bytes end: the client gets less than its Content-Length, never a short
        # body that looks whole.
        body = await g.read_all()
        assert len(body) < g.length and body == world.doomed.body[: len(body)]
    await world.slots_free()


# -- the store's read API (in process) ----------------------------------------------------------------------


async def _stored(api: Api, db: Database, settings: Settings) -> tuple[Org, ResultKey, int]:
    """A CSV of about 5 KB in 1000-byte chunks: its org, key and size."""
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"row {i} " + "r" * (i % 30) for i in range(150)])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    small_chunks = tuned(settings, export_chunk_bytes=1000)
    assert await run_export(runner(small_chunks, db), uid(export["id"]), uid(org.id)) == "completed"
    job = await job_row(db, org.id, export["id"])
    assert job.execution_id is not None and job.byte_size is not None and job.byte_size > 4000
    return org, ResultKey(uid(org.id), uid(export["id"]), job.execution_id), job.byte_size


async def test_the_store_reads_any_byte_range_in_bounded_pieces(api: Api, db: Database, settings: Settings) -> None:
    _, key, size = await _stored(api, db, settings)
    store = PgResultStore(db, part_bytes=300, piece_bytes=128)
    whole = b"".join([p async for p in store.read(key)])
    assert len(whole) == size
    ranges: list[tuple[int, int | None]] = [
        (0, size),
        (0, 1),
        (1, 999),
        (999, 1001),
        (1000, 2000),
        (1000, 1300),
        (1299, 1301),
        (2500, None),
        (size - 1, size),
        (size - 1, None),
        (7, 7),
    ]
    for start, end in ranges:
        pieces = [p async for p in store.read(key, start, end)]
        assert b"".join(pieces) == whole[start:end], (start, end)
        assert all(0 < len(p) <= 128 for p in pieces), (start, end, [len(p) for p in pieces])


async def test_a_chunk_missing_midway_aborts_the_read(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    _, key, size = await _stored(api, db, settings)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(
            "DELETE FROM export_chunks WHERE export_id = %s AND execution_id = %s AND seq = 2",
            (key.export_id, key.execution_id),
        )
    store = PgResultStore(db)
    for end in (size, None):
        got = b""
        with pytest.raises(ResultMissing):
            async for piece in store.read(key, 0, end):
                got += piece
        assert len(got) == 2000, end
    with pytest.raises(ResultMissing):
        _ = [p async for p in store.read(key, 2500, size)]
