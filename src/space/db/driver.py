"""The psycopg connection under a SQLAlchemy session, for the paths that read bytes in binary.

The export read and the chunk store build their statements with SQLAlchemy but run them on the driver
connection itself: text and bytea then arrive as raw bytes, with no hex or decode round trip.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import psycopg
from sqlalchemy import ClauseElement, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession


async def driver_connection(source: AsyncSession | AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under a session (inside its open transaction) or under a pooled connection."""
    connection = await source.connection() if isinstance(source, AsyncSession) else source
    raw = await connection.get_raw_connection()
    # Through the adapter, not the pool's record: a connection detached from its pool (the export read's) has none.
    adapted: Any = raw.dbapi_connection
    return cast(psycopg.AsyncConnection[Any], adapted.driver_connection)


async def read_in_one_trip(
    conn: psycopg.AsyncConnection[Any],
    tenant: psycopg.AsyncCursor[Any],
    tenant_statement: tuple[str, Any],
    cur: psycopg.AsyncCursor[Any],
    query: str,
    params: dict[str, Any],
    *more: tuple[psycopg.AsyncCursor[Any], str, dict[str, Any]],
) -> None:
    """Run `query` on `cur` in a short transaction of its own under the tenant setting: BEGIN, the setting, the
    query and COMMIT in one pipeline with one Sync, one round trip; the rows are then on `cur`. Each of `more` is
    one more (cursor, query, parameters) run after it in the same transaction, its rows on its cursor.

    psycopg opens the transaction itself (the pool's connections are not in autocommit) and the COMMIT is a
    statement of the pipeline. `conn.transaction()` inside a pipeline would nest two more pipelines, each of
    which syncs on entering and leaving: four more round trips for the same statements (docs/decisions 0101).
    A failure rolls the transaction back before it is raised.
    """
    if conn.autocommit:
        raise RuntimeError("read_in_one_trip needs a connection that is not in autocommit")
    try:
        async with conn.pipeline():
            await tenant.execute(*tenant_statement)
            await cur.execute(query, params)
            for other, other_query, other_params in more:
                await other.execute(other_query, other_params)
            await tenant.execute("COMMIT")
    except BaseException:
        # A connection that broke meanwhile (the database went away) is dropped by the pool: its error is raised.
        if not conn.closed:
            with contextlib.suppress(psycopg.Error):
                await conn.rollback()
        raise


def compiled(session: AsyncSession, stmt: ClauseElement) -> tuple[str, dict[str, Any]]:
    """The statement as the driver's SQL and its parameters (none of our types needs a bind processor)."""
    c = stmt.compile(dialect=session.get_bind().dialect)
    return c.string, dict(c.params)


async def server_version(session: AsyncSession) -> int:
    """`server_version_num`, e.g. 150004."""
    return int(await session.scalar(select(func.current_setting("server_version_num"))) or 0)
