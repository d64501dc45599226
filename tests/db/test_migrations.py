"""Migrations: the whole chain down and up again, and the revision that adds the purge's definer function."""

from __future__ import annotations

import psycopg

from space.db.migrate import downgrade, upgrade
from tests.helpers import fresh_database


def test_migrations_round_trip(owner_url: str) -> None:
    with fresh_database(owner_url, "space_rt", migrate=False) as url:
        upgrade(url)
        downgrade(url, "base")
        upgrade(url)
        downgrade(url, "0001")
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regproc('space_maintenance_due_purges')").fetchone() == (None,)
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regproc('space_maintenance_due_purges')").fetchone() != (None,)
            grant = "SELECT has_table_privilege('space_app', 'ticket_counters', 'DELETE')"
            assert conn.execute(grant).fetchone() == (True,)
