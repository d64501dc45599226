"""The psycopg connection under a SQLAlchemy session, for the paths that read bytes in binary.

The export read and the chunk store build their statements with SQLAlchemy but run them on the driver
connection itself: text and bytea then arrive as raw bytes, with no hex or decode round trip.
"""

from __future__ import annotations

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


def compiled(session: AsyncSession, stmt: ClauseElement) -> tuple[str, dict[str, Any]]:
    """The statement as the driver's SQL and its parameters (none of our types needs a bind processor)."""
    c = stmt.compile(dialect=session.get_bind().dialect)
    return c.string, dict(c.params)


async def server_version(session: AsyncSession) -> int:
    """`server_version_num`, e.g. 150004."""
    return int(await session.scalar(select(func.current_setting("server_version_num"))) or 0)
