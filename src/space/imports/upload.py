"""The uploaded archive between the API and the worker (SPEC §23): stored in `import_chunks` (PostgreSQL, like
export results), so that any worker of any host restores what any API host took.

The API spools the body to a local file as it arrives (bounded, never in memory), then `store` copies the file
into 1 MiB pieces in the import's own transaction, and the local file is removed. The worker `fetch`es the pieces into
a local file of its own (zipfile reads a ZIP from its end, so it needs a file to seek in), one piece at a time;
`drop` deletes them when the import ends.
"""

from __future__ import annotations

import os
import tempfile
import uuid

from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncSession

from space.config import Settings
from space.db import driver_connection
from space.imports.models import ImportChunk

PIECE_BYTES = 1024 * 1024
_NEXT = (
    "SELECT seq, data FROM import_chunks WHERE user_id = %(user)s AND import_id = %(import)s AND seq > %(after)s"
    " ORDER BY seq LIMIT 1"
)


def local_dir(settings: Settings) -> str:
    """Where a process keeps its local copy of an upload (made on first use)."""
    path = settings.import_dir or os.path.join(tempfile.gettempdir(), "space-imports")
    os.makedirs(path, exist_ok=True)
    return path


async def store(session: AsyncSession, user_id: uuid.UUID, import_id: uuid.UUID, path: str) -> None:
    """Copy the spooled file into the import's pieces (in the caller's transaction)."""
    # A local file of this host, read a piece at a time between the inserts (as the spool wrote it).
    with os.fdopen(os.open(path, os.O_RDONLY), "rb") as f:
        seq = 0
        while piece := f.read(PIECE_BYTES):
            await session.execute(insert(ImportChunk).values(user_id=user_id, import_id=import_id, seq=seq, data=piece))
            seq += 1


async def fetch(session: AsyncSession, settings: Settings, user_id: uuid.UUID, import_id: uuid.UUID) -> str:
    """The upload as a local file (the caller removes it): its pieces read one at a time, in order."""
    fd, path = tempfile.mkstemp(prefix="import-", suffix=".zip", dir=local_dir(settings))
    try:
        conn = await driver_connection(session)
        # Binary: bytea arrives as its bytes, not as hex text twice their size.
        async with conn.cursor(binary=True) as cur:
            with os.fdopen(fd, "wb") as out:
                seq = -1
                while True:
                    await cur.execute(_NEXT, {"user": user_id, "import": import_id, "after": seq})
                    row = await cur.fetchone()
                    if row is None:
                        return path
                    seq, data = row
                    out.write(data)
                    del row, data
    except BaseException:
        os.remove(path)
        raise


async def drop(session: AsyncSession, user_id: uuid.UUID, import_id: uuid.UUID) -> None:
    """Delete the upload's pieces (the import ended)."""
    await session.execute(delete(ImportChunk).where(ImportChunk.user_id == user_id, ImportChunk.import_id == import_id))
