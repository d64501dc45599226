"""The deletion request's final-export rule counts only a snapshot the owner could still download.

A completed snapshot from the last 24 hours counts while it is downloadable: not deleted by its owner, its
result not purged (by the cleanup, or with the delete), and not past `expiresAt`.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.maintenance import cleanup
from space.exports.pipeline import run_export
from space.exports.storage.postgres import PgResultStore
from tests.exports.fixtures import create_export, download, job_row, runner, uid
from tests.helpers import Api, Org, assert_problem

CONFIRM = {"confirm": "Acme"}


async def _snapshot(api: Api, db: Database, settings: Settings, org: Org) -> str:
    """The owner's snapshot, requested through the API and built by the real worker."""
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    return str(export["id"])


async def _set(db: Database, org: Org, export_id: str, assignment: str) -> None:
    # Written as the app role under the org's context, as the ledger's own writes are.
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
        await uow.session.execute(text(f"UPDATE export_jobs SET {assignment} WHERE id = :id"), {"id": uid(export_id)})


async def test_a_fresh_downloadable_snapshot_counts(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    export_id = await _snapshot(api, db, settings, org)
    assert (await download(api, org, org.owner, export_id)).status_code == 200
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert r.status_code == 202 and r.json()["state"] == "deleting", r.text


@pytest.mark.parametrize(
    "how",
    [
        "deleted_by_its_owner",  # DELETE .../exports/{id}: hidden, its result gone
        "expired",  # past expiresAt, before any cleanup
        "purged_by_the_cleanup",  # expired, then the cleanup removed the result
        # Each mark alone refuses too, so none of the three conditions can be dropped.
        "marked_deleted_only",
        "marked_purged_only",
    ],
)
async def test_a_snapshot_that_can_no_longer_be_downloaded_does_not_count(
    api: Api, db: Database, settings: Settings, how: str
) -> None:
    org = await api.org()
    export_id = await _snapshot(api, db, settings, org)
    match how:
        case "deleted_by_its_owner":
            r = await api.call("DELETE", org.path(f"/exports/{export_id}"), org.owner)
            assert r.status_code == 204, r.text
        case "expired":
            await _set(db, org, export_id, "expires_at = now() - interval '1 second'")
            assert_problem(await download(api, org, org.owner, export_id), 410, "export_expired")
        case "purged_by_the_cleanup":
            await _set(db, org, export_id, "expires_at = now() - interval '1 second'")
            await cleanup(db, PgResultStore(db))
            assert (await job_row(db, org.id, export_id)).purged_at is not None
        case "marked_deleted_only":
            await _set(db, org, export_id, "deleted_at = now()")
        case "marked_purged_only":
            await _set(db, org, export_id, "purged_at = now()")
    job = await job_row(db, org.id, export_id)
    # Still a completed snapshot of this owner from the last hour: only downloadability differs.
    assert job.state == "completed" and job.kind == "snapshot" and job.creator_id == org.owner.id
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert_problem(r, 409, "final_export_recommended")
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"
    # A fresh snapshot then satisfies the rule.
    await _snapshot(api, db, settings, org)
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert r.status_code == 202, r.text
