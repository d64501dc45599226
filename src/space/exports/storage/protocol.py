"""The interface of a result store: chunked bytes addressed by execution, and what a store may add to it.

Every operation of a store is its own short transaction (or request): the download never holds a transaction open
while a slow client reads, and a worker's chunk writes never wait on its long read transaction.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

READ_PIECE_BYTES = 128 * 1024
"""A download hands the server its bytes in pieces of at most this size (rows of a part in `PgResultStore.read`,
reads of the object's body in `S3ResultStore.read`)."""


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

    async def abort(self) -> None:
        """The run failed: what was written must never become a result (the block's end then keeps nothing)."""
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

    def chunk_bytes(self, configured: int) -> int:
        """The size of the chunks the worker cuts for this store, given `SPACE_EXPORT_CHUNK_BYTES`."""
        ...

    async def delete(self, key: ResultKey) -> int:
        """Delete every chunk of an execution; returns how many were removed."""
        ...

    def read(self, key: ResultKey, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Yield bytes `start` to `end` (exclusive; None: the last stored byte) of an execution, in order, a
        bounded part at a time, each read only when the consumer asks for more. A missing chunk before `end`
        raises ResultMissing."""
        ...

    async def delete_org(self, org_id: uuid.UUID) -> int:
        """The purge: delete every stored result of the org; returns how many were removed."""
        ...

    async def sweep(self, limit: int = 500) -> dict[str, int]:
        """The cleanup: delete stored bytes that no running or kept completed execution owns; counts by kind."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections (end of the process)."""
        ...


@runtime_checkable
class Redirecting(Protocol):
    """A store whose results a client fetches itself, from a short-lived URL (SPEC §15's 303)."""

    redirect: bool

    async def presign(self, key: ResultKey, *, filename: str, media_type: str) -> str:
        """A URL that GETs the execution's bytes for a short while, with these response headers."""
        ...


@dataclass
class Opening:
    """The first part of a read of bytes `start` to `end`, as one statement that another round trip can carry (the
    authorization's: `exports.access`), and its rows once it ran. Only the read it was made for uses them; any
    other read, or one whose first part turned out different, reads its own."""

    key: ResultKey
    start: int
    end: int
    statement: str
    params: dict[str, Any]
    rows: list[tuple[Any, ...]] | None = None


@runtime_checkable
class Opens(Protocol):
    """A store whose reads can begin with rows fetched beforehand (`Opening`)."""

    def opening(self, key: ResultKey, start: int, end: int) -> Opening | None:
        """The first part of `read(key, start, end)` as a statement, when it is known without asking the database
        (else None)."""
        ...

    def read(
        self, key: ResultKey, start: int = 0, end: int | None = None, opened: Opening | None = None
    ) -> AsyncIterator[bytes]:
        """`ResultStore.read`, beginning with the rows of `opened` when they are its first part."""
        ...


def opens(store: object) -> TypeGuard[Opens]:
    """`isinstance(store, Opens)`, answered once per store class: a runtime protocol's check walks its members
    (about 5 µs), and a link's every range asks. The class's methods decide (Opens has no data members), so a
    store that gained `opening` on an instance only would not count."""
    cls = type(store)
    known = _OPENS.get(cls)
    if known is None:
        known = _OPENS[cls] = issubclass(cls, Opens)
    return known


_OPENS: dict[type, bool] = {}
