"""Link and range downloads from a real `space api` process (SPEC §10, §11): the chunks a range reads, a range's
first part read in the transaction that authorizes it (SPEC §24), reads that stop when a ranged link download's
client goes away, `curl -C -` resuming, and no token in the process's log.

Chunk reads are counted by PostgreSQL, as in test_download_streaming (whose counter, socket client and result
builder this module reuses): a restrictive policy on `export_chunks` records every row a query of the app role
reads. This module's API process has SPACE_DOWNLOAD_CONCURRENCY=1, so "the slot is free again" (a probe
download is accepted) tells that the server has seen a client go.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from space.config import load_settings
from space.db import Database, app_url
from space.exports.storage.postgres import READ_PART_BYTES
from tests.exports.fixtures import WAIT, wait_for
from tests.exports.test_download_streaming import (
    CHUNK,
    COUNT_READS,
    NEEDS_PROC_NET,
    TICKETS,
    ChunkReads,
    RawGet,
    Result,
    _completed,
    _long_tickets,
    stalled,
)
from tests.faults.procs import Proc, Procs
from tests.helpers import Api, Org, UserFactory, fresh_database

pytestmark = pytest.mark.slow


# Which transaction read what: each chunk read and each membership row the app role reads notes its transaction
# (a read-only one, the worker's snapshot, notes nothing).
NOTE_TRANSACTIONS = """
ALTER TABLE test_chunk_reads ADD COLUMN xact bigint DEFAULT txid_current();
CREATE TABLE test_member_reads (n bigserial PRIMARY KEY, xact bigint NOT NULL DEFAULT txid_current());
CREATE FUNCTION test_member_read() RETURNS boolean
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = public
  AS $$ BEGIN
    IF current_setting('transaction_read_only') = 'off' THEN INSERT INTO test_member_reads DEFAULT VALUES; END IF;
    RETURN true;
  END $$;
REVOKE ALL ON FUNCTION test_member_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION test_member_read() TO space_app;
CREATE POLICY test_note_member_reads ON memberships AS RESTRICTIVE FOR SELECT TO space_app
  USING (test_member_read());
"""


@pytest.fixture(scope="module")
def links_url(owner_url: str) -> Iterator[str]:
    """A fresh database of this module, migrated, with the chunk-read counter and the transactions' notes."""
    with fresh_database(owner_url, "space_links") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(COUNT_READS)
            conn.execute(NOTE_TRANSACTIONS)
        yield url


@dataclass
class World(ChunkReads):
    """The module's API process, its org, a ~25 MiB result and a one-part one, and every token minted."""

    url: str
    port: int
    proc: Proc
    org: Org
    api: Api
    big: Result
    small: Result
    tokens: list[str] = field(default_factory=list)

    async def link(self, result: Result) -> str:
        """A fresh link's URL (its token remembered for the log check)."""
        r = await self.api.call("POST", self.org.path(f"/exports/{result.id}/links"), result.owner)
        assert r.status_code == 201, r.text
        url: str = r.json()["url"]
        self.tokens.append(url.partition("token=")[2])
        return url

    async def slot_free(self) -> None:
        """Wait until the one download slot is free: the probe download is accepted."""

        async def accepted() -> bool:
            r = await self.api.call("GET", self.org.path(self.small.path), self.small.owner)
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200

        await wait_for(accepted, "the download slot to be free")


@pytest.fixture(scope="module")
async def world(links_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """`space api` (one download slot) on the module's database, an org, and two completed exports."""
    procs = Procs(links_url, tmp_path_factory.mktemp("links-api"))
    settings = load_settings({}, database_url=links_url)
    db = Database(app_url(links_url), application_name="space-links-tests")
    try:
        proc, base = await procs.api(SPACE_DOWNLOAD_CONCURRENCY="1")
        async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
            api = Api(client, UserFactory(db))  # type: ignore[arg-type]
            org = await api.org("Link streams")
            await _long_tickets(db, org, TICKETS)
            big = await _completed(api, db, settings, org, org.member, links_url)
            small = await _completed(api, db, settings, org, org.customer, links_url, filters={"q": "no such ticket"})
            yield World(links_url, int(base.rsplit(":", 1)[1]), proc, org, api, big, small)
    finally:
        await procs.close()
        await db.dispose()


def range_reads(result: Result, start: int, end: int) -> list[int]:
    """The chunks a read of bytes [start, end) queries, in order: one query per part from `start` on, each
    within one chunk (chunk 0's size, which places `start`, is read once per execution: see the test)."""
    reads: list[int] = []
    seq, pos = divmod(start, CHUNK)
    offset = start
    while offset < end:
        n = min(READ_PART_BYTES, end - offset, CHUNK - pos)
        reads.append(seq)
        pos, offset = pos + n, offset + n
        if pos >= CHUNK:
            seq, pos = seq + 1, 0
    return reads


async def test_a_range_reads_only_the_chunks_it_covers(world: World) -> None:
    body, size = world.big.body, len(world.big.body)
    url = await world.link(world.big)
    start, end = 5 * CHUNK + 1234, 9 * CHUNK - 77
    after = await world.mark()
    r = await world.api.client.get(url, headers={"range": f"bytes={start}-{end - 1}"})
    assert r.status_code == 206 and r.content == body[start:end]
    assert r.headers["content-range"] == f"bytes {start}-{end - 1}/{size}"
    reads = await world.reads(world.big, after)
    # The first range of an execution a process serves reads chunk 0's size first; it is remembered.
    parts = reads[1:] if reads[:1] == [0] else reads
    assert parts == range_reads(world.big, start, end), reads
    assert set(reads) <= {0, *range(start // CHUNK, (end - 1) // CHUNK + 1)}
    # A suffix range reads the last chunk only: chunk 0's size is known by now.
    after = await world.mark()
    r = await world.api.client.get(url, headers={"range": "bytes=-100"})
    assert r.status_code == 206 and r.content == body[-100:]
    assert await world.reads(world.big, after) == range_reads(world.big, size - 100, size)
    # HEAD and 304 read nothing, over a real server too, and send no body.
    after = await world.mark()
    head = await world.api.client.head(url)
    assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == str(size)
    etag = head.headers["etag"]
    r = await world.api.client.get(url, headers={"if-none-match": etag})
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert await world.reads(world.big, after) == []


async def _transactions(url: str, table: str, after: int) -> set[int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(f"SELECT DISTINCT xact FROM {table} WHERE n > %s", (after,))
        return {int(r[0]) for r in await cur.fetchall()}


async def test_a_ranges_first_part_is_read_in_the_transaction_that_authorizes_it(world: World) -> None:
    """One round trip a range (issue 35): the link's user, org, membership and export, and the range's first part,
    in one transaction; its bytes are the range's. Refusals with a part fetched beside them: test_links."""
    body = world.big.body
    url = await world.link(world.big)
    # The first range of an execution that a process serves learns the chunk size, which places later ranges.
    r = await world.api.client.get(url, headers={"range": "bytes=0-9"})
    assert r.status_code == 206 and r.content == body[:10]
    start, end = 3 * CHUNK + 100, 3 * CHUNK + 1100
    chunk_mark = await world.mark()
    async with await psycopg.AsyncConnection.connect(world.url, autocommit=True) as conn:
        row = await (await conn.execute("SELECT coalesce(max(n), 0) FROM test_member_reads")).fetchone()
        member_mark = int(row[0]) if row else 0
    r = await world.api.client.get(url, headers={"range": f"bytes={start}-{end - 1}"})
    assert r.status_code == 206 and r.content == body[start:end]
    assert await world.reads(world.big, chunk_mark) == [3]
    read_in = await _transactions(world.url, "test_chunk_reads", chunk_mark)
    authorized_in = await _transactions(world.url, "test_member_reads", member_mark)
    assert len(read_in) == 1 and read_in == authorized_in, (read_in, authorized_in)


@NEEDS_PROC_NET
async def test_a_ranged_link_download_whose_client_goes_away_stops_reading(world: World) -> None:
    parts = world.big.parts
    start = parts[3].start + 4321
    url = await world.link(world.big)
    after = await world.mark()
    g = await RawGet.open(world.port, url, None, {"Range": f"bytes={start}-"})
    try:
        assert g.status == 206, g.headers
        assert g.headers["referrer-policy"] == "no-referrer"
        await g.read(READ_PART_BYTES)
        before, handed = await stalled(world, g, world.big, after)  # type: ignore[arg-type]
        total = len(range_reads(world.big, start, len(world.big.body)))
        assert len(before) < total // 2, (len(before), total, handed)
        # It holds the one slot: another link download is busy (after its authorization).
        r = await world.api.client.get(await world.link(world.small))
        assert r.status_code == 503 and r.json()["code"] == "busy" and r.headers["retry-after"], r.text
        assert r.headers["referrer-policy"] == "no-referrer"
    finally:
        g.close()
    # Once the server has seen the client go (its slot is free again), at most the part in flight was read.
    await world.slot_free()
    gone = await world.reads(world.big, after)
    print(f"OBSERVED gone ranged client: {len(before)} reads before the close, {len(gone)} after, of {total}")
    assert gone[: len(before)] == before and len(gone) <= len(before) + 1, (before, gone)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_curl_resumes_an_interrupted_link_download(world: World, tmp_path: Path) -> None:
    await world.slot_free()
    url = await world.link(world.big)
    # The first attempt breaks off after about three parts: what arrived is on disk, as a browser keeps it.
    g = await RawGet.open(world.port, url, None)
    try:
        assert g.status == 200
        partial = await g.read(3 * READ_PART_BYTES)
    finally:
        g.close()
    target = tmp_path / "export.csv"
    target.write_bytes(partial)
    assert 0 < len(partial) < len(world.big.body)
    await world.slot_free()
    base = f"http://127.0.0.1:{world.port}"
    curl = await asyncio.create_subprocess_exec(
        "curl", "--silent", "--show-error", "--fail", "-C", "-", "-o", str(target), base + url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(curl.communicate(), WAIT)
    # curl refuses to resume (exit 33) when the server answers the range with 200.
    assert curl.returncode == 0, (curl.returncode, out, err)
    data = target.read_bytes()
    assert data == world.big.body
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(world.big.body).hexdigest()


async def test_no_log_line_holds_a_token(world: World) -> None:
    url = await world.link(world.small)
    r = await world.api.client.get(url)
    assert r.status_code == 200
    await world.api.client.get(url.replace("token=", "token=x"))

    def logged() -> str:
        return world.proc.log()

    async def request_line() -> bool:
        return f"/exports/{world.small.id}/result" in logged()

    # The request log has written the link requests (their path, never the query that holds the token).
    await wait_for(request_line, "the request line of a link download")
    text = logged()
    assert world.tokens and all(t not in text for t in world.tokens)
    for user in (world.org.owner, world.org.member, world.org.customer):
        assert user.token not in text
