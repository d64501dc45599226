"""Reads of one round trip on connections of their own: the hot path of every download and status GET.

SPEC §6's authorization (`exports.access`) and a download's parts (`storage.PgResultStore`) each read in one short
transaction under the org's tenant setting, and nothing else. On a connection in autocommit, the statements of one
pipeline up to its Sync are one implicit transaction (PostgreSQL's extended protocol): the tenant setting
(`set_config(..., true)`, transaction-local), the statements, then the Sync commits and the setting is gone. One
round trip, no BEGIN and no COMMIT to send.

The connections are plain psycopg ones, kept here rather than in SQLAlchemy's pool: its checkout, check-in and
reset and the explicit transaction were two thirds of such a trip's CPU in the API (0.40 ms; 0.13 ms here,
decision 0105). This pool is small on purpose and opens its connections as they are asked for, the way
SQLAlchemy's does: a database that can't be reached fails the request at once (503 `unavailable`), where a pool
that reconnects in the background would hold it until its timeout. At most `size` trips run at once; a trip that
finds none free waits up to `timeout` seconds (then 503 too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
from collections.abc import AsyncIterator, Mapping
from typing import Any, NamedTuple

import psycopg
import psycopg.conninfo
from psycopg.pq import TransactionStatus
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from space.db.uow import Tenant, tenant_statement


@functools.cache
def _dialect() -> PGDialect_psycopg:
    """The driver's dialect, made once when first asked: `uow.set_tenant`'s statement in psycopg's own style."""
    return PGDialect_psycopg()  # type: ignore[no-untyped-call]


class Read(NamedTuple):
    """One statement of a trip: its SQL (psycopg's `%(name)s` parameters), parameters, and whether its rows come in
    binary (bytea as its bytes, not as hex text twice their size)."""

    sql: str
    params: Mapping[str, Any]
    binary: bool = False


class TripTimeout(Exception):
    """Every connection of the pool was busy for the whole timeout: answered 503 `unavailable`, as a timeout of
    SQLAlchemy's pool is (`problems`)."""


def socket_open(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection may be used, as its socket says, with no round trip: an idle connection has
    nothing to read, so anything readable (a server that restarted, shut down or ended the session says so and
    closes the socket) means it may not. A peer gone without a word (a network cut) is not seen here: that
    connection's first statement fails (503 `unavailable`), and it is dropped."""
    if conn.closed:
        return False
    # poll, not select: a busy process's descriptors pass select's limit (1024), which would fail every check.
    poller = select.poll()
    try:
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.OperationalError):
        return False


class OneTripReads:
    """At most `size` autocommit connections for reads of one round trip (`read`), opened as needed."""

    def __init__(self, conninfo: str, *, size: int, timeout: float, **connect_args: str) -> None:
        self._conninfo = psycopg.conninfo.make_conninfo(conninfo, **connect_args)
        self._timeout = timeout
        self._free = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._generation = 0
        """Bumped by `close`: a connection handed out before is closed when it comes back, not kept."""

    async def read(self, tenant: Tenant, first: Read, *more: Read) -> list[list[tuple[Any, ...]]]:
        """Each statement's rows, all run in one transaction under `tenant` (one pipeline, one Sync). A failure
        rolls that transaction back and is raised; the connection it happened on is dropped."""
        reads = (first, *more)
        setting = tenant_statement(_dialect(), tenant)
        async with self.connection() as conn:
            cursors = [conn.cursor(binary=r.binary) for r in reads]
            async with conn.pipeline():
                # On the first statement's cursor: a cursor keeps the rows of its last statement only.
                await cursors[0].execute(*setting)
                for cur, r in zip(cursors, reads, strict=True):
                    await cur.execute(r.sql, r.params)
            return [await cur.fetchall() for cur in cursors]

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One of the pool's connections (in autocommit), for one trip; TripTimeout when none is free in time.

        A trip cancelled while its statements run (a client gone during its authorization) holds its place until
        psycopg has asked the server to cancel them (at most a few seconds), then its connection is closed.
        """
        try:
            async with asyncio.timeout(self._timeout):
                await self._free.acquire()
        except TimeoutError:
            raise TripTimeout(f"no connection free for a read within {self._timeout} s") from None
        conn: psycopg.AsyncConnection[Any] | None = None
        generation = self._generation
        try:
            while self._idle and conn is None:
                candidate = self._idle.pop()
                if socket_open(candidate):
                    conn = candidate
                else:
                    await candidate.close()
            if conn is None:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            yield conn
        except BaseException:
            # Whatever broke the trip (a failed statement, a cancellation midway) may have left the connection
            # with results unread or the server gone: it is not handed out again.
            if conn is not None:
                await conn.close()
                conn = None
            raise
        finally:
            if conn is not None:
                if generation != self._generation or conn.info.transaction_status != TransactionStatus.IDLE:
                    await conn.close()
                else:
                    self._idle.append(conn)
            self._free.release()

    async def close(self) -> None:
        """Close the idle connections; one in use is closed when its trip ends. Reads after it open new ones (as
        a disposed SQLAlchemy engine does)."""
        self._generation += 1
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()
