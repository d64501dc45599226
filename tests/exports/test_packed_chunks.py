"""Result chunks packed by the worker (lz4 frames, migration 0013): stored smaller, read back byte for byte.

Real worker code, the real store on the app role, real downloads through the API; the stored rows are read as
the database owner to see how they were kept.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import tracemalloc
from typing import Any

import lz4.frame
import psycopg
import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.exports.storage.postgres import BLOCK_BYTES, PROBE_BYTES, PgResultStore, block_offsets, pack
from space.exports.storage.protocol import ResultKey, ResultMissing
from tests.exports.fixtures import add_tickets, create_export, download, job_row, runner, tuned, uid
from tests.helpers import Api, Org

CHUNK = 4096


def _stored(owner_url: str, export_id: str) -> list[tuple[int, str | None, int | None, int]]:
    """(seq, codec, raw_size, stored bytes) of the published execution's chunks."""
    with psycopg.connect(owner_url) as conn:
        rows = conn.execute(
            "SELECT c.seq, c.codec, c.raw_size, length(c.data) FROM export_chunks c JOIN export_jobs j"
            " ON j.id = c.export_id AND j.execution_id = c.execution_id WHERE j.id = %s ORDER BY c.seq",
            (export_id,),
        ).fetchall()
    return [(int(s), c, r, int(n)) for s, c, r, n in rows]


async def _export(api: Api, db: Database, settings: Settings, org: Org, titles: list[str]) -> tuple[str, bytes]:
    await add_tickets(db, org.id, org.member, titles)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    small = tuned(settings, export_chunk_bytes=CHUNK, export_batch_rows=50)
    assert await run_export(runner(small, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.member, export["id"])
    assert r.status_code == 200
    return export["id"], r.content


def test_pack_keeps_a_chunk_as_it_is_unless_it_saves_a_quarter() -> None:
    text = b"ticket title, open, normal\r\n" * 200
    packed = pack(text)
    assert packed.codec == "lz4" and packed.raw_size == len(text) and len(packed.data) < len(text) // 4
    noise = os.urandom(len(text))
    assert pack(noise).codec is None and pack(noise).data == noise
    assert pack(b"").codec is None


def test_compressed_bytes_are_kept_without_a_frame_made_of_them() -> None:
    # A workbook's chunk is deflate output: its first block doesn't pack, so no 4 MiB frame is made to be thrown
    # away (that cost 8 MiB of allocations per chunk, which the packing thread's arena kept: the workbook's
    # worker peak grew with its size, docs/decisions 0097).
    noise = os.urandom(4 * 1024 * 1024)
    tracemalloc.start()
    try:
        packed = pack(memoryview(noise))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert packed.codec is None and packed.data == noise
    assert peak < 1024 * 1024, peak
    # The probe decides: text behind a first block of noise is kept as it is; text from the start is packed.
    text = b"ticket title, open, normal\r\n" * (len(noise) // 28)
    assert pack(noise[:PROBE_BYTES] + text).codec is None
    assert pack(text + noise[:PROBE_BYTES]).codec == "lz4"


async def test_text_is_stored_packed_and_downloads_byte_for_byte(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    titles = [f"Printer on floor {i % 7} is out of toner again" for i in range(1500)]
    export_id, body = await _export(api, db, settings, org, titles)
    job = await job_row(db, org.id, export_id)
    assert job.byte_size == len(body) and job.sha256 == hashlib.sha256(body).hexdigest()
    assert body.decode("utf-8-sig").count("out of toner again") == len(titles)
    chunks = _stored(owner_url, export_id)
    assert len(chunks) == -(-len(body) // CHUNK) > 5
    # Every whole chunk is packed and says how large it is expanded; together they are the file.
    assert all(codec == "lz4" and raw == CHUNK for _, codec, raw, _ in chunks[:-1])
    assert sum(raw if raw is not None else n for _, _, raw, n in chunks) == len(body)
    assert sum(n for *_, n in chunks) < len(body) // 3


async def test_a_result_of_packed_and_plain_chunks_reads_back_whole_and_in_any_range(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    rng = random.Random(17)
    # Hex digests don't compress (lz4 finds no repeats), repeated words do: the chunks alternate.
    titles = [
        "".join(f"{rng.getrandbits(128):032x}" for _ in range(8)) if (i // 20) % 2 else "same words again " * 15
        for i in range(400)
    ]
    export_id, body = await _export(api, db, settings, org, titles)
    codecs = {codec for _, codec, _, _ in _stored(owner_url, export_id)}
    assert codecs == {"lz4", None}
    job = await job_row(db, org.id, export_id)
    assert job.execution_id is not None
    key = ResultKey(uid(org.id), uid(export_id), job.execution_id)
    # Small pieces and parts: ranges start and end on chunk, part and piece edges and between them.
    store = PgResultStore(db, part_bytes=1000, piece_bytes=300)
    edges = sorted({0, len(body), *(k * CHUNK + d for k in range(1, len(body) // CHUNK + 1) for d in (-1, 0, 1))})
    spans = [(a, b) for a, b in itertools.pairwise(edges) if a < b]
    spans += [(a, min(len(body), a + n)) for a in (1, 299, 300, 999, 1000, CHUNK + 7) for n in (1, 300, 2 * CHUNK)]
    spans += [(a, b) for a, b in (sorted(rng.sample(range(len(body) + 1), 2)) for _ in range(30)) if a < b]
    for a, b in spans:
        got = b"".join([p async for p in store.read(key, a, b)])
        assert got == body[a:b], (a, b)
    assert b"".join([p async for p in store.read(key)]) == body
    # Through the API: one range, by bearer.
    a, b = CHUNK - 5, 3 * CHUNK + 5
    r = await api.call("GET", org.path(f"/exports/{export_id}/result"), org.member, headers={"Range": f"bytes={a}-{b}"})
    assert r.status_code == 206 and r.content == body[a : b + 1]


@pytest.mark.parametrize("damage", ["cut", "flipped"])
async def test_a_damaged_packed_chunk_fails_rather_than_sending_other_bytes(
    api: Api, db: Database, settings: Settings, owner_url: str, damage: str
) -> None:
    org = await api.org()
    export_id, body = await _export(api, db, settings, org, [f"again and again {i % 3}" for i in range(600)])
    job = await job_row(db, org.id, export_id)
    assert job.execution_id is not None
    change = (
        "substring(data FROM 1 FOR length(data) / 2)"
        if damage == "cut"
        else "overlay(data PLACING '\\xffffffffffffffff'::bytea FROM 12)"
    )
    with psycopg.connect(owner_url) as conn:
        conn.execute(
            f"UPDATE export_chunks SET data = {change} WHERE export_id = %s AND seq = 1 AND codec = 'lz4'",
            (export_id,),
        )
    key = ResultKey(uid(org.id), uid(export_id), job.execution_id)
    store = PgResultStore(db)
    with pytest.raises(ResultMissing):
        _ = [p async for p in store.read(key, 0, len(body))]


class _Counted(PgResultStore):
    """The real store, noting the bytes each of its part queries brought back."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts: list[int] = []

    async def _query(self, query: str, bound: dict[str, Any]) -> list[tuple[Any, ...]]:
        rows = await super()._query(query, bound)
        if "substring" in query:
            self.parts.append(sum(len(r[2]) for r in rows))
        return rows


async def test_a_packed_chunk_is_read_a_part_of_its_frame_at_a_time(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    """A download holds one part at a time, packed chunks or not: a frame larger than a part comes in parts."""
    org = await api.org()
    rng = random.Random(3)
    # Words from a small vocabulary: they pack, but not to nothing (frames of a few KiB per 64 KiB chunk).
    words = ["toner", "printer", "floor", "again", "broken", "laptop", "screen", "vpn", "login", "mail"]
    titles = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(3000)]
    await add_tickets(db, org.id, org.member, titles)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    big = tuned(settings, export_chunk_bytes=64 * 1024)
    assert await run_export(runner(big, db), uid(export["id"]), uid(org.id)) == "completed"
    body = (await download(api, org, org.member, export["id"])).content
    frames = [n for _, codec, _, n in _stored(owner_url, export["id"]) if codec == "lz4"]
    assert frames and max(frames) > 2000
    job = await job_row(db, org.id, export["id"])
    assert job.execution_id is not None
    store = _Counted(db, part_bytes=1000, piece_bytes=250)
    key = ResultKey(uid(org.id), uid(export["id"]), job.execution_id)
    assert b"".join([p async for p in store.read(key)]) == body
    assert max(store.parts) <= 1000 and len(store.parts) >= sum(-(-n // 1000) for n in frames)
    store.parts.clear()
    a = len(body) // 2
    assert b"".join([p async for p in store.read(key, a, a + 10)]) == body[a : a + 10]
    assert max(store.parts) <= 1000


async def test_a_range_inside_a_packed_chunk_enters_its_frame_at_its_block(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    """A chunk's frame lists where its 64 KiB blocks start (0024), so a range inside it reads from its own block:
    with the first block damaged, a range in a later one still reads byte for byte (it never reads that block),
    while one touching the first fails; the frame bytes a range fetches are about one block's, not the chunk's."""
    org = await api.org()
    rng = random.Random(5)
    words = ["toner", "printer", "floor", "again", "broken", "laptop", "screen", "vpn", "login", "mail"]
    titles = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(6000)]
    await add_tickets(db, org.id, org.member, titles)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    chunk = 512 * 1024
    assert await run_export(runner(tuned(settings, export_chunk_bytes=chunk), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    body = (await download(api, org, org.member, export["id"])).content
    assert len(body) > 2 * chunk
    with psycopg.connect(owner_url) as conn:
        data, blocks = conn.execute(
            "SELECT data, blocks FROM export_chunks WHERE export_id = %s AND seq = 0", (export["id"],)
        ).fetchone() or (None, None)
        assert blocks == block_offsets(data) and len(blocks) == chunk // BLOCK_BYTES
        assert lz4.frame.decompress(data) == body[:chunk]
        # Damage the first block's compressed bytes (past its 4-byte size): its checksum no longer matches.
        conn.execute(
            "UPDATE export_chunks SET data = overlay(data PLACING '\\xffffffffffffffff'::bytea FROM %s)"
            " WHERE export_id = %s AND seq = 0",
            (blocks[0] + 4 + 16 + 1, export["id"]),
        )
    job = await job_row(db, org.id, export["id"])
    assert job.execution_id is not None
    key = ResultKey(uid(org.id), uid(export["id"]), job.execution_id)
    store = _Counted(db)
    a = 5 * BLOCK_BYTES + 100
    assert b"".join([p async for p in store.read(key, a, a + 10)]) == body[a : a + 10]
    assert sum(store.parts) < BLOCK_BYTES
    with pytest.raises(ResultMissing):
        _ = [p async for p in store.read(key, 10, 20)]
    # A range ending inside the chunk fetches the blocks it spans, not a part's worth of the frame past its end.
    store.parts.clear()
    a, b = 2 * BLOCK_BYTES + 10, 3 * BLOCK_BYTES + 10
    assert b"".join([p async for p in store.read(key, a, b)]) == body[a:b]
    assert sum(store.parts) == blocks[4] - blocks[2]
