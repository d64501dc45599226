"""Exports and the org lifecycle: what each org state allows (SPEC §3's last two columns), a deletion request
failing exports in flight, deletion and publish ordered by the org lock, and the owner's journey through a real
final export."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.orgs import lifecycle
from space.orgs.jobs import purge_due
from space.orgs.lifecycle import Action, change_state
from space.orgs.models import Organization
from space.orgs.schemas import DeletionRequest
from tests.exports.fixtures import (
    WAIT,
    Gate,
    background,
    blocked_by,
    chunk_count,
    completed_export,
    create_export,
    download,
    job_row,
    runner,
    uid,
    wait_for,
)
from tests.helpers import Api, Org, app_database, assert_problem
from tests.orgs.fixtures import org_row, request_deletion

# --- exports in each state (SPEC §3's last two columns) ---------------------------------------------------------


@pytest.mark.parametrize("state", ["active", "suspended", "deleting", "deleted"])
async def test_state_table_exports(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any], state: str
) -> None:
    org = await api0.org()
    done = await completed_export(api0, db, settings0, org, {"kind": "snapshot"})
    assert (await download(api0, org, org.owner, done)).status_code == 200
    if state == "suspended":
        assert (await api0.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    if state in ("deleting", "deleted"):
        await request_deletion(api0, org)
    if state == "deleted":
        await purge_due(settings0, db)
        assert org_row(owner, org.id)["state"] == "deleted"
    create = await api0.call("POST", org.path("/exports"), org.member, json={"kind": "snapshot"})
    got = await download(api0, org, org.owner, done)
    match state:
        case "active" | "suspended":
            # Suspended orgs are read-only but keep data portability.
            assert create.status_code == 202, create.text
            assert got.status_code == 200, got.text
            assert got.json()["organizationId"] == org.id
        case "deleting":
            assert_problem(create, 409, "org_deleting")
            assert_problem(got, 409, "org_deleting")
        case "deleted":
            assert_problem(create, 404, "not_found")
            assert_problem(got, 404, "not_found")


@pytest.mark.parametrize("when", ["before_the_run", "during_the_read"])
async def test_deletion_request_fails_exports_in_flight(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], when: str
) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/projects"), org.member, json={"name": "p"})
    assert r.status_code == 201
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    if when == "before_the_run":
        await request_deletion(api, org)
        # Refused at the worker's re-check, before anything is read.
        gate = Gate(set())
        assert await run_export(runner(settings, db), eid, oid, gate=gate) == "org_deleting"
        assert "counted" not in gate.seen
    else:
        gate = Gate({"counted"})
        async with background(run_export(runner(settings, db), eid, oid, gate=gate), gate) as worker:
            await gate.reached("counted")
            await request_deletion(api, org)
            gate.resume("counted")
            # The read went on; the publish re-checks under the org lock and refuses.
            assert await asyncio.wait_for(worker, WAIT) == "org_deleting"
    job = await job_row(db, org.id, eid)
    assert (job.state, job.error_code, job.expires_at, job.sha256) == ("failed", "org_deleting", None, None)
    assert await chunk_count(db, org.id, eid) == 0
    assert_problem(await download(api, org, org.member, export["id"]), 409, "org_deleting")
    r = await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)
    assert r.json()["state"] == "failed" and r.json()["errorCode"] == "org_deleting"


async def _deletion_in(
    database: Database, org: Org, gate: asyncio.Event | None = None, locked: asyncio.Event | None = None
) -> Any:
    """The owner's deletion request through the lifecycle service, on `database` (tagged for pg_stat_activity).

    The HTTP test client blocks the event loop while a request runs, so a request that waits on a lock
    can't run beside the worker in the same loop; this calls the same service the route calls. With
    `gate`, the transition pauses after taking the org lock (setting `locked`) until the gate opens.
    """
    oid = uid(org.id)
    async with UnitOfWork(database.sessionmaker, Tenant(org_id=oid, user_id=org.owner.id)) as uow:
        if gate is not None:

            async def hold(_: Organization) -> None:
                if locked is not None:
                    locked.set()
                await asyncio.wait_for(gate.wait(), WAIT)

            return await change_state(
                uow.session, oid, Action.request_deletion, actor_id=org.owner.id, grace_seconds=60, precondition=hold
            )
        row = await uow.session.get_one(Organization, oid)
        return await lifecycle.request_deletion(uow, row, org.owner.id, DeletionRequest(confirm="Acme"), 60)


async def test_deletion_waits_for_a_publish_holding_the_org_lock(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    worker_app, lifecycle_app = (f"space-{x}-{uuid.uuid4().hex[:8]}" for x in ("worker", "lifecycle"))
    gate = Gate({"publish_locked"})
    async with (
        app_database(owner_url, worker_app) as worker_db,
        app_database(owner_url, lifecycle_app) as lifecycle_db,
        background(run_export(runner(settings, worker_db), eid, oid, gate=gate), gate) as worker,
    ):
        await gate.reached("publish_locked")
        async with background(_deletion_in(lifecycle_db, org)) as requested:
            await wait_for(lambda: blocked_by(owner_url, lifecycle_app, worker_app), "the deletion to wait")
            assert not requested.done()
            gate.resume("publish_locked")
            assert await asyncio.wait_for(worker, WAIT) == "completed"
            # Ordered after the publish: the export just published counts as the final export.
            assert (await asyncio.wait_for(requested, WAIT)).state == "deleting"
    job = await job_row(db, org.id, eid)
    assert job.state == "completed" and await chunk_count(db, org.id, eid) > 0
    # The result exists, and the deleting org refuses to hand it out.
    assert_problem(await download(api, org, org.owner, export["id"]), 409, "org_deleting")


async def test_publish_waits_for_a_deletion_holding_the_org_lock(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    worker_app, lifecycle_app = (f"space-{x}-{uuid.uuid4().hex[:8]}" for x in ("worker", "lifecycle"))
    gate = Gate({"before_publish"})
    hold, locked = asyncio.Event(), asyncio.Event()
    async with app_database(owner_url, worker_app) as worker_db, app_database(owner_url, lifecycle_app) as lifecycle_db:
        try:
            async with background(run_export(runner(settings, worker_db), eid, oid, gate=gate), gate) as worker:
                await gate.reached("before_publish")
                async with background(_deletion_in(lifecycle_db, org, hold, locked)) as requested:
                    await asyncio.wait_for(locked.wait(), WAIT)
                    gate.resume("before_publish")
                    await wait_for(lambda: blocked_by(owner_url, worker_app, lifecycle_app), "the publish to wait")
                    assert not worker.done()
                    hold.set()
                    assert (await asyncio.wait_for(requested, WAIT)).state == "deleting"
                    # Ordered after the deletion: the publish re-checks under the lock and refuses.
                    assert await asyncio.wait_for(worker, WAIT) == "org_deleting"
        finally:
            hold.set()
    job = await job_row(db, org.id, eid)
    assert (job.state, job.error_code, job.sha256) == ("failed", "org_deleting", None)
    assert await chunk_count(db, org.id, eid) == 0
    assert_problem(await download(api, org, org.owner, export["id"]), 409, "org_deleting")


async def test_owner_journey_with_a_real_final_export(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    assert (await api.call("POST", org.path("/reactivate"), org.owner)).status_code == 200
    assert_problem(
        await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme"}),
        409,
        "final_export_recommended",
    )
    # A snapshot by an admin, or a CSV by the owner, is not the owner's final export.
    admin_export = await create_export(api, org, org.admin, {"kind": "snapshot"})
    assert await run_export(runner(settings, db), uid(admin_export["id"]), uid(org.id)) == "completed"
    await completed_export(api, db, settings, org, {"kind": "tickets_csv"})
    assert_problem(
        await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme"}),
        409,
        "final_export_recommended",
    )
    final = await completed_export(api, db, settings, org, {"kind": "snapshot"})
    assert (await download(api, org, org.owner, final)).status_code == 200
    r = await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme"})
    assert r.status_code == 202 and r.json()["state"] == "deleting", r.text
    r = await api.call("DELETE", org.path("/deletion"), org.owner)
    assert r.status_code == 200 and r.json() == {**r.json(), "state": "active", "deleteAfter": None}
    assert (await download(api, org, org.owner, final)).status_code == 200
