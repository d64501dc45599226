"""Where result bytes live. The ledger row says which execution is published; the store only keeps chunks.

`ResultStore` is the small interface an object-storage backend could implement; `PgResultStore` keeps the
chunks in `export_chunks`, so "completed" and "the bytes exist" sit in one database. Every operation is
its own short transaction under the org's RLS context: the download never holds a transaction open while
a slow client reads, and a worker's chunk writes never wait on its long read transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from space.db import Tenant, UnitOfWork
from space.exports.models import ExportChunk


@dataclass(frozen=True)
class ResultKey:
    """One execution's bytes: chunks of different executions of the same export never mix."""

    org_id: uuid.UUID
    export_id: uuid.UUID
    execution_id: uuid.UUID


class ResultMissing(Exception):
    """A chunk that the ledger promised is gone (deleted between authorization and streaming)."""


@runtime_checkable
class ResultStore(Protocol):
    """Chunked result storage, addressed by execution."""

    async def write(self, key: ResultKey, seq: int, data: bytes) -> None:
        """Store chunk `seq` (0, 1, 2, ...) of an execution."""
        ...

    async def delete(self, key: ResultKey) -> int:
        """Delete every chunk of an execution; returns how many were removed."""
        ...

    def read(self, key: ResultKey) -> AsyncIterator[bytes]:
        """Yield an execution's chunks in order, one at a time."""
        ...


class PgResultStore:
    """`ResultStore` on the `export_chunks` table (bytea stored uncompressed: the bytes are final)."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker

    def _uow(self, key: ResultKey) -> UnitOfWork:
        return UnitOfWork(self._sessionmaker, Tenant(org_id=key.org_id))

    async def write(self, key: ResultKey, seq: int, data: bytes) -> None:
        """Insert one chunk in its own transaction."""
        async with self._uow(key) as uow:
            await uow.session.execute(
                insert(ExportChunk).values(
                    export_id=key.export_id, execution_id=key.execution_id, seq=seq, org_id=key.org_id, data=data
                )
            )

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
        """Keyset over `seq`: one chunk in memory, one short transaction per chunk."""
        last = -1
        while True:
            async with self._uow(key) as uow:
                row = (
                    await uow.session.execute(
                        select(ExportChunk.seq, ExportChunk.data)
                        .where(
                            ExportChunk.org_id == key.org_id,
                            ExportChunk.export_id == key.export_id,
                            ExportChunk.execution_id == key.execution_id,
                            ExportChunk.seq > last,
                        )
                        .order_by(ExportChunk.seq)
                        .limit(1)
                    )
                ).first()
            if row is None:
                return
            if row.seq != last + 1:
                raise ResultMissing(f"chunk {last + 1} of export {key.export_id} is missing")
            last = row.seq
            yield bytes(row.data)
