"""What every export kind's format shares: the batch it yields, the protocol it follows, the request it is made
from, and the pace of its keyset pages.

A format counts its rows and reads them as finished bytes, in keyset batches, inside the export's snapshot
transaction. Batches are bounded twice: by rows (`SPACE_EXPORT_BATCH_ROWS`) and by bytes
(`SPACE_EXPORT_BATCH_BYTES`). The byte budget is cut in SQL, by a running sum of each row's width over the keyset
page: a batch keeps its rows while the bytes before them are under the budget, so it holds at least one row and
passes the budget by less than its last row, and the next batch continues after the last row kept. Rows are user
text of any width (within the field limits), so a batch's memory, and the largest message the connection
carries, is bounded in bytes whatever the rows are like. `Pace` keeps the page's LIMIT near the cut, so the
database reads few rows past it.

Batches are read on the snapshot connection itself with psycopg, in binary (text arrives as raw UTF-8 bytes, no
hex, no decode/encode round trip). The statements are still built with SQLAlchemy from the one ticket filter
builder. Every query carries `org_id = :org` beside the RLS policy, which still applies.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import BigInteger, ColumnElement, bindparam
from sqlalchemy import cast as sql_cast
from sqlalchemy.ext.asyncio import AsyncSession

from space.exports.models import ExportScope
from space.schemas import Input

BATCH_BYTES = 2 * 1024 * 1024
"""The byte budget of a batch when the caller names none (the default of SPACE_EXPORT_BATCH_BYTES)."""


@dataclass(frozen=True)
class Batch:
    """One keyset batch, already formatted: `rows` records in `data`, ending at key `last`."""

    rows: int
    last: Any
    data: bytes | bytearray | memoryview


class Format(Protocol):
    """An output format: counts its rows (per file: an archive's limit counts each member file on its own), then
    reads header, batches in stable order, footer."""

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """Rows the export will contain, per file of its result (inside the read transaction)."""
        ...

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """Bytes before the first record; `snapshot_at` is the moment the read's snapshot stands for."""
        ...

    def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """Records in stable order, keyset-paginated, at most `size` rows and about `budget` bytes at a time."""
        ...

    def footer(self) -> bytes:
        """Bytes after the last record."""
        ...


class ExportRequest(Input, tag_field="kind"):
    """The body that creates an export: each kind's request is a subclass tagged with the kind's name, and the
    create route takes the union of them all (the registry's)."""

    def ledger_filters(self) -> dict[str, Any]:
        """The filters the export's row keeps (none: the kind reads what the scope allows, unfiltered)."""
        return {}

    def ledger_delimiter(self) -> str:
        """The CSV delimiter the export's row keeps."""
        return ","


class Order(Protocol):
    """What a format is opened from: the export's fixed inputs as the worker's lease holds them."""

    @property
    def org_id(self) -> uuid.UUID: ...

    @property
    def creator_id(self) -> uuid.UUID: ...

    @property
    def scope(self) -> ExportScope: ...

    @property
    def filters(self) -> dict[str, Any]: ...

    @property
    def delimiter(self) -> str: ...

    @property
    def since(self) -> Any:
        """An incremental run's start (`space.exports.increments.Since`), or None: the run is complete."""
        ...


Opener = Callable[[AsyncSession, Order, uuid.UUID], Awaitable[Format]]
"""How the worker opens a kind's format: in the snapshot transaction, from the export's inputs and the creator's
membership id (re-checked just before)."""


def bigint_param(name: str) -> ColumnElement[int]:
    """A bound integer parameter sent as bigint."""
    # Cast: psycopg sends a Python int as the smallest type that holds it, so one statement would be
    # prepared once per type.
    return sql_cast(bindparam(name), BigInteger)


class Pace:
    """The next keyset page's LIMIT: `size` rows, fewer once the rows are known to be wide.

    The budget itself is cut in SQL; the page's rows after the cut are read and dropped by the database. So the
    limit follows the width of the last batch: just over the rows that fit the budget at that width.
    """

    def __init__(self, size: int, budget: int) -> None:
        self.size = size
        self.budget = budget
        self.limit = size

    def saw(self, rows: int, width: int) -> None:
        """The last batch held `rows` rows of `width` bytes in all."""
        if rows > 0:
            per_row = max(1, -(-width // rows))
            self.limit = max(1, min(self.size, -(-self.budget // per_row) + 1))


def rfc3339(t: dt.datetime) -> str:
    """RFC 3339 in UTC with microseconds, always six digits (as the CSV's stored timestamps are written)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
