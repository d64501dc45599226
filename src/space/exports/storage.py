"""Where result bytes live. The ledger row says which execution is published; the store only keeps chunks.

`ChunkWriter` cuts a run's byte stream into the store's chunks (hashing, counting and bounding it as it goes).

`ResultStore` is the small interface an object-storage backend could implement; `PgResultStore` keeps the
chunks in `export_chunks`, so "completed" and "the bytes exist" sit in one database. Every operation is
its own short transaction under the org's RLS context: the download never holds a transaction open while
a slow client reads, and a worker's chunk writes never wait on its long read transaction.

Memory: libpq keeps a connection's buffers at the size of the largest message it ever carried, and pooled
connections live on. So a chunk never travels as one message on a pooled connection: the worker writes an
execution's chunks on a connection of their own, dropped afterwards, and a download reads each chunk as
1 MiB rows. The worker's and the API's memory stays the same however many chunks have passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import delete, insert, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from space.db import Tenant, UnitOfWork, driver_connection, set_tenant
from space.exports.failures import ExportFailure
from space.exports.models import ExportChunk

READ_PART_BYTES = 1024 * 1024
"""A stored chunk comes back to a download in rows of at most this many bytes."""


@dataclass(frozen=True)
class ResultKey:
    """One execution's bytes: chunks of different executions of the same export never mix."""

    org_id: uuid.UUID
    export_id: uuid.UUID
    execution_id: uuid.UUID


class ResultMissing(Exception):
    """A chunk that the ledger promised is gone (deleted between authorization and streaming)."""


class ChunkSink(Protocol):
    """Writes the chunks of one execution, in order."""

    async def write(self, seq: int, data: bytes | memoryview) -> None:
        """Store chunk `seq` (0, 1, 2, ...)."""
        ...


@runtime_checkable
class ResultStore(Protocol):
    """Chunked result storage, addressed by execution."""

    async def write(self, key: ResultKey, seq: int, data: bytes | memoryview) -> None:
        """Store chunk `seq` (0, 1, 2, ...) of an execution."""
        ...

    def sink(self, key: ResultKey) -> contextlib.AbstractAsyncContextManager[ChunkSink]:
        """A writer for many chunks of one execution (what the worker uses)."""
        ...

    async def delete(self, key: ResultKey) -> int:
        """Delete every chunk of an execution; returns how many were removed."""
        ...

    def read(self, key: ResultKey) -> AsyncIterator[bytes]:
        """Yield an execution's bytes in order, a bounded piece at a time."""
        ...


# Asynchronous commit: a chunk only matters once its export is published, and the publish commits
# synchronously, which flushes the WAL up to it, these earlier inserts included. A crash before that loses an
# unpublished execution's chunks, which nobody can read anyway.
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")

# Chunk :seq as rows of :part bytes. `data || ''` detoasts (and decompresses) the value once; the substrings
# then cut that copy. An empty chunk is one empty row. The lookup is by the whole primary key: never a plan
# that would detoast other chunks first. The parts are put in order here (an ORDER BY would sort megabytes).
_READ_CHUNK = """
SELECT o, substring(c.d FROM o FOR %(part)s)
FROM (SELECT data || ''::bytea AS d FROM export_chunks
      WHERE export_id = %(export)s AND execution_id = %(execution)s AND seq = %(seq)s AND org_id = %(org)s
      OFFSET 0) AS c,
     generate_series(1, greatest(length(c.d), 1), %(part)s) AS o
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

    async def write(self, seq: int, data: bytes | memoryview) -> None:
        """Insert one chunk."""
        key = self._key
        async with self._conn.begin():
            await set_tenant(self._conn, Tenant(org_id=key.org_id))
            await self._conn.execute(_ASYNC_COMMIT)
            await self._conn.execute(
                insert(ExportChunk).values(
                    export_id=key.export_id, execution_id=key.execution_id, seq=seq, org_id=key.org_id, data=data
                )
            )


class PgResultStore:
    """`ResultStore` on the `export_chunks` table (bytea, lz4-compressed by PostgreSQL when it can: see 0004)."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], *, part_bytes: int = READ_PART_BYTES) -> None:
        self._sessionmaker = sessionmaker
        self._part_bytes = part_bytes

    def _uow(self, key: ResultKey) -> UnitOfWork:
        return UnitOfWork(self._sessionmaker, Tenant(org_id=key.org_id))

    async def write(self, key: ResultKey, seq: int, data: bytes | memoryview) -> None:
        """Insert one chunk in its own transaction."""
        async with self._uow(key) as uow:
            await uow.session.execute(_ASYNC_COMMIT)
            await uow.session.execute(
                insert(ExportChunk).values(
                    export_id=key.export_id, execution_id=key.execution_id, seq=seq, org_id=key.org_id, data=data
                )
            )

    @contextlib.asynccontextmanager
    async def sink(self, key: ResultKey) -> AsyncIterator[ChunkSink]:
        """Chunk writes on a connection of their own, closed at the end (its buffer grew to a chunk)."""
        engine: AsyncEngine = self._sessionmaker.kw["bind"]
        async with engine.connect() as conn:
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

    async def read(self, key: ResultKey) -> AsyncIterator[bytes]:
        """Chunk after chunk (0, 1, 2, ...), each in its own short transaction, the next one read while this
        one is sent: two chunks in memory at most."""
        ahead = asyncio.create_task(self._chunk(key, 0))
        try:
            seq = 0
            while parts := await ahead:
                seq += 1
                ahead = asyncio.create_task(self._chunk(key, seq))
                for part in parts:
                    yield part
        finally:
            if not ahead.done():
                ahead.cancel()
                with contextlib.suppress(BaseException):
                    await ahead

    async def _chunk(self, key: ResultKey, seq: int) -> list[bytes]:
        """Chunk `seq` as parts; [] after the last one. A gap (a later chunk exists) is ResultMissing."""
        params = {
            "org": key.org_id,
            "export": key.export_id,
            "execution": key.execution_id,
            "part": self._part_bytes,
            "seq": seq,
        }
        async with self._uow(key) as uow:
            conn = await driver_connection(uow.session)
            # Binary: the bytes come as they are stored, not as hex text twice their size.
            async with conn.cursor(binary=True) as cur:
                await cur.execute(_READ_CHUNK, params)
                rows = await cur.fetchall()
                if not rows:
                    await cur.execute(_LATER_CHUNK, params)
                    if await cur.fetchone() is not None:
                        raise ResultMissing(f"chunk {seq} of export {key.export_id} is missing")
        rows.sort(key=lambda row: int(row[0]))
        return [part for _, part in rows]


@dataclass
class ChunkWriter:
    """Cuts the byte stream into fixed-size chunks, hashing and counting as it goes; enforces the byte limit.

    Two buffers of one chunk each, allocated once: one is hashed and stored in the background (through the
    store's sink, one connection for the execution) while the other fills, so the read never waits for an
    insert and memory stays at two chunks, whatever the size of the result. `close` stores the rest and waits;
    `discard` waits for the write in flight without storing more.
    """

    store: ResultStore
    key: ResultKey
    chunk_bytes: int
    byte_limit: int
    total: int = 0
    seq: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    filled: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    spare: bytearray = field(default_factory=bytearray)
    pending: asyncio.Task[None] | None = None
    sink: ChunkSink | None = None
    exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def sha256(self) -> str:
        """The hex digest of every byte written so far."""
        return str(self.digest.hexdigest())

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes; store every full chunk."""
        size = len(data)
        if self.total + size > self.byte_limit:
            raise ExportFailure("too_large", f"The result exceeds {self.byte_limit} bytes.")
        self.total += size
        view = memoryview(data).cast("B")
        while view:
            if not self.buffer:
                self.buffer = bytearray(self.chunk_bytes)
            n = min(len(view), self.chunk_bytes - self.filled)
            self.buffer[self.filled : self.filled + n] = view[:n]
            self.filled += n
            view = view[n:]
            if self.filled == self.chunk_bytes:
                await self._put()

    async def close(self) -> None:
        """Store the last partial chunk and wait until every chunk is stored."""
        if self.filled or self.seq == 0:
            await self._put()
        await self._settle()
        await self.exits.aclose()
        self.buffer = self.spare = bytearray()

    async def discard(self) -> None:
        """After a failure: wait for the chunk in flight (its error is moot), so no write lands afterwards."""
        if self.pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.pending)
            self.pending = None
        with contextlib.suppress(Exception):
            await self.exits.aclose()
        self.buffer = self.spare = bytearray()

    async def _settle(self) -> None:
        if self.pending is not None:
            task, self.pending = self.pending, None
            await task

    async def _store(self, sink: ChunkSink, seq: int, data: memoryview) -> None:
        # Chunks are hashed in order (one in flight at a time), in a thread: hashlib lets go of the GIL, so the
        # event loop (the read, and in `space up` the API) runs meanwhile.
        await asyncio.gather(asyncio.to_thread(self.digest.update, data), sink.write(seq, data))

    async def _put(self) -> None:
        # The spare buffer is free once the write in flight (which reads it) has finished.
        await self._settle()
        if self.sink is None:
            self.sink = await self.exits.enter_async_context(self.store.sink(self.key))
        data = memoryview(self.buffer)[: self.filled]
        self.pending = asyncio.create_task(self._store(self.sink, self.seq, data), name="export-chunk")
        self.seq += 1
        self.buffer, self.spare, self.filled = self.spare, self.buffer, 0
