"""`ChunkWriter` cuts a run's byte stream into a store's chunks, hashing, counting and bounding it as it goes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any

from space.exports.limits import Limits
from space.exports.storage.protocol import ChunkSink, ResultKey, ResultStore


@dataclass
class ChunkWriter:
    """Cuts the byte stream into fixed-size chunks, hashing and counting as it goes; enforces the byte limit of
    the run's `limits`.

    Two buffers of one chunk each, allocated once: one is hashed and stored in the background (through the
    store's sink, one connection for the execution) while the other fills, so the read never waits for an
    insert and memory stays at two chunks, whatever the size of the result. `close` stores the rest and waits;
    `discard` waits for the write in flight without storing more.
    """

    store: ResultStore
    key: ResultKey
    chunk_bytes: int
    limits: Limits
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
        if self.total + size > self.limits.bytes:
            raise self.limits.too_large()
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
        """After a failure: wait for the chunk in flight (its error is moot), so no write lands afterwards, and
        abort the sink (an object store's upload must not be completed by the block's end)."""
        if self.pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.pending)
            self.pending = None
        if self.sink is not None:
            with contextlib.suppress(Exception):
                await self.sink.abort()
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
