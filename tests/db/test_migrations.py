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


def test_0015_gives_existing_orgs_their_creator(owner_url: str) -> None:
    # The creator's membership is written in the org's creation transaction (the same now(): here the timestamp
    # the org and the founder share); members added later, an owner included, are not its creator. An org whose
    # creator is gone falls back to its earliest owner.
    with fresh_database(owner_url, "space_creator", revision="0014") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            users = {n: conn.execute(
                "INSERT INTO users (id, email, name) VALUES (gen_random_uuid(), %s, %s) RETURNING id", (f"{n}@x.test", n)
            ).fetchone()[0] for n in ("founder", "heir", "later")}  # type: ignore[index]  # fmt: skip
            orgs = {}
            for name in ("handed", "orphaned", "empty"):
                orgs[name] = conn.execute(
                    "INSERT INTO organizations (id, name, created_at) VALUES (gen_random_uuid(), %s,"
                    " '2026-11-01T10:00:00Z') RETURNING id",
                    (name,),
                ).fetchone()[0]  # type: ignore[index]

            def member(org: str, user: str, role: str, when: str) -> None:
                conn.execute(
                    "INSERT INTO memberships (id, org_id, user_id, role, created_at)"
                    f" SELECT gen_random_uuid(), %s, %s, %s, {when}",
                    (orgs[org], users[user], role),
                )

            # Handed off: the founder is an admin now, the heir (added later) the owner.
            member("handed", "founder", "admin", "'2026-11-01T10:00:00Z'::timestamptz")
            member("handed", "heir", "owner", "now() - interval '1 hour'")
            # The creator was removed: the earliest remaining owner.
            member("orphaned", "later", "member", "now() - interval '2 hours'")
            member("orphaned", "heir", "owner", "now() - interval '1 hour'")
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            rows = dict(conn.execute("SELECT name, created_by FROM organizations").fetchall())  # type: ignore[arg-type]
    assert rows == {"handed": users["founder"], "orphaned": users["heir"], "empty": None}
