"""A schedule that names a destination (SPEC §21, §22): its runs are delivered under the schedule's folder; the
destination can't be removed while the schedule names it; a schedule names only its own org's destinations; and
when the customer's store refuses a run later, that delivery fails and the schedule pauses (`destination_failed`),
told to its creator and the owners."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.destinations.delivery import deliver
from space.destinations.sealing import load_sealer
from space.exports.pipeline import run_export
from space.exports.storage.postgres import PgResultStore
from space.schedules.jobs import run_due
from tests.destinations.customer_store import Store
from tests.destinations.test_destinations import add_destination
from tests.exports.fixtures import add_tickets, runner
from tests.helpers import Api, Org, assert_problem


async def _run_once(owner: psycopg.Connection[Any], db: Database, local: Settings, org: Org, schedule_id: str) -> str:
    """Make the schedule due, let the cron tick make its run, and run that export; the run's export id."""
    owner.execute("UPDATE schedules SET next_run_at = now() - interval '1 hour' WHERE id = %s", (schedule_id,))
    assert await run_due(local, db, None) >= 1
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        export_id = await uow.session.scalar(
            text("SELECT last_export_id FROM schedules WHERE org_id = :o AND id = :s"), {"o": org.id, "s": schedule_id}
        )
    assert export_id is not None
    assert await run_export(runner(local, db), export_id, uuid.UUID(org.id)) == "completed"
    return str(export_id)


async def _deliver(db: Database, local: Settings, org: Org, export_id: str) -> str:
    """The delivery the run's publish owed, attempted once here (the outbound lane's job, in this process)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        delivery_id = await uow.session.scalar(
            text("SELECT id FROM destination_deliveries WHERE org_id = :o AND export_id = :e"),
            {"o": org.id, "e": export_id},
        )
    assert delivery_id is not None, "the publish owed a delivery to the schedule's destination"
    sealer = await load_sealer(local, db.engine)
    return await deliver(local, db, PgResultStore(db), sealer, None, delivery_id, uuid.UUID(org.id))


async def test_a_scheduled_run_lands_under_its_schedule_and_a_refused_one_pauses_the_schedule(
    api_local: Api, db: Database, local: Settings, customer_store: Store, owner: psycopg.Connection[Any]
) -> None:
    api = api_local
    org, other = await api.org(), await api.org()
    await add_tickets(db, org.id, org.owner, [f"ticket {i}" for i in range(3)])
    key = customer_store.new_access_key()
    destination = await add_destination(
        api, org, customer_store, accessKeyId=key["AccessKeyId"], secretAccessKey=key["SecretAccessKey"]
    )
    foreign = await add_destination(api, other, customer_store)
    body = {"kind": "tickets_csv", "every": "day"}
    r = await api.call("POST", org.path("/schedules"), org.owner, json={**body, "destinationId": foreign["id"]})
    assert_problem(r, 400, "invalid_request")
    r = await api.call("POST", org.path("/schedules"), org.owner, json={**body, "destinationId": destination["id"]})
    assert r.status_code == 201, r.text
    schedule = r.json()
    assert schedule["destinationId"] == destination["id"]
    r = await api.call("DELETE", org.path(f"/destinations/{destination['id']}"), org.owner)
    assert_problem(r, 409, "destination_in_use")

    first = await _run_once(owner, db, local, org, schedule["id"])
    assert await _deliver(db, local, org, first) == "delivered"
    folder = [k for k in customer_store.keys("") if f"/{org.id}/{schedule['id']}/" in f"/{k}" and first in k]
    manifests = [k for k in folder if k.endswith("/manifest.json")]
    assert len(manifests) == 1, folder
    manifest = json.loads(customer_store.body(manifests[0]))
    assert [f["name"] for f in manifest["files"]] == [f"space-export-{first}.csv"]
    shown = (await api.call("GET", org.path(f"/exports/{first}"), org.owner)).json()
    assert shown["delivery"]["state"] == "delivered" and shown["scheduleId"] == schedule["id"]

    # The customer revokes the key: the next run's delivery is refused (a 4xx), and the schedule pauses.
    customer_store.iam.delete_access_key(UserName="customer", AccessKeyId=key["AccessKeyId"])
    second = await _run_once(owner, db, local, org, schedule["id"])
    assert await _deliver(db, local, org, second) == "failed"
    paused = (await api.call("GET", org.path(f"/schedules/{schedule['id']}"), org.owner)).json()
    assert paused["paused"] is True and paused["pausedReason"] == "destination_failed"
    told = owner.execute(
        "SELECT count(DISTINCT user_id) FROM notifications WHERE org_id = %s AND type = 'schedule.paused'"
        " AND channel = 'app'",
        (org.id,),
    ).fetchone()
    assert told is not None and told[0] >= 1
    # The run itself stays completed and downloadable.
    again = (await api.call("GET", org.path(f"/exports/{second}"), org.owner)).json()
    assert again["state"] == "completed" and again["delivery"]["errorCode"] == "destination_failed"
