"""`space migrate` as an ordinary owner (managed PostgreSQL: CREATEDB, CREATEROLE, owns the database, no
superuser, no BYPASSRLS), after which the cleanup, the reconciler and the purge still find their rows (SPEC §14)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql
from sqlalchemy import make_url, text

from space.app import create_app
from space.config import Settings, load_settings
from space.db import Database, Tenant, UnitOfWork, queue_conninfo
from space.db.migrate import downgrade, scripts
from space.exports.maintenance import cleanup, reconcile
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultKey
from space.orgs.jobs import due_org_ids, purge_due
from space.queue import open_queue
from tests.exports.fixtures import (
    add_tickets,
    chunk_count,
    create_export,
    insert_export,
    job_row,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api, Org, UserFactory, app_database, fresh_database


@contextlib.contextmanager
def _ordinary_database(owner_url: str, prefix: str) -> Iterator[str]:
    """A database owned by a new ordinary role, migrated by that role; both dropped at the end."""
    role = f"space_owner_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE NOSUPERUSER NOBYPASSRLS").format(sql.Identifier(role))
        )
    try:
        with fresh_database(owner_url, prefix, owner=role) as url:
            yield url
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def ordinary_url(owner_url: str) -> Iterator[str]:
    """A database owned by a new ordinary role, migrated by that role."""
    with _ordinary_database(owner_url, "space_ord") as url:
        yield url


@contextlib.asynccontextmanager
async def _app(settings: Settings) -> AsyncIterator[tuple[Api, Database]]:
    assert settings.database_url
    async with (
        app_database(settings.database_url, "space-tests-ordinary") as db,
        AsyncTestClient(app=create_app(settings)) as client,
    ):
        yield Api(client, UserFactory(db)), db


async def _app_role_rows(db: Database, query: str) -> list[Any]:
    async with UnitOfWork(db.sessionmaker) as uow:
        return list((await uow.session.execute(text(query))).all())


async def _drop_queue_entry(url: str, key: str) -> None:
    async with await psycopg.AsyncConnection.connect(queue_conninfo(url), autocommit=True) as conn:
        await conn.execute("DELETE FROM saq_jobs WHERE key = %s", (key,))


def test_the_owner_is_ordinary(ordinary_url: str) -> None:
    with psycopg.connect(ordinary_url) as conn:
        row = conn.execute(
            "SELECT r.rolsuper, r.rolbypassrls, d.datdba = r.oid FROM pg_roles r, pg_database d"
            " WHERE r.rolname = current_user AND d.datname = current_database()"
        ).fetchone()
        assert row == (False, False, True)
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (scripts().get_current_head(),)
        # FORCE RLS applies to it: with no policy of its own it would see no export at all.
        policies = conn.execute(
            "SELECT tablename, policyname FROM pg_policies WHERE roles = ARRAY[current_user]::name[] ORDER BY 1, 2"
        ).fetchall()
    assert ("export_chunks", "maintenance_chunks") in policies and ("export_jobs", "maintenance_exports") in policies


async def test_cleanup_reconciler_and_purge_find_rows_of_every_org(ordinary_url: str) -> None:
    settings = load_settings({}, database_url=ordinary_url, deletion_grace_seconds=0)
    async with _app(settings) as (api, db):
        results = PgResultStore(db)
        orgs: list[Org] = [await api.org("Acme"), await api.org("Acme")]
        queued: dict[str, str] = {}
        expired: dict[str, str] = {}
        orphans: dict[str, tuple[str, uuid.UUID]] = {}
        for org in orgs:
            await add_tickets(db, org.id, org.member, ["one", "two"])
            # Queued, but its queue entry was lost: the reconciler's business.
            lost = await create_export(api, org, org.owner, {"kind": "snapshot"})
            await _drop_queue_entry(ordinary_url, lost["id"])
            queued[org.id] = lost["id"]
            # Completed with a result already past its expiry: the cleanup's.
            short = await create_export(api, org, org.member, {"kind": "tickets_csv"})
            ttl = tuned(settings, export_ttl_seconds=0.001)
            assert await _run(ttl, db, org, short["id"]) == "completed"
            expired[org.id] = short["id"]
            # Chunks of an execution that never published: the cleanup's orphans.
            kept = await create_export(api, org, org.admin, {"kind": "tickets_csv"})
            assert await _run(settings, db, org, kept["id"]) == "completed"
            stale = uuid.uuid4()
            await results.write(ResultKey(uid(org.id), uid(kept["id"]), stale), 0, b"stale bytes")
            orphans[org.id] = (kept["id"], stale)

        # The three SECURITY DEFINER functions run as the ordinary owner, under FORCE RLS: they list both orgs.
        candidates = await _app_role_rows(db, "SELECT * FROM space_exports_reconcile_candidates(1000)")
        assert {(str(r.export_org_id), str(r.export_id)) for r in candidates} >= set(queued.items())
        found = await _app_role_rows(db, "SELECT * FROM space_exports_expired_results(1000)")
        assert {(str(r.export_org_id), str(r.export_id)) for r in found} == set(expired.items())
        lost_chunks = await _app_role_rows(db, "SELECT * FROM space_exports_orphan_executions(1000)")
        assert {(str(r.export_org_id), (str(r.export_id), r.chunk_execution_id)) for r in lost_chunks} == set(
            orphans.items()
        )

        # The real jobs act on what the functions found.
        report = await cleanup(db, results)
        assert (report["purged"], report["orphan_executions"], report["orphan_chunks"]) == (2, 2, 2), report
        for org in orgs:
            assert (await job_row(db, org.id, expired[org.id])).purged_at is not None
            assert await chunk_count(db, org.id, expired[org.id]) == 0
            assert await chunk_count(db, org.id, orphans[org.id][0]) == 1  # the published chunk stays
        queue = await open_queue(settings, db, application_name="space-tests-ordinary-queue")
        await queue.connect()
        try:
            assert await reconcile(settings, db, queue) == {"requeued": 2, "failed": 0}
            for export_id in queued.values():
                entry = await queue.job(export_id)
                assert entry is not None and entry.status == "queued"
        finally:
            await queue.disconnect()

        # The purge's due-orgs function, and the purge itself.
        for org in orgs:
            r = await api.call(
                "POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", "skipFinalExport": True}
            )
            assert r.status_code == 202, r.text
        assert {str(i) for i in await due_org_ids(db)} == {org.id for org in orgs}
        purged = await purge_due(settings, db)
        assert {str(p.org_id) for p in purged} == {org.id for org in orgs}
        for org in orgs:
            async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
                state = await uow.session.scalar(text("SELECT state FROM organizations WHERE id = :id"), {"id": org.id})
            assert state == "deleted"


async def _run(settings: Settings, db: Database, org: Org, export_id: str) -> str:
    from space.exports.pipeline import run_export

    return await run_export(runner(settings, db), uid(export_id), uid(org.id))


async def test_downgrade_from_packed_chunks_purges_their_results_as_an_ordinary_owner(owner_url: str) -> None:
    """0013's downgrade, run by an ordinary owner: the exports whose result is packed read as purged and their
    chunks are gone (0012 would serve a frame as it is stored); a plain result is kept. Under forced RLS the
    owner saw those rows but its UPDATE and DELETE matched none, until the downgrade lifted the force."""
    with _ordinary_database(owner_url, "space_ord_down") as url:
        settings = load_settings({}, database_url=url)
        async with _app(settings) as (api, db):
            org = await api.org()
            await add_tickets(db, org.id, org.member, ["the same words again"] * 300)
            export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
            assert await _run(tuned(settings, export_chunk_bytes=1024), db, org, export["id"]) == "completed"
            plain = str(await insert_export(db, org.id, org.owner.id, chunks=2))
        # Read as the server's superuser: the ordinary owner itself sees only queued and running exports.
        admin = make_url(url).set(username=make_url(owner_url).username).render_as_string(hide_password=False)
        count = "SELECT count(*) FILTER (WHERE codec IS NOT NULL), count(*) FROM export_chunks WHERE export_id = %s"
        with psycopg.connect(admin) as conn:
            packed, stored = conn.execute(count, (export["id"],)).fetchone() or (0, 0)
        assert packed == stored > 2
        downgrade(url, "0012")
        with psycopg.connect(admin) as conn:
            rows = conn.execute(
                "SELECT j.id::text, j.purged_at IS NOT NULL, count(c.seq) FROM export_jobs j"
                " LEFT JOIN export_chunks c ON c.export_id = j.id GROUP BY j.id"
            ).fetchall()
            forced = conn.execute(
                "SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname IN ('export_jobs', 'export_chunks')"
            ).fetchone()
        assert sorted(rows) == sorted([(export["id"], True, 0), (plain, False, 2)])
        assert forced == (True,)
