"""PostgreSQL's `pg_snapshot` as a column type (an incremental run's recorded snapshot, migration 0021)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.types import UserDefinedType


class PgSnapshot(UserDefinedType[str]):
    """`pg_snapshot`, as its text form on the Python side."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        """The column's SQL type."""
        return "pg_snapshot"
