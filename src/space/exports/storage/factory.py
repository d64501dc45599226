"""`open_result_store`: the store `SPACE_RESULT_STORE` names, for the API, the worker and the CLI alike."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from space.config import Settings
from space.db import Database
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultStore


@contextlib.asynccontextmanager
async def open_result_store(settings: Settings, db: Database) -> AsyncIterator[ResultStore]:
    """The store `SPACE_RESULT_STORE` names, on the app role's database, closed at the end of the block."""
    store: ResultStore
    if settings.result_store.startswith("s3://"):
        # Imported here: the embedded default needs no S3 client loaded.
        from space.exports.storage.s3 import S3Location, S3ResultStore

        store = S3ResultStore(db, S3Location.parse(settings.result_store), redirect=settings.result_redirect)
    else:
        store = PgResultStore(db)
    try:
        yield store
    finally:
        await store.aclose()
