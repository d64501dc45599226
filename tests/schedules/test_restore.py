"""An incremental schedule across `pg_dump`/`pg_restore` (SPEC §14, §21; decision 0096): the restored database
has its own xid history, so the snapshots recorded before mean nothing there. Its next run is complete, and the
one after continues from that run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.schedules.jobs import run_due
from tests.db.test_backup_restore import _libpq, _run, _server_major, pg_tools, running_app
from tests.exports.fixtures import add_tickets, download, parse_csv, runner
from tests.helpers import Api, Org, fresh_database

pytestmark = pytest.mark.slow

LAST_RUN = text(
    "SELECT id FROM export_jobs WHERE org_id = :o AND schedule_id = :s ORDER BY created_at DESC, id DESC LIMIT 1"
)


async def _next_run(api: Api, db: Database, settings: Any, url: str, org: Org, sid: str) -> tuple[dict[str, Any], int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET next_run_at = now() - interval '1 hour' WHERE id = %s", (sid,))
    await run_due(settings, db, None)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        export_id = await uow.session.scalar(LAST_RUN, {"o": org.id, "s": sid})
    assert await run_export(runner(settings, db), export_id, uuid.UUID(org.id)) == "completed"
    export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
    body = (await download(api, org, org.owner, str(export_id))).content
    return export, len(parse_csv(body)) - 1


async def test_the_first_run_after_a_restore_is_complete(owner_url: str, tmp_path: Path) -> None:
    tools = pg_tools(_server_major(owner_url))
    if tools is None:
        pytest.skip(f"no pg_dump/pg_restore of PostgreSQL {_server_major(owner_url)} on this machine")
    pg_dump, pg_restore = tools
    dump = tmp_path / "space.dump"
    with (
        fresh_database(owner_url, "space_sched") as source,
        fresh_database(owner_url, "space_sched", migrate=False) as target,
    ):
        async with running_app(source) as (api, db, settings):
            org = await api.org("Restored")
            await add_tickets(db, org.id, org.member, ["a", "b", "c"])
            r = await api.call(
                "POST",
                org.path("/schedules"),
                org.owner,
                json={"kind": "tickets_csv", "every": "hour", "incremental": True},
            )
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            first, rows = await _next_run(api, db, settings, source, org, sid)
            assert first["since"] is None and rows == 3
            second, rows = await _next_run(api, db, settings, source, org, sid)
            assert second["sinceExportId"] == first["id"] and rows == 0
        await _run(pg_dump, "-Fc", "-f", str(dump), "-d", _libpq(source))
        await _run(pg_restore, "--exit-on-error", "-d", _libpq(target), str(dump))
        async with running_app(target) as (api2, db2, settings2):
            third, rows = await _next_run(api2, db2, settings2, target, org, sid)
            assert third["since"] is None and rows == 3
            fourth, rows = await _next_run(api2, db2, settings2, target, org, sid)
            assert fourth["sinceExportId"] == third["id"] and rows == 0
