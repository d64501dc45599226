"""`PgResultStore`: the chunks of an execution as rows of `export_chunks`, so "completed" and "the bytes exist" sit
in one database. Every operation is its own short transaction under the org's RLS context.

Memory: libpq keeps a connection's buffers at the size of the largest message it ever carried, and pooled
connections live on. So a chunk never travels as one message on a pooled connection: the worker writes an
execution's chunks on a connection of their own, dropped afterwards, and a download reads one part (at most
1 MiB of a chunk) per query. The worker's and the API's memory stays the same however many chunks have passed,
and a download holds one part at a time however slowly its client reads (SPEC §11).

Compression: the worker packs each chunk as one lz4 frame before it stores it (`pack`; migration 0013), so the
database writes, logs and reads a fraction of the bytes (text compresses about 4:1) whatever its build, and the
compression's CPU is the worker's, not the shared database's. A chunk that would not shrink by a quarter is
stored as it is. A packed chunk is read a part of its frame at a time and expanded a piece at a time, so a
download still holds one part. Its blocks are independent and `blocks` lists where each starts in the frame
(migration 0024), so a range starting inside a chunk reads and expands from its own 64 KiB block, not from the
chunk's start (docs/decisions 0101).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import lz4.frame
from sqlalchemy import Insert, delete, insert, text
from sqlalchemy.ext.asyncio import AsyncConnection

from space.db import Database, Tenant, UnitOfWork, set_tenant
from space.db.reads import Read
from space.exports import ledger
from space.exports.models import ExportChunk
from space.exports.storage.protocol import READ_PIECE_BYTES, ChunkSink, Opening, ResultKey, ResultMissing

READ_PART_BYTES = 1024 * 1024
"""A download reads at most this many bytes of a chunk per query: one part, all it holds at a time."""
CHUNK_SIZES_KEPT = 4096
"""How many executions' chunk sizes a store remembers (what a range needs to find its first chunk)."""

PACKED_AT_MOST = 0.75
"""A chunk is stored packed only if its lz4 frame is at most this share of it (as PostgreSQL's own TOAST asks
of its compression): expanding it costs every download a little, which a small saving does not repay."""

T = TypeVar("T")


@dataclass(frozen=True)
class Packed:
    """A chunk as it is stored: `data`, and `codec`/`raw_size` when `data` is an lz4 frame of `raw_size` bytes."""

    data: bytes | memoryview
    codec: str | None = None
    raw_size: int | None = None
    blocks: list[int] | None = None
    """Where each block of the frame starts in `data` (`BLOCK_BYTES` of the chunk each, the last the rest)."""


BLOCK_BYTES = 64 * 1024
"""The expanded size of every block of a packed chunk's frame but its last."""
FRAME_HEADER_BYTES = 7
"""A frame's header as `_frame` writes it: magic number, flags, block descriptor, header checksum (no size)."""


PROBE_BYTES = 64 * 1024
"""A chunk longer than this is packed only if its first PROBE_BYTES would pack: bytes that are compressed already
(a workbook's, an archive's deflated members) are stored as they are without a chunk-sized frame made and thrown
away (8 MiB of allocations per 4 MiB chunk, in the packing thread, whose arena kept them: docs/decisions 0097)."""


def pack(chunk: bytes | memoryview) -> Packed:
    """`chunk` as one lz4 frame, or as it is when that would not save a quarter (judged on its first
    PROBE_BYTES first). 64 KiB blocks keep expanding it cheap in memory (the reader holds one block's window, not
    the whole chunk); each block carries its checksum, so a damaged block fails the download before any of its
    bytes go out."""
    if len(chunk) > PROBE_BYTES and not _packs(memoryview(chunk)[:PROBE_BYTES]):
        return Packed(chunk)
    frame = _frame(chunk)
    if len(frame) > PACKED_AT_MOST * len(chunk):
        return Packed(chunk)
    return Packed(frame, "lz4", len(chunk), block_offsets(frame))


def _frame(data: bytes | memoryview) -> bytes:
    # Independent blocks (not linked to the one before, about 1.5% larger on CSV): a reader can enter at any one.
    frame: bytes = lz4.frame.compress(
        data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_checksum=True, store_size=False, block_linked=False
    )
    return frame


_FRAME_HEADER = _frame(b"")[:FRAME_HEADER_BYTES]
"""The header `_frame` writes on every frame (its flags and block size only): what a frame entered at a block is
fed first."""


def block_offsets(frame: bytes) -> list[int]:
    """Where each block of a frame `_frame` wrote starts: a walk over the blocks' 4-byte sizes (the top bit says
    "stored as it is") up to the end mark, each block followed by its 4-byte checksum."""
    offsets: list[int] = []
    at = FRAME_HEADER_BYTES
    while True:
        size = int.from_bytes(frame[at : at + 4], "little") & 0x7FFFFFFF
        if not size:
            return offsets
        offsets.append(at)
        at += 4 + size + 4


def _packs(probe: memoryview) -> bool:
    return len(_frame(probe)) <= PACKED_AT_MOST * len(probe)


# Asynchronous commit: a chunk only matters once its export is published, and the publish commits
# synchronously, which flushes the WAL up to it, these earlier inserts included. A crash before that loses an
# unpublished execution's chunks, which nobody can read anyway.
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")

# One part of chunk :seq:, cut into rows of :piece bytes, with the chunk's size (expanded) and codec: of a
# plain chunk :len bytes from byte :pos (1-based); of a packed one (codec lz4) :clen bytes of its frame from byte
# :cpos, or, when the chunk lists its blocks and :block is one of them (1-based; 0 is none), from where that
# block starts, since a frame expands from its start or from a block of its own (the column `b`: where it began,
# 0-based, NULL when at :cpos); and, when block :stop is listed (the one after the range's last byte), no further
# than where it starts: a range fetches the blocks it expands, not a part's worth past its end. `substring` detoasts only the slice it needs: the column is
# EXTERNAL (0013), so a value is fetched up to the slice's end. `OFFSET 0` keeps the slice computed once, not
# once per row; `length` reads the stored size without detoasting. The lookup is by the whole primary key, so
# no plan detoasts another chunk. The rows are put in order in Python (an ORDER BY would sort the part). An
# empty slice is one empty row.
_READ_PART = """
SELECT p.size, o, substring(p.d FROM o FOR %(piece)s), p.codec, p.b
FROM (SELECT coalesce(raw_size, length(data)) AS size, codec, blocks[%(block)s] AS b,
             CASE WHEN codec IS NULL THEN substring(data FROM %(pos)s FOR %(len)s)
                  ELSE substring(data FROM coalesce(blocks[%(block)s] + 1, %(cpos)s)
                                 FOR least(%(clen)s, greatest(0, coalesce(
                                     blocks[%(stop)s] - coalesce(blocks[%(block)s], %(cpos)s - 1), %(clen)s))))
             END AS d
      FROM export_chunks
      WHERE export_id = %(export)s AND execution_id = %(execution)s AND seq = %(seq)s AND org_id = %(org)s
      OFFSET 0) AS p,
     generate_series(1, greatest(length(p.d), 1), %(piece)s) AS o
"""
_CHUNK_SIZE = """
SELECT coalesce(raw_size, length(data)) FROM export_chunks
WHERE export_id = %(export)s AND execution_id = %(execution)s AND seq = 0 AND org_id = %(org)s
"""
_LATER_CHUNK = """
SELECT 1 FROM export_chunks
WHERE export_id = %(export)s AND execution_id = %(execution)s AND seq > %(seq)s AND org_id = %(org)s LIMIT 1
"""


class _PgSink:
    """Each chunk in its own short transaction, all on one connection."""

    def __init__(self, conn: AsyncConnection, key: ResultKey) -> None:
        self._conn = conn
        self._key = key

    async def abort(self) -> None:
        """Nothing to undo here: the failure that follows deletes the execution's chunks."""

    async def write(self, seq: int, data: bytes | memoryview) -> None:
        """Pack and insert one chunk (lz4 releases the GIL: packed in a thread, the read goes on meanwhile)."""
        key = self._key
        packed = await asyncio.to_thread(pack, data)
        async with self._conn.begin():
            await set_tenant(self._conn, Tenant(org_id=key.org_id))
            await self._conn.execute(_ASYNC_COMMIT)
            await self._conn.execute(_insert_chunk(key, seq, packed))


def _insert_chunk(key: ResultKey, seq: int, packed: Packed) -> Insert:
    """The INSERT of one stored chunk."""
    return insert(ExportChunk).values(
        export_id=key.export_id,
        execution_id=key.execution_id,
        seq=seq,
        org_id=key.org_id,
        data=packed.data,
        codec=packed.codec,
        raw_size=packed.raw_size,
        blocks=packed.blocks,
    )


class PgResultStore:
    """`ResultStore` on the `export_chunks` table (bytea, lz4-compressed by PostgreSQL when it can: see 0004)."""

    def __init__(
        self,
        db: Database,
        *,
        part_bytes: int = READ_PART_BYTES,
        piece_bytes: int = READ_PIECE_BYTES,
    ) -> None:
        self._db = db
        self._part_bytes = part_bytes
        self._piece_bytes = min(piece_bytes, part_bytes)
        self._chunk_sizes: dict[ResultKey, int] = {}

    def _uow(self, key: ResultKey) -> UnitOfWork:
        return UnitOfWork(self._db.sessionmaker, Tenant(org_id=key.org_id))

    def chunk_bytes(self, configured: int) -> int:
        """The configured size: a chunk is a row."""
        return configured

    async def write(self, key: ResultKey, seq: int, data: bytes | memoryview) -> None:
        """Pack and insert one chunk in its own transaction."""
        packed = await asyncio.to_thread(pack, data)
        async with self._uow(key) as uow:
            await uow.session.execute(_ASYNC_COMMIT)
            await uow.session.execute(_insert_chunk(key, seq, packed))

    @contextlib.asynccontextmanager
    async def sink(self, key: ResultKey) -> AsyncIterator[ChunkSink]:
        """Chunk writes on a connection of their own, closed at the end (its buffer grew to a chunk)."""
        async with self._db.engine.connect() as conn:
            try:
                yield _PgSink(conn, key)
            finally:
                await conn.invalidate()

    async def delete(self, key: ResultKey) -> int:
        """Delete an execution's chunks."""
        async with self._uow(key) as uow:
            result = await uow.session.execute(
                delete(ExportChunk).where(
                    ExportChunk.org_id == key.org_id,
                    ExportChunk.export_id == key.export_id,
                    ExportChunk.execution_id == key.execution_id,
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def delete_org(self, org_id: uuid.UUID) -> int:
        """Nothing: the purge deletes `export_chunks` rows itself, in counted batches like every tenant table."""
        return 0

    async def sweep(self, limit: int = 500) -> dict[str, int]:
        """Delete the chunks of executions that are neither running nor published and kept (cross-org: through
        the maintenance function `space_exports_orphan_executions`)."""
        async with UnitOfWork(self._db.sessionmaker) as uow:
            orphans = await ledger.orphan_executions(uow.session, limit)
        chunks = 0
        for export_id, org_id, execution_id in orphans:
            chunks += await self.delete(ResultKey(org_id, export_id, execution_id))
        return {"orphan_executions": len(orphans), "orphan_chunks": chunks}

    async def aclose(self) -> None:
        """Nothing: the store uses the database's pool, which its owner disposes of."""

    def opening(self, key: ResultKey, start: int, end: int) -> Opening | None:
        """The first part of `read(key, start, end)` as its statement, for another round trip to carry (the
        authorization's); None when finding its chunk needs the chunk size, not yet read by this process."""
        size = self._chunk_sizes.get(key) if start else 1
        if size is None:
            return None
        seq, pos = divmod(start, size)
        return Opening(key, start, end, _READ_PART, self._part(key, seq, pos, start, end, None))

    def _part(
        self, key: ResultKey, seq: int, pos: int, offset: int, end: int | None, packed: _Expanding | None
    ) -> dict[str, Any]:
        """The parameters of `_READ_PART` for the next part: of chunk `seq` from its byte `pos` (the read's byte
        `offset`), `packed` its frame as far as it was read (None: this is the chunk's first part)."""
        length = self._part_bytes if end is None else min(self._part_bytes, end - offset)
        read_to = 0 if packed is None else packed.read
        # A chunk's first part starting past its first block enters the frame at its block, if the chunk lists its
        # blocks (0024); if not, the frame is read from its start, as before.
        block = pos // BLOCK_BYTES if packed is None else -1  # -1: go on where the last part ended
        # A packed chunk's frame expands from where it is entered: a range ending early in the chunk needs about as
        # many of the frame's bytes as it expands to up to that end (LZ4 adds well under 1% to what it can't pack),
        # not a whole part. The piece's size more is slack; a part that ran short is read on by the loop.
        clen, stop = self._part_bytes, 0
        if end is not None:
            made = packed.made if packed is not None else block * BLOCK_BYTES
            clen = min(clen, pos + (end - offset) - made + self._piece_bytes)
            stop = (pos + (end - offset) - 1) // BLOCK_BYTES + 2  # 1-based: the block after the last byte's
        return self._bound(
            key, seq=seq, pos=pos + 1, len=length, cpos=read_to + 1, clen=clen, block=block + 1, stop=stop
        )

    async def read(
        self, key: ResultKey, start: int = 0, end: int | None = None, opened: Opening | None = None
    ) -> AsyncIterator[bytes]:
        """Bytes `start` to `end` of an execution, one part (at most `part_bytes` of one chunk) per short
        transaction, the next part read only when the consumer has taken every piece of this one; the first part
        from `opened` when it holds this read's first part (fetched by the authorization's round trip).

        No read-ahead: the server hands a piece to the socket and asks for the next one while the kernel is still
        sending it, so a stalled client holds at most this part and the server's write buffer, and its database
        reads stop within one part. A packed chunk's frame is read by parts too, from its start (a frame only
        expands from there: a range inside it expands what lies before and drops it). Chunks have one size (the
        first one's, expanded) except the last, so an offset is a chunk number and a position in it; that size
        is read from the table, not from today's settings.
        """
        seq, pos, offset = 0, start, start
        if start:
            seq, pos = divmod(start, await self._chunk_size(key, start))
        packed: _Expanding | None = None  # chunk `seq`'s frame as far as it was read, when it is packed
        while end is None or offset < end:
            bound = self._part(key, seq, pos, offset, end, packed)
            read_to, clen, block = bound["cpos"] - 1, bound["clen"], bound["block"] - 1
            if opened is not None and opened.rows is not None and opened.key == key and opened.params == bound:
                rows, opened.rows = opened.rows, None
            else:
                rows = await _finished(self._query(_READ_PART, bound))
            if not rows:
                if end is None and not await _finished(self._query(_LATER_CHUNK, self._bound(key, seq=seq))):
                    return
                raise ResultMissing(f"chunk {seq} of export {key.export_id} is missing")
            chunk_size, codec, entered = int(rows[0][0]), rows[0][3], rows[0][4]
            # Hand the pieces out oldest first and drop each once taken: a stalled client pins only what is left.
            rows.sort(key=lambda row: int(row[1]), reverse=True)
            pieces: list[bytes] = [row[2] for row in rows]
            del rows
            if codec is None:
                taken = 0
                while pieces:
                    piece = pieces.pop()
                    taken += len(piece)
                    if piece:
                        yield piece
                pos, offset = pos + taken, offset + taken
            else:
                if packed is None:
                    packed = _Expanding(self._piece_bytes)
                    if entered is not None:
                        packed.enter(int(entered), block * BLOCK_BYTES)
                        read_to = packed.read
                want = chunk_size if end is None else min(chunk_size, pos + (end - offset))
                async for piece in packed.expand(pieces, pos, want):
                    pos, offset = pos + len(piece), offset + len(piece)
                    yield piece
                if pos < want and (packed.ended or packed.read - read_to < clen):
                    raise ResultMissing(f"chunk {seq} of export {key.export_id} expands to fewer bytes than it holds")
            if pos >= chunk_size:
                seq, pos, packed = seq + 1, 0, None

    async def _chunk_size(self, key: ResultKey, start: int) -> int:
        """The size of an execution's chunks (its first one's, expanded), read once and then remembered: a
        published execution's chunks never change (a retry is another execution), and a download of a deleted
        one is refused before it reads (and its parts would be missing)."""
        size = self._chunk_sizes.get(key)
        if size is None:
            first = await _finished(self._query(_CHUNK_SIZE, self._bound(key)))
            if not first or not first[0][0]:
                raise ResultMissing(f"export {key.export_id} has no stored byte {start}")
            size = self._chunk_sizes[key] = int(first[0][0])
            if len(self._chunk_sizes) > CHUNK_SIZES_KEPT:
                del self._chunk_sizes[next(iter(self._chunk_sizes))]  # the oldest
        return size

    def _bound(self, key: ResultKey, **params: int) -> dict[str, Any]:
        """A statement's parameters: the execution's key, the piece size and `params`."""
        return {
            "org": key.org_id,
            "export": key.export_id,
            "execution": key.execution_id,
            "piece": self._piece_bytes,
            **params,
        }

    async def _query(self, query: str, bound: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One read-only statement in its own short transaction under the org's context (`bound["org"]`), rows in
        binary (the bytes as they are stored, not as hex text twice their size).

        A download runs one per part, so the transaction is one round trip (`db.reads`): the tenant setting and
        the query in one pipeline on a connection in autocommit, one implicit transaction up to its Sync. Through a
        unit of work they would be four round trips; nothing here writes, so there is nothing for one to commit.
        """
        (rows,) = await self._db.reads.read(Tenant(org_id=bound["org"]), Read(query, bound, binary=True))
        return rows


class _Expanding:
    """One packed chunk being expanded, its frame fed a part at a time (`read`: the frame's bytes so far, `made`:
    the chunk's bytes expanded so far), so a download holds one part of a frame, as of a plain chunk."""

    def __init__(self, piece: int) -> None:
        self._expander = lz4.frame.LZ4FrameDecompressor()
        self._piece = piece
        self.read = 0
        self.made = 0

    def enter(self, at: int, made: int) -> None:
        """Start at the block that begins at frame byte `at` and expands to chunk byte `made` on (a frame of
        independent blocks): the frame's header is fed first, the blocks before are never read."""
        self._expander.decompress(_FRAME_HEADER)
        self.read, self.made = at, made

    @property
    def ended(self) -> bool:
        """The frame's end mark has been read."""
        return bool(self._expander.eof)

    async def expand(self, frame: list[bytes], start: int, end: int) -> AsyncIterator[bytes]:
        """Feed the frame's next part (`frame`, its pieces last first, each dropped once fed) and yield what it
        expands to between the chunk's bytes `start` and `end`, at most a piece at a time; what lies before
        `start` is expanded and dropped. Stops at `end`, at the frame's end, or when the part is used up."""
        while frame and self.made < end and not self.ended:
            data = frame.pop()
            self.read += len(data)
            while self.made < end:
                try:
                    out = self._expander.decompress(data, max_length=self._piece)
                except RuntimeError as exc:  # lz4's word for a damaged frame
                    raise ResultMissing(f"a stored chunk does not expand: {exc}") from None
                data = b""
                if not out:
                    break  # this piece is used up: the next one
                lo, hi = max(start - self.made, 0), min(end - self.made, len(out))
                self.made += len(out)
                if lo < hi:
                    yield out[lo:hi] if (lo, hi) != (0, len(out)) else out


async def _finished(coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` in a task of its own that a cancellation of the caller does not interrupt.

    A download is cancelled when its client goes away; its query in flight then still ends its transaction and
    hands its connection back to the pool (an interrupted one would be lost), and its result is dropped.
    """
    task = asyncio.ensure_future(coro)
    task.add_done_callback(_retrieved)
    return await asyncio.shield(task)


def _retrieved(task: asyncio.Future[Any]) -> None:
    # Nobody awaits a shielded task whose caller was cancelled: take its exception so none is reported as lost.
    if not task.cancelled():
        task.exception()
