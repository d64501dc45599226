"""Destinations (SPEC §22): a customer's bucket (a second moto server, real HTTP, checking credentials) registered
by owners and admins after a test write, the secret sealed and never shown, exports delivered under the documented
keys with the manifest written last, a store's 4xx failing at once and its 503s retried."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from space.config import Settings
from space.db import Database
from space.destinations.delivery import deliver
from space.destinations.sealing import load_sealer
from space.exports.storage.postgres import PgResultStore
from tests.db.test_backup_restore import _server_major, pg_tools
from tests.destinations.customer_store import BUCKET, Store
from tests.exports.fixtures import add_tickets, completed_export, in_process_worker, wait_for
from tests.helpers import Api, Org, assert_problem

SECRET_MARK = "CustomerSecret"


async def add_destination(api: Api, org: Org, store: Store, **overrides: Any) -> dict[str, Any]:
    """The owner registers the store; returns the 201 body."""
    r = await api.call("POST", org.path("/destinations"), org.owner, json=store.destination(**overrides))
    assert r.status_code == 201, r.text
    assert SECRET_MARK not in r.text and store.secret_access_key not in r.text
    body: dict[str, Any] = r.json()
    return body


async def delivery_of(api: Api, org: Org, export_id: str, states: set[str]) -> dict[str, Any]:
    """The export's `delivery` once it is in one of `states`."""

    async def check() -> dict[str, Any] | None:
        r = await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)
        assert r.status_code == 200, r.text
        delivery: dict[str, Any] | None = r.json()["delivery"]
        return delivery if delivery is not None and delivery["state"] in states else None

    got: dict[str, Any] = await wait_for(check, f"delivery of {export_id} in {states}")
    return got


def folder_of(org: Org, export: dict[str, Any], prefix: str) -> str:
    """Where SPEC §22 says a manual delivery of `export` lands."""
    at = export["snapshotAt"]
    stamp = at[:19].replace("-", "").replace(":", "") + "Z"
    return f"{prefix}/{org.id}/manual/{stamp}-{export['id']}/"


async def test_a_manual_delivery_lands_under_the_documented_keys_with_its_manifest_last(
    api_local: Api, db: Database, local: Settings, customer_store: Store
) -> None:
    api = api_local
    org = await api.org()
    await add_tickets(db, org.id, org.owner, [f"ticket {i}" for i in range(5)])
    destination = await add_destination(api, org, customer_store, prefix="loads/space")
    assert destination["prefix"] == "loads/space" and destination["lastDeliveryAt"] is None
    for export_body in ({"kind": "tickets_csv"}, {"kind": "archive"}):
        export_id = await completed_export(api, db, local, org, export_body)
        export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
        customer_store.log.clear()
        async with in_process_worker(local):
            r = await api.call(
                "POST",
                org.path(f"/exports/{export_id}/deliveries"),
                org.owner,
                json={"destinationId": destination["id"]},
            )
            assert r.status_code == 202, r.text
            assert r.json()["state"] == "pending"
            delivered = await delivery_of(api, org, export_id, {"delivered", "failed"})
        assert delivered["state"] == "delivered", delivered
        assert delivered["destinationId"] == destination["id"] and delivered["errorCode"] is None
        # Delivery never changes the export: still completed and downloadable.
        again = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
        assert again["state"] == "completed" and again["canDownload"] is True
        folder = folder_of(org, export, "loads/space")
        keys = sorted(customer_store.keys(folder))
        manifest = json.loads(customer_store.body(f"{folder}manifest.json"))
        assert manifest["schemaVersion"] == 1 and manifest["organizationId"] == org.id
        assert manifest["snapshotAt"][:19] == export["snapshotAt"][:19]
        names = [f["name"] for f in manifest["files"]]
        assert sorted(f"{folder}{n}" for n in [*names, "manifest.json"]) == keys
        for f in manifest["files"]:
            data = customer_store.body(f"{folder}{f['name']}")
            assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
        if export_body["kind"] == "archive":
            assert {"snapshot.json", "tickets.csv"} <= set(names) and "manifest.json" not in names
        else:
            assert names == [f"space-export-{export_id}.csv"] and manifest["files"][0]["sha256"] == export["sha256"]
        # The manifest is the last object written (the proxy saw every request, in order).
        writes = [path for method, path in customer_store.log if method in {"PUT", "POST"} and folder in path]
        assert writes[-1].split("?")[0].endswith(f"{folder}manifest.json")
        assert sum(1 for w in writes if w.split("?")[0].endswith("manifest.json")) == 1
    shown = (await api.call("GET", org.path(f"/destinations/{destination['id']}"), org.owner)).json()
    assert shown["lastDeliveryAt"] is not None and shown["lastError"] is None


async def test_wrong_credentials_or_a_missing_bucket_are_refused_on_save(api_local: Api, customer_store: Store) -> None:
    api = api_local
    org = await api.org()
    bad_secret = customer_store.destination(secretAccessKey=f"{SECRET_MARK}-wrong")
    r = await api.call("POST", org.path("/destinations"), org.owner, json=bad_secret)
    problem = assert_problem(r, 400, "destination_unreachable")
    assert "SignatureDoesNotMatch" in problem["detail"] and SECRET_MARK not in r.text
    r = await api.call(
        "POST", org.path("/destinations"), org.owner, json=customer_store.destination(bucket="no-such-bucket")
    )
    assert "NoSuchBucket" in assert_problem(r, 400, "destination_unreachable")["detail"]
    listed = (await api.call("GET", org.path("/destinations"), org.owner)).json()
    assert listed["items"] == []


async def test_endpoint_urls_follow_the_webhook_address_rules(api: Api, customer_store: Store) -> None:
    # The suite's ordinary app does not allow private addresses: the local store is refused before any request.
    org = await api.org()
    before = len(customer_store.log)
    r = await api.call("POST", org.path("/destinations"), org.owner, json=customer_store.destination())
    assert_problem(r, 400, "invalid_request")
    assert len(customer_store.log) == before


async def test_only_owners_and_admins_manage_destinations_and_other_orgs_see_none(
    api_local: Api, customer_store: Store
) -> None:
    api = api_local
    org = await api.org()
    other = await api.org("Other")
    created = await add_destination(api, org, customer_store)
    for user in (org.member, org.customer):
        r = await api.call("GET", org.path("/destinations"), user)
        assert_problem(r, 403, "forbidden")
        r = await api.call("POST", org.path("/destinations"), user, json=customer_store.destination())
        assert_problem(r, 403, "forbidden")
    r = await api.call("GET", org.path("/destinations"), org.admin)
    assert [d["id"] for d in r.json()["items"]] == [created["id"]]
    assert_problem(await api.call("GET", other.path(f"/destinations/{created['id']}"), other.owner), 404, "not_found")
    assert_problem(
        await api.call("DELETE", other.path(f"/destinations/{created['id']}"), other.owner), 404, "not_found"
    )
    r = await api.call("DELETE", org.path(f"/destinations/{created['id']}"), org.admin)
    assert r.status_code == 204, r.text
    assert_problem(await api.call("GET", org.path(f"/destinations/{created['id']}"), org.owner), 404, "not_found")


async def test_credentials_that_break_later_fail_the_delivery_at_once(
    api_local: Api, db: Database, local: Settings, customer_store: Store
) -> None:
    api = api_local
    org = await api.org()
    await add_tickets(db, org.id, org.owner, [f"ticket {i}" for i in range(3)])
    # A key of its own, revoked after the destination was saved.
    key = customer_store.new_access_key()
    destination = await add_destination(
        api, org, customer_store, accessKeyId=key["AccessKeyId"], secretAccessKey=key["SecretAccessKey"]
    )
    customer_store.iam.delete_access_key(UserName="customer", AccessKeyId=key["AccessKeyId"])
    export_id = await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    r = await api.call(
        "POST", org.path(f"/exports/{export_id}/deliveries"), org.owner, json={"destinationId": destination["id"]}
    )
    assert r.status_code == 202, r.text
    delivery_id, _ = await _only_delivery(db, org)
    sealer = await load_sealer(local, db.engine)
    result = await deliver(local, db, PgResultStore(db), sealer, None, delivery_id, uuid.UUID(org.id))
    # A 4xx is the customer's configuration: no second attempt.
    assert result == "failed"
    failed = await delivery_of(api, org, export_id, {"failed"})
    assert failed["errorCode"] == "destination_failed"
    assert (await _only_delivery(db, org))[1] == 1
    shown = (await api.call("GET", org.path(f"/destinations/{destination['id']}"), org.owner)).json()
    assert "InvalidAccessKeyId" in shown["lastError"] or "403" in shown["lastError"]
    export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
    assert export["state"] == "completed" and export["canDownload"] is True


async def _only_delivery(db: Database, org: Org) -> tuple[uuid.UUID, int]:
    from space.db import Tenant, UnitOfWork

    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        row = (
            await uow.session.execute(
                text("SELECT id, attempts FROM destination_deliveries WHERE org_id = :o"), {"o": org.id}
            )
        ).one()
    return row.id, row.attempts


async def test_a_store_answering_503_twice_then_accepting_gets_the_run_once(
    api_local: Api, db: Database, local: Settings, customer_store: Store
) -> None:
    api = api_local
    org = await api.org()
    await add_tickets(db, org.id, org.owner, [f"ticket {i}" for i in range(4)])
    destination = await add_destination(api, org, customer_store, prefix="retry")
    export_id = await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    export = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()
    customer_store.failed = 0
    customer_store.fail_next = 2
    customer_store.log.clear()
    async with in_process_worker(local):
        r = await api.call(
            "POST", org.path(f"/exports/{export_id}/deliveries"), org.owner, json={"destinationId": destination["id"]}
        )
        assert r.status_code == 202, r.text
        delivered = await delivery_of(api, org, export_id, {"delivered", "failed"})
    assert delivered["state"] == "delivered", delivered
    assert customer_store.failed == 2
    assert (await _only_delivery(db, org))[1] == 3
    folder = folder_of(org, export, "retry")
    assert sorted(customer_store.keys(folder)) == [f"{folder}manifest.json", f"{folder}space-export-{export_id}.csv"]
    writes = [p.split("?")[0] for m, p in customer_store.log if m in {"PUT", "POST"} and folder in p]
    # Two refused writes, then each object written once, the manifest last.
    assert writes[-1].endswith("manifest.json") and writes.count(f"/{BUCKET}/{folder}manifest.json") == 1


async def test_the_secret_is_nowhere_in_a_dump_a_response_or_the_logs(
    api_local: Api,
    db: Database,
    local: Settings,
    customer_store: Store,
    owner_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = api_local
    org = await api.org()
    caplog.set_level(logging.DEBUG)
    # A key of its own whose secret is marked, so a search can't miss it.
    key = customer_store.new_access_key()
    secret = key["SecretAccessKey"]
    # From here on: what Space logs (the test's own IAM call above logs the key it was given, at DEBUG).
    caplog.clear()
    created = await add_destination(api, org, customer_store, accessKeyId=key["AccessKeyId"], secretAccessKey=secret)
    responses = [
        await api.call("GET", org.path("/destinations"), org.owner),
        await api.call("GET", org.path(f"/destinations/{created['id']}"), org.owner),
    ]
    await add_tickets(db, org.id, org.owner, [f"ticket {i}" for i in range(2)])
    export_id = await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    async with in_process_worker(local):
        r = await api.call(
            "POST", org.path(f"/exports/{export_id}/deliveries"), org.owner, json={"destinationId": created["id"]}
        )
        responses.append(r)
        await delivery_of(api, org, export_id, {"delivered"})
    for r in responses:
        assert secret not in r.text
    assert secret not in caplog.text
    dump = await asyncio.to_thread(_dump, owner_url)
    assert secret.encode() not in dump
    assert f"{created['id']}".encode() in dump  # the dump holds the destination row itself


def _dump(url: str) -> bytes:
    """The database's data as `pg_dump --data-only` writes it, with a pg_dump of the server's own version; where
    the machine has none, every row of every table as text (what a dump holds of them)."""
    tools = pg_tools(_server_major(url))
    if tools is not None:
        return subprocess.run([tools[0], "--data-only", url], capture_output=True, check=True).stdout
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p') AND n.nspname IN ('public', 'saq')"
        ).fetchall()
        rows = [r[0] for (t,) in tables for r in conn.execute(f"SELECT t::text FROM {t} t")]
    return "\n".join(rows).encode()
