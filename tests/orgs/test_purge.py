"""The purge: a due org loses every row, in batches that survive a crash, other orgs untouched; due orgs are found
only through the definer function."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import text

from space.config import Settings
from space.db import Database, UnitOfWork
from space.orgs.jobs import PURGE_TABLES, purge_due, purge_due_job
from tests.helpers import Api, assert_problem
from tests.orgs.fixtures import assert_gone, org_row, request_deletion, seed

# Tables the purge must empty (invitations does not exist yet; the purge skips missing tables).
COUNTED = [t for t in PURGE_TABLES if t != "invitations"]


def counts_of(owner: psycopg.Connection[Any], org_id: str) -> dict[str, int]:
    """Rows of the org per purged table, counted as the owner."""
    out = {}
    for table in COUNTED:
        row = owner.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE org_id = %s").format(sql.Identifier(table)), (org_id,)
        ).fetchone()
        assert row is not None
        out[table] = row[0]
    return out


async def test_purge_removes_every_row_of_the_due_org_only(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    doomed, kept = await api0.org(), await api0.org()
    await seed(api0, db, settings0, doomed)
    await seed(api0, db, settings0, kept)
    project_id = (await api0.call("GET", doomed.path("/projects"), doomed.member)).json()["items"][0]["id"]
    # Counted after the request: it writes the audit trail's org.deletion_requested, which the purge removes too.
    await request_deletion(api0, doomed)
    before, kept_before = counts_of(owner, doomed.id), counts_of(owner, kept.id)
    assert all(n > 0 for n in before.values()), before
    assert all(n > 0 for n in kept_before.values()), kept_before

    results = await purge_due(settings0, db)

    mine = [r for r in results if str(r.org_id) == doomed.id]
    assert len(mine) == 1 and str(kept.id) not in [str(r.org_id) for r in results]
    assert counts_of(owner, doomed.id) == dict.fromkeys(COUNTED, 0)
    assert counts_of(owner, kept.id) == kept_before
    row = org_row(owner, doomed.id)
    assert row["state"] == "deleted" and row["deleted_at"] is not None
    assert row["purged_counts"] == before == mine[0].counts
    assert row["name"] == ""
    assert org_row(owner, kept.id)["state"] == "active"
    await assert_gone(api0, doomed, project_id)
    # The second org still works as before.
    assert (await api0.call("GET", kept.path("/projects"), kept.member)).status_code == 200
    # A second run finds nothing more to do for it.
    assert doomed.id not in [str(r.org_id) for r in await purge_due(settings0, db)]


async def test_purge_interrupted_between_batches_resumes(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await seed(api0, db, settings0, org)
    await request_deletion(api0, org)
    before = counts_of(owner, org.id)
    batches: list[tuple[str, int]] = []

    class Crash(Exception):
        pass

    async def crash_after_first(org_id: uuid.UUID, table: str, n: int) -> None:
        if str(org_id) == org.id:
            batches.append((table, n))
            raise Crash()

    # A crash after the first committed batch: the run stops, that batch stays done and counted.
    results = await purge_due(settings0, db, batch_rows=2, after_batch=crash_after_first)
    assert org.id not in [str(r.org_id) for r in results]
    assert batches == [("export_chunks", 2)]
    during = counts_of(owner, org.id)
    assert during["export_chunks"] == before["export_chunks"] - 2
    assert {k: v for k, v in during.items() if k != "export_chunks"} == {
        k: v for k, v in before.items() if k != "export_chunks"
    }
    row = org_row(owner, org.id)
    assert row["state"] == "deleting"
    assert row["purged_counts"]["export_chunks"] == 2
    # Once rows are gone the owner can't go back, and the org still refuses writes.
    assert_problem(await api0.call("DELETE", org.path("/deletion"), org.owner), 409, "invalid_transition")
    assert_problem(await api0.call("POST", org.path("/projects"), org.member, json={"name": "x"}), 409, "org_deleting")

    # The next run picks it up again and finishes in small batches; the counts add up across both runs.
    seen: list[tuple[str, int]] = []

    async def record(org_id: uuid.UUID, table: str, n: int) -> None:
        if str(org_id) == org.id:
            seen.append((table, n))

    results = await purge_due(settings0, db, batch_rows=2, after_batch=record)
    assert org.id in [str(r.org_id) for r in results]
    assert all(n <= 2 for _, n in seen) and len(seen) > len(COUNTED)
    assert counts_of(owner, org.id) == dict.fromkeys(COUNTED, 0)
    row = org_row(owner, org.id)
    assert row["state"] == "deleted" and row["purged_counts"] == before


async def test_purge_leaves_orgs_that_are_not_due(
    api: Api, api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    grace = await api.org()  # deleting, with the default 7-day grace period
    await seed(api, db, settings0, grace, projects=1, tickets=1)
    await request_deletion(api, grace)
    cancelled = await api.org()
    await request_deletion(api, cancelled)
    assert (await api.call("DELETE", cancelled.path("/deletion"), cancelled.owner)).status_code == 200
    suspended = await api0.org()
    assert (await api0.call("POST", suspended.path("/suspend"), suspended.owner)).status_code == 200
    counted = {o.id: counts_of(owner, o.id) for o in (grace, cancelled, suspended)}

    results = await purge_due(settings0, db)

    purged = {str(r.org_id) for r in results}
    for org in (grace, cancelled, suspended):
        assert org.id not in purged
        assert counts_of(owner, org.id) == counted[org.id]
        assert org_row(owner, org.id)["purged_counts"] is None
    assert org_row(owner, grace.id)["state"] == "deleting"
    assert (await api.call("GET", grace.path("/projects"), grace.member)).status_code == 200


async def test_purge_job_entry_point(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await seed(api0, db, settings0, org, projects=1, tickets=1)
    await request_deletion(api0, org)
    before = counts_of(owner, org.id)
    out = await purge_due_job({"settings": settings0, "db": db})
    entry = next(p for p in out["purged"] if p["orgId"] == org.id)
    assert entry["counts"] == before
    assert org_row(owner, org.id)["state"] == "deleted"


async def test_due_orgs_are_found_only_through_the_definer_function(
    api0: Api, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await request_deletion(api0, org)
    async with UnitOfWork(db.sessionmaker) as uow:
        # The app role, with no tenant context, sees no organization at all...
        assert (await uow.session.execute(text("SELECT count(*) FROM organizations"))).scalar_one() == 0
        # ...but the maintenance function hands it the ids of due orgs, and nothing else.
        ids = {str(i) for i in (await uow.session.execute(text("SELECT space_maintenance_due_purges(1000)"))).scalars()}
    assert org.id in ids
    row = owner.execute(
        "SELECT p.prosecdef, p.proconfig, pg_get_userbyid(p.proowner),"
        " has_function_privilege('space_app', p.oid, 'EXECUTE'), has_function_privilege('public', p.oid, 'EXECUTE')"
        " FROM pg_proc p WHERE p.proname = 'space_maintenance_due_purges'"
    ).fetchone()
    assert row is not None
    secdef, config, fn_owner, app_may, public_may = row
    assert secdef and "search_path=public, pg_temp" in config
    assert fn_owner != "space_app" and app_may and not public_may
    # The purge deletes as the app role under RLS; it never got ownership or BYPASSRLS for it.
    assert owner.execute("SELECT rolbypassrls FROM pg_roles WHERE rolname = 'space_app'").fetchone() == (False,)


def test_purge_tables_are_every_table_with_an_org_id(owner: psycopg.Connection[Any]) -> None:
    """A new tenant table can't be forgotten by the purge: PURGE_TABLES names every table of the migrated
    database that has an org_id column, and nothing else."""
    tables = {
        name
        for (name,) in owner.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
        )
    }
    with_org_id = {
        name
        for (name,) in owner.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')"
            " AND a.attname = 'org_id' AND a.attnum > 0 AND NOT a.attisdropped"
        )
    }
    # invitations is listed before its table exists (the purge skips missing tables); no other name may be missing.
    assert set(PURGE_TABLES) - tables <= {"invitations"}, set(PURGE_TABLES) - tables
    assert {t for t in PURGE_TABLES if t in tables} == with_org_id
    # COUNTED, what the purge tests count, is the same set (when invitations gets its table, COUNTED takes it in).
    assert set(COUNTED) == with_org_id
