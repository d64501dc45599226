"""Helpers of the org lifecycle tests (orgs/test_lifecycle.py, orgs/test_purge.py, exports/test_lifecycle.py):
the organizations row as the owner sees it, an org with rows in every purged table, a deletion request, and the
check that a deleted org is gone from every route."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import psycopg
from sqlalchemy import select

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.destinations import service as destinations
from space.destinations.models import Destination
from space.destinations.sealing import Sealer
from space.exports.models import ExportJob
from space.webhooks import service as webhooks
from space.webhooks.delivery import deliver
from space.webhooks.models import WebhookDelivery
from space.webhooks.schemas import WebhookCreate
from tests.exports.fixtures import completed_export, insert_export
from tests.helpers import Api, Org, assert_problem

SKIP = {"skipFinalExport": True}
"""The part of a deletion request that skips the final-export recommendation."""


def org_row(owner: psycopg.Connection[Any], org_id: str) -> dict[str, Any]:
    """The organizations row, as the owner sees it."""
    with owner.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM organizations WHERE id = %s", (org_id,)).fetchone()
    assert row is not None
    return row


async def seed(api: Api, db: Database, settings: Settings, org: Org, *, projects: int = 2, tickets: int = 3) -> None:
    """Rows in every purged table: projects, tasks, tickets and a real export through the API and worker,
    plus more export rows and chunks written as the app role (so small batches take several rounds)."""
    for p in range(projects):
        r = await api.call("POST", org.path("/projects"), org.member, json={"name": f"p{p}"})
        assert r.status_code == 201, r.text
        for t in range(2):
            r2 = await api.call(
                "POST", org.path(f"/projects/{r.json()['id']}/tasks"), org.member, json={"title": f"t{t}"}
            )
            assert r2.status_code == 201, r2.text
    for i in range(tickets):
        who = org.customer if i % 2 else org.member
        r = await api.call("POST", org.path("/tickets"), who, json={"title": f"ticket {i}"})
        assert r.status_code == 201, r.text
    # A webhook endpoint, the delivery the export below owes it (no queue: nothing is enqueued), and one
    # attempt of it, made for real against a closed local port.
    oid = uuid.UUID(org.id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        hook = msgspec.convert({"url": "http://127.0.0.1:9/closed", "events": ["export.completed"]}, WebhookCreate)
        created = await webhooks.create_webhook(uow.session, oid, org.owner.id, hook, allow_private=True, limit=10)
    await completed_export(api, db, settings, org, {"kind": "snapshot"})
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        delivery_id = await uow.session.scalar(
            select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == created.id)
        )
    assert delivery_id is not None
    local = msgspec.structs.replace(settings, webhook_allow_private=True)
    assert await deliver(local, db, None, delivery_id, oid) == "retrying"
    await insert_export(db, org.id, org.owner.id, chunks=3)
    await insert_export(db, org.id, org.member.id, kind="tickets_csv", chunks=2)
    # A schedule (SPEC §21), the org's too.
    r = await api.call("POST", org.path("/schedules"), org.owner, json={"kind": "snapshot", "every": "day"})
    assert r.status_code == 201, r.text
    # A destination (written as the app role: saving one through the API needs a reachable store) and the
    # delivery of the export above owed to it (no queue: nothing is enqueued).
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        destination_id = uuid.uuid4()
        uow.session.add(
            Destination(
                org_id=oid,
                id=destination_id,
                type="s3",
                bucket="purged-bucket",
                access_key_id="AKIAPURGE",
                secret_sealed=Sealer([b"k" * 32]).seal("purge-secret", oid, destination_id),
            )
        )
        await uow.session.flush()
        export_id = await uow.session.scalar(select(ExportJob.id).where(ExportJob.org_id == oid).limit(1))
        assert export_id is not None
        await destinations.owe(uow, None, oid, export_id, destination_id)


async def request_deletion(api: Api, org: Org) -> dict[str, Any]:
    """Owner requests deletion skipping the final export; returns the org body."""
    r = await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", **SKIP})
    assert r.status_code == 202, r.text
    body: dict[str, Any] = r.json()
    return body


async def assert_gone(api: Api, org: Org, project_id: str) -> None:
    """Every route of the org answers 404 to every former member."""
    for who in [org.owner, org.admin, org.member, org.customer]:
        for method, path, body in [
            ("GET", "", None),
            ("GET", "/members", None),
            ("POST", "/members", {"email": org.admin.email, "role": "member"}),
            ("PATCH", f"/members/{org.member.id}", {"role": "admin"}),
            ("DELETE", f"/members/{org.member.id}", None),
            ("GET", "/projects", None),
            ("POST", "/projects", {"name": "x"}),
            ("GET", f"/projects/{project_id}", None),
            ("GET", f"/projects/{project_id}/tasks", None),
            ("GET", "/tickets", None),
            ("POST", "/tickets", {"title": "x"}),
            ("PATCH", "/tickets/1", {"status": "closed"}),
            ("POST", "/suspend", None),
            ("POST", "/reactivate", None),
            ("POST", "/deletion", {"confirm": "Acme", **SKIP}),
            ("DELETE", "/deletion", None),
            ("GET", "/exports", None),
            ("POST", "/exports", {"kind": "snapshot"}),
        ]:
            kw = {} if body is None else {"json": body}
            assert_problem(await api.call(method, org.path(path), who, **kw), 404, "not_found")
        listed = (await api.call("GET", "/orgs", who)).json()["items"]
        assert org.id not in [o["id"] for o in listed]
