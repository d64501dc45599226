"""Webhooks (SPEC §12): endpoints managed by owners and admins, signed deliveries sent by the real worker to a
real local receiver, retries with a deliveries log, the address guard at creation and at delivery, the purge."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import msgspec
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from space.app import create_app
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.orgs.jobs import purge_due
from space.queue import open_outbound_queue
from space.webhooks import service
from space.webhooks.delivery import deliver
from space.webhooks.jobs import sweep_webhooks_job
from space.webhooks.models import EventType
from space.webhooks.schemas import EventData, WebhookCreate
from tests.exports.fixtures import add_tickets, create_export, in_process_worker, tuned, wait_for, wait_state
from tests.exports.limits_fixtures import tuned_api
from tests.helpers import Api, Org, UserFactory, assert_problem
from tests.orgs.fixtures import request_deletion
from tests.webhooks.receiver import receiver, verifies

PUBLIC_URL = "https://93.184.216.34/hooks"
"""A public address literal: allowed by the guard with no DNS lookup (nothing is ever sent to it here)."""
TICKET_TEXT = "Payroll of the whole company, do not leak"


@pytest.fixture(scope="module")
def private_ok(settings: Settings) -> Settings:
    """Settings that let webhooks reach this machine's receiver, and retry at once. More worker slots: entries
    other modules left in the shared queue must not keep this module's deliveries waiting."""
    return tuned(settings, webhook_allow_private=True, webhook_retry_seconds=0, worker_concurrency=4)


@pytest.fixture(scope="module")
async def local_client(private_ok: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app built with `private_ok`."""
    async with AsyncTestClient(app=create_app(private_ok)) as c:
        yield c


@pytest.fixture
def local_api(local_client: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the app that allows local webhook URLs."""
    return Api(local_client, users)


async def add_webhook(api: Api, org: Org, url: str, events: list[str]) -> dict[str, Any]:
    """The owner registers an endpoint; returns the 201 body (with its secret)."""
    r = await api.call("POST", org.path("/webhooks"), org.owner, json={"url": url, "events": events})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def attempts(api: Api, org: Org, webhook_id: str, n: int) -> list[dict[str, Any]]:
    """The deliveries log once it shows `n` attempts."""

    async def check() -> list[dict[str, Any]] | None:
        r = await api.call("GET", org.path(f"/webhooks/{webhook_id}/deliveries"), org.admin)
        assert r.status_code == 200, r.text
        items: list[dict[str, Any]] = r.json()["items"]
        return items if len(items) >= n else None

    result: list[dict[str, Any]] = await wait_for(check, f"{n} attempts in the log")
    return result


# --- how many -----------------------------------------------------------------------------------------------


async def test_an_org_holds_at_most_webhooks_per_org_endpoints(settings: Settings, users: UserFactory) -> None:
    # Every event is owed to every endpoint: the bound is what keeps one org's events from filling the lane.
    async with tuned_api(settings, users, webhooks_per_org=3) as tuned:
        org = await tuned.org()
        other = await tuned.org("Other")
        body = {"url": PUBLIC_URL, "events": ["export.completed"]}
        created = []
        for _ in range(2):
            r = await tuned.call("POST", org.path("/webhooks"), org.owner, json=body)
            assert r.status_code == 201, r.text
            created.append(r.json()["id"])
        # n-1 endpoints allowed: the third (the nth) is the last place.
        r = await tuned.call("POST", org.path("/webhooks"), org.admin, json=body)
        assert r.status_code == 201, r.text
        assert_problem(
            await tuned.call("POST", org.path("/webhooks"), org.owner, json=body), 409, "webhook_limit_reached"
        )
        # Another org has its own places; a removed endpoint frees one.
        r = await tuned.call("POST", other.path("/webhooks"), other.owner, json=body)
        assert r.status_code == 201, r.text
        r = await tuned.call("DELETE", org.path(f"/webhooks/{created[0]}"), org.owner)
        assert r.status_code == 204, r.text
        r = await tuned.call("POST", org.path("/webhooks"), org.owner, json=body)
        assert r.status_code == 201, r.text


async def test_the_default_webhook_limit_is_ten(api: Api) -> None:
    org = await api.org()
    body = {"url": PUBLIC_URL, "events": ["export.failed"]}
    for _ in range(10):
        r = await api.call("POST", org.path("/webhooks"), org.owner, json=body)
        assert r.status_code == 201, r.text
    assert_problem(await api.call("POST", org.path("/webhooks"), org.owner, json=body), 409, "webhook_limit_reached")


# --- who may manage endpoints ---------------------------------------------------------------------------------


async def test_owners_and_admins_manage_endpoints_others_may_not(api: Api) -> None:
    org = await api.org()
    other = await api.org("Other")
    for who in (org.owner, org.admin):
        r = await api.call("POST", org.path("/webhooks"), who, json={"url": PUBLIC_URL, "events": ["export.completed"]})
        assert r.status_code == 201, r.text
    created = r.json()
    assert created["secret"].startswith("whsec_") and created["events"] == ["export.completed"]
    assert set(created) == {"id", "url", "events", "secret", "createdAt"}

    for who in (org.member, org.customer):
        body = {"url": PUBLIC_URL, "events": ["export.failed"]}
        assert_problem(await api.call("POST", org.path("/webhooks"), who, json=body), 403, "forbidden")
        assert_problem(await api.call("GET", org.path("/webhooks"), who), 403, "forbidden")
        path = org.path(f"/webhooks/{created['id']}")
        assert_problem(await api.call("GET", f"{path}/deliveries", who), 403, "forbidden")
        assert_problem(await api.call("DELETE", path, who), 403, "forbidden")
    # A former member and another org's owner: the org (and its endpoint) do not exist for them.
    r = await api.call("DELETE", org.path(f"/members/{org.admin.id}"), org.owner)
    assert r.status_code == 204, r.text
    for who in (org.admin, other.owner):
        assert_problem(await api.call("GET", org.path("/webhooks"), who), 404, "not_found")
        assert_problem(await api.call("DELETE", org.path(f"/webhooks/{created['id']}"), who), 404, "not_found")
    # Another org's endpoint id, through one's own org: 404 like an unknown or malformed id.
    for webhook_id in (created["id"], str(uuid.uuid4()), "not-a-uuid"):
        assert_problem(await api.call("DELETE", other.path(f"/webhooks/{webhook_id}"), other.owner), 404, "not_found")
        r = await api.call("GET", other.path(f"/webhooks/{webhook_id}/deliveries"), other.owner)
        assert_problem(r, 404, "not_found")

    r = await api.call("GET", org.path("/webhooks"), org.owner)
    assert r.status_code == 200, r.text
    listed = r.json()["items"]
    assert len(listed) == 2 and all("secret" not in w for w in listed)
    assert created["secret"] not in r.text
    r = await api.call("GET", org.path(f"/webhooks/{created['id']}/deliveries"), org.owner)
    assert r.status_code == 200 and r.json() == {"items": []}

    r = await api.call("DELETE", org.path(f"/webhooks/{created['id']}"), org.owner)
    assert r.status_code == 204, r.text
    assert_problem(await api.call("DELETE", org.path(f"/webhooks/{created['id']}"), org.owner), 404, "not_found")
    r = await api.call("GET", org.path("/webhooks"), org.owner)
    assert [w["id"] for w in r.json()["items"]] == [listed[0]["id"]]


@pytest.mark.parametrize(
    "body",
    [
        {"url": PUBLIC_URL},
        {"events": ["export.completed"]},
        {"url": PUBLIC_URL, "events": []},
        {"url": PUBLIC_URL, "events": ["export.started"]},
        {"url": PUBLIC_URL, "events": ["export.completed"], "secret": "mine"},
        {"url": "ftp://93.184.216.34/x", "events": ["export.completed"]},
        {"url": "https://user:pw@93.184.216.34/x", "events": ["export.completed"]},
        {"url": "https://93.184.216.34:99999/x", "events": ["export.completed"]},
        {"url": "https:///nohost", "events": ["export.completed"]},
        {"url": "https://exa mple.com/", "events": ["export.completed"]},
        {"url": "https://example.com/\x00", "events": ["export.completed"]},
    ],
)
async def test_malformed_requests_are_400(api: Api, body: dict[str, Any]) -> None:
    org = await api.org()
    assert_problem(await api.call("POST", org.path("/webhooks"), org.owner, json=body), 400, "invalid_request")


# --- the address guard ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8000/hook",  # a name that resolves to 127.0.0.1
        "https://127.0.0.1/hook",
        "http://127.1.2.3/",
        "http://10.0.0.7/hook",
        "http://172.16.5.4/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data",  # link-local: the cloud's metadata service
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[fd00::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "http://100.64.0.1/hook",
    ],
)
async def test_private_addresses_are_refused_without_the_setting(api: Api, url: str) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/webhooks"), org.owner, json={"url": url, "events": ["export.completed"]})
    body = assert_problem(r, 400, "invalid_request")
    assert "url" in body["detail"]


async def test_a_name_that_does_not_resolve_is_refused(api: Api) -> None:
    org = await api.org()
    body = {"url": "https://no-such-host.invalid/hook", "events": ["export.completed"]}
    assert_problem(await api.call("POST", org.path("/webhooks"), org.owner, json=body), 400, "invalid_request")


async def test_the_setting_allows_this_machine(local_api: Api) -> None:
    org = await local_api.org()
    created = await add_webhook(local_api, org, "http://localhost:8000/hook", ["export.completed"])
    assert created["url"] == "http://localhost:8000/hook"


async def test_delivery_checks_the_address_again(local_api: Api, private_ok: Settings) -> None:
    """An endpoint stored while local addresses were allowed is refused by a worker that does not allow them:
    the attempt is logged as refused and the receiver gets nothing."""
    org = await local_api.org()
    with receiver() as rx:
        hook = await add_webhook(local_api, org, rx.url, ["org.deletion_requested"])
        async with in_process_worker(tuned(private_ok, webhook_allow_private=False)):
            await request_deletion(local_api, org)
            log = await attempts(local_api, org, hook["id"], 1)
        assert rx.count == 0
    assert len(log) == 1
    assert log[0]["status"] == "failed" and log[0]["responseCode"] is None
    assert log[0]["error"].startswith("refused:") and "127.0.0.1" in log[0]["error"]


# --- signed deliveries by the real worker ---------------------------------------------------------------------


async def test_export_completed_is_signed_and_holds_no_content(
    local_api: Api, db: Database, private_ok: Settings
) -> None:
    org = await local_api.org()
    await add_tickets(db, org.id, org.member, [TICKET_TEXT])
    with receiver() as rx:
        hook = await add_webhook(local_api, org, rx.url, ["export.completed"])
        other = await add_webhook(local_api, org, rx.url, ["export.failed"])
        async with in_process_worker(private_ok):
            export = await create_export(local_api, org, org.member, {"kind": "tickets_csv"})
            done = await wait_state(local_api, org, org.member, export["id"], {"completed", "failed"})
            assert done["state"] == "completed", done
            got = await rx.next()
            log = await attempts(local_api, org, hook["id"], 1)
        assert rx.count == 1  # the export.failed endpoint was owed nothing
    assert got.path == "/hooks/space"
    assert got.headers["content-type"] == "application/json"
    assert verifies(hook["secret"], got)
    assert not verifies(other["secret"], got)
    event = json.loads(got.body)
    assert event["id"] == got.headers["webhook-id"]
    assert event["type"] == "export.completed"
    assert event["data"] == {"orgId": org.id, "exportId": export["id"], "kind": "tickets_csv", "state": "completed"}
    assert set(event) == {"id", "type", "createdAt", "data"}
    assert TICKET_TEXT.encode() not in got.body and b"token" not in got.body and b"/result" not in got.body
    assert [(a["attempt"], a["status"], a["responseCode"], a["type"]) for a in log] == [
        (1, "succeeded", 200, "export.completed")
    ]
    assert log[0]["eventId"] == event["id"]


async def test_export_failed_carries_the_error_code(local_api: Api, db: Database, private_ok: Settings) -> None:
    org = await local_api.org()
    await add_tickets(db, org.id, org.member, ["one", "two"])
    with receiver() as rx:
        hook = await add_webhook(local_api, org, rx.url, ["export.failed", "export.completed"])
        async with in_process_worker(tuned(private_ok, export_row_limit=1)):
            export = await create_export(local_api, org, org.member, {"kind": "tickets_csv"})
            done = await wait_state(local_api, org, org.member, export["id"], {"completed", "failed"})
            got = await rx.next()
    assert done["errorCode"] == "too_many_rows"
    assert verifies(hook["secret"], got)
    event = json.loads(got.body)
    assert event["type"] == "export.failed"
    assert event["data"] == {
        "orgId": org.id,
        "exportId": export["id"],
        "kind": "tickets_csv",
        "state": "failed",
        "errorCode": "too_many_rows",
    }


async def test_a_failing_receiver_gets_retried_and_the_log_shows_each_attempt(
    local_api: Api, private_ok: Settings
) -> None:
    org = await local_api.org()
    with receiver([500, 500, 200]) as rx:
        hook = await add_webhook(local_api, org, rx.url, ["org.deletion_requested"])
        async with in_process_worker(private_ok):
            await request_deletion(local_api, org)
            received = [await rx.next() for _ in range(3)]
            log = await attempts(local_api, org, hook["id"], 3)
        assert rx.count == 3
    # One message, sent three times: same id and body, each attempt signed (and verifiable) on its own.
    assert len({r.headers["webhook-id"] for r in received}) == 1
    assert len({r.body for r in received}) == 1
    assert all(verifies(hook["secret"], r) for r in received)
    event = json.loads(received[0].body)
    assert event["type"] == "org.deletion_requested" and event["data"] == {"orgId": org.id}
    assert [(a["attempt"], a["status"], a["responseCode"]) for a in log] == [
        (3, "succeeded", 200),
        (2, "failed", 500),
        (1, "failed", 500),
    ]
    assert {a["eventId"] for a in log} == {event["id"]}


async def test_a_receiver_that_never_succeeds_gets_five_attempts(
    local_api: Api, private_ok: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await local_api.org()
    with receiver([503] * 10) as rx:
        hook = await add_webhook(local_api, org, rx.url, ["org.deletion_requested"])
        async with in_process_worker(private_ok):
            await request_deletion(local_api, org)
            log = await attempts(local_api, org, hook["id"], 5)
        assert rx.count == 5
    assert [a["attempt"] for a in log] == [5, 4, 3, 2, 1]
    assert all(a["status"] == "failed" and a["responseCode"] == 503 for a in log)
    row = owner.execute(
        "SELECT state, attempts, finished_at IS NOT NULL FROM webhook_deliveries WHERE endpoint_id = %s", (hook["id"],)
    ).fetchone()
    assert row == ("failed", 5, True)


# --- the purge ------------------------------------------------------------------------------------------------


async def test_the_purge_removes_webhook_rows_with_the_org(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    keep = await api0.org("Kept")
    for o in (org, keep):
        # Stored directly through the service: this app does not allow local URLs, and nothing is sent here.
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(o.id))) as uow:
            data = msgspec.convert(
                {"url": "http://127.0.0.1:9/closed", "events": ["org.deletion_requested"]}, WebhookCreate
            )
            await service.create_webhook(uow.session, uuid.UUID(o.id), o.owner.id, data, allow_private=True, limit=10)
    await request_deletion(api0, org)
    counts = lambda table, oid: owner.execute(  # noqa: E731
        f"SELECT count(*) FROM {table} WHERE org_id = %s", (oid,)
    ).fetchone()[0]  # type: ignore[index]
    assert counts("webhook_endpoints", org.id) == 1 and counts("webhook_deliveries", org.id) == 1
    results = [r for r in await purge_due(settings0, db) if str(r.org_id) == org.id]
    assert len(results) == 1
    assert results[0].counts["webhook_endpoints"] == 1 and results[0].counts["webhook_deliveries"] == 1
    assert "webhook_attempts" in results[0].counts
    for table in ("webhook_endpoints", "webhook_deliveries", "webhook_attempts"):
        assert counts(table, org.id) == 0
    assert counts("webhook_endpoints", keep.id) == 1


async def test_a_failed_attempt_waits_its_backoff(
    local_api: Api, db: Database, private_ok: Settings, owner: psycopg.Connection[Any]
) -> None:
    """The attempt is made by the delivery code itself (no queue): after a 500 the delivery is pending again,
    due one backoff later by the database clock."""
    org = await local_api.org()
    with receiver([500]) as rx:
        hook = await add_webhook(local_api, org, rx.url, ["org.deletion_requested"])
        await request_deletion(local_api, org)
        (delivery_id,) = owner.execute(
            "SELECT id FROM webhook_deliveries WHERE endpoint_id = %s", (hook["id"],)
        ).fetchone()  # type: ignore[misc]
        slow = tuned(private_ok, webhook_retry_seconds=30)
        assert await deliver(slow, db, None, delivery_id, uuid.UUID(org.id)) == "retrying"
        assert rx.count == 1
    row = owner.execute(
        "SELECT state, attempts, next_attempt_at - clock_timestamp() > interval '25 seconds',"
        " next_attempt_at - clock_timestamp() <= interval '30 seconds'"
        " FROM webhook_deliveries WHERE id = %s",
        (delivery_id,),
    ).fetchone()
    assert row == ("pending", 1, True, True)


async def test_the_sweeper_sends_a_delivery_whose_enqueue_was_lost(
    local_api: Api, db: Database, private_ok: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await local_api.org()
    oid = uuid.UUID(org.id)
    with receiver() as rx:
        hook = await add_webhook(local_api, org, rx.url, ["export.failed"])
        # Owed with no queue: as if the enqueue after the commit had failed.
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
            data = EventData(org_id=oid, export_id=uuid.uuid4(), state="failed", error_code="worker_lost")
            assert await service.emit(uow, None, EventType.export_failed, data) == 1
        # The sweeper runs in the outbound lane: its queue is the one it enqueues on.
        queue = await open_outbound_queue(private_ok, db, application_name="space-tests-sweeper")
        await queue.connect()
        try:
            ctx = {"db": db, "worker": SimpleNamespace(queue=queue)}
            (delivery_id,) = owner.execute(
                "SELECT id FROM webhook_deliveries WHERE endpoint_id = %s", (hook["id"],)
            ).fetchone()  # type: ignore[misc]
            assert delivery_id not in await due(db)  # not overdue yet: its entry may still be on its way
            owner.execute(
                "UPDATE webhook_deliveries SET next_attempt_at = now() - interval '2 minutes' WHERE id = %s",
                (delivery_id,),
            )
            assert delivery_id in await due(db)
            assert (await sweep_webhooks_job(ctx))["enqueued"] >= 1
            async with in_process_worker(private_ok):
                got = await rx.next()
                await attempts(local_api, org, hook["id"], 1)
        finally:
            await queue.disconnect()
    assert verifies(hook["secret"], got)
    assert json.loads(got.body)["data"]["errorCode"] == "worker_lost"
    assert delivery_id not in await due(db)


async def due(db: Database) -> set[uuid.UUID]:
    """What the sweeper's function finds, read as the app role."""
    async with UnitOfWork(db.sessionmaker) as uow:
        rows = await uow.session.execute(text("SELECT delivery_id FROM space_webhooks_due_deliveries(1000)"))
        return set(rows.scalars())
