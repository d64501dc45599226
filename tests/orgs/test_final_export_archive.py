"""SPEC §13: the deletion request's final-export rule accepts a completed archive as it does a snapshot, while
the owner can still download it: a deleted, purged or expired archive no longer counts."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.maintenance import cleanup
from space.exports.storage.postgres import PgResultStore
from tests.exports.fixtures import completed_export, download, job_row, uid
from tests.helpers import Api, Org, assert_problem

CONFIRM = {"confirm": "Acme"}


async def _expire(db: Database, org: Org, export_id: str) -> None:
    # Written as the app role under the org's context, as the ledger's own writes are.
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
        await uow.session.execute(
            text("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": uid(export_id)},
        )


async def test_a_fresh_downloadable_archive_counts(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    # Without it, the rule refuses: nothing else of the owner's counts here.
    assert_problem(
        await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM), 409, "final_export_recommended"
    )
    export_id = await completed_export(api, db, settings, org, {"kind": "archive"})
    assert (await download(api, org, org.owner, export_id)).status_code == 200
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert r.status_code == 202 and r.json()["state"] == "deleting", r.text


@pytest.mark.parametrize("how", ["deleted_by_its_owner", "purged_by_the_cleanup", "expired"])
async def test_an_archive_that_can_no_longer_be_downloaded_does_not_count(
    api: Api, db: Database, settings: Settings, how: str
) -> None:
    org = await api.org()
    export_id = await completed_export(api, db, settings, org, {"kind": "archive"})
    match how:
        case "deleted_by_its_owner":
            r = await api.call("DELETE", org.path(f"/exports/{export_id}"), org.owner)
            assert r.status_code == 204, r.text
        case "purged_by_the_cleanup":
            await _expire(db, org, export_id)
            await cleanup(db, PgResultStore(db))
            assert (await job_row(db, org.id, export_id)).purged_at is not None
        case "expired":
            await _expire(db, org, export_id)
            assert_problem(await download(api, org, org.owner, export_id), 410, "export_expired")
    job = await job_row(db, org.id, export_id)
    assert job.state == "completed" and job.kind == "archive" and job.creator_id == org.owner.id
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert_problem(r, 409, "final_export_recommended")
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"
    # A fresh archive then satisfies the rule.
    await completed_export(api, db, settings, org, {"kind": "archive"})
    r = await api.call("POST", org.path("/deletion"), org.owner, json=CONFIRM)
    assert r.status_code == 202, r.text
