"""The export part of the HTTP contract: every status code, problem code and header of SPEC §4-§6."""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    Gate,
    add_tickets,
    background,
    chunk_count,
    create_export,
    download,
    job_row,
    runner,
    set_org_state,
    tuned,
    uid,
    wait_for,
)
from tests.helpers import Api, UserFactory, assert_problem

CSV = {"kind": "tickets_csv"}
SNAPSHOT = {"kind": "snapshot"}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"kind": "pdf"},
        {"kind": "snapshot", "filters": {}},
        {"kind": "tickets_csv", "extra": True},
        {"kind": "tickets_csv", "filters": {"colour": "red"}},
        {"kind": "tickets_csv", "filters": {"status": "done"}},
        {"kind": "tickets_csv", "filters": {"priority": "asap"}},
        {"kind": "tickets_csv", "filters": {"assignment": "theirs"}},
        {"kind": "tickets_csv", "filters": {"q": "x" * 201}},
        {"kind": "tickets_csv", "filters": {"q": "nul\x00byte"}},
        {"kind": "tickets_csv", "delimiter": "|"},
        {"kind": "tickets_csv", "filters": []},
        {"kind": 1},
        [],
        "snapshot",
    ],
)
async def test_create_rejects_bad_input(api: Api, body: Any) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/exports"), org.member, json=body)
    assert_problem(r, 400, "invalid_request")


async def test_create_rejects_malformed_bodies(api: Api) -> None:
    org = await api.org()
    for raw in (b"{", b'{"kind": "snapshot"} trailing', b"\xff\xfe", b"null", b'{"kind": "snapshot", "kind": 3}'):
        r = await api.call(
            "POST", org.path("/exports"), org.member, content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400, (raw, r.status_code, r.text)
    r = await api.call("POST", org.path("/exports"), org.member, content=b"x" * (2 * 1024 * 1024))
    assert 400 <= r.status_code < 500


async def test_create_answers(api: Api, users: UserFactory) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/exports"), None, json=SNAPSHOT)
    assert_problem(r, 401, "unauthenticated")
    stranger = await users.make("stranger")
    assert_problem(await api.call("POST", org.path("/exports"), stranger, json=SNAPSHOT), 404, "not_found")
    assert_problem(await api.call("POST", "/orgs/not-a-uuid/exports", org.owner, json=SNAPSHOT), 404, "not_found")
    assert_problem(await api.call("POST", org.path("/exports"), org.customer, json=SNAPSHOT), 403, "forbidden")

    export = await create_export(api, org, org.customer, {**CSV, "filters": {"q": "x" * 200, "status": "open"}})
    assert export["scope"] == "own" and export["filters"] == {"q": "x" * 200, "status": "open"}
    assert export["kind"] == "tickets_csv" and export["state"] == "queued" and export["progress"] == 0
    assert export["delimiter"] == ","
    assert set(export) == {
        "id",
        "kind",
        "state",
        "progress",
        "errorCode",
        "errorDetail",
        "filters",
        "delimiter",
        "scope",
        "createdAt",
        "startedAt",
        "snapshotAt",
        "completedAt",
        "expiresAt",
        "rowCount",
        "byteSize",
        "sha256",
        "canDownload",
        # SPEC §21: the schedule that made it, and an incremental run's start (none here).
        "scheduleId",
        "since",
        "sinceExportId",
        "delivery",
    }
    assert (export["scheduleId"], export["since"], export["sinceExportId"]) == (None, None, None)
    export = await create_export(api, org, org.member, SNAPSHOT)
    assert export["scope"] == "team" and export["filters"] == {}

    await set_org_state(api.users.db, org.id, "suspended")
    export = await create_export(api, org, org.admin, {**CSV, "delimiter": ";"})  # data portability
    assert export["delimiter"] == ";"
    await set_org_state(api.users.db, org.id, "deleting")
    assert_problem(await api.call("POST", org.path("/exports"), org.owner, json=SNAPSHOT), 409, "org_deleting")


async def test_ten_concurrent_creates_give_three_accepted(api: Api) -> None:
    org = await api.org()
    responses = await api.concurrently([("POST", org.path("/exports"), org.member, CSV)] * 10)
    codes = sorted(r.status_code for r in responses)
    assert codes == [202] * 3 + [429] * 7, codes
    for r in responses:
        if r.status_code == 429:
            assert_problem(r, 429, "export_rate_limited")
            assert int(r.headers["retry-after"]) >= 1
    # Per user and org: another member is not limited by it.
    assert (await api.call("POST", org.path("/exports"), org.admin, json=CSV)).status_code == 202


async def test_rate_limit_counts_recent_finished_and_deleted(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    ids = [(await create_export(api, org, org.member, CSV))["id"] for _ in range(3)]
    for export_id in ids:
        assert await run_export(runner(settings, db), uid(export_id), uid(org.id)) == "completed"
        r = await api.call("DELETE", org.path(f"/exports/{export_id}"), org.member)
        assert r.status_code == 204
    # Finished and even deleted, but created within the minute: still counted.
    r = await api.call("POST", org.path("/exports"), org.member, json=CSV)
    body = assert_problem(r, 429, "export_rate_limited")
    assert 1 <= int(r.headers["retry-after"]) <= 60, body


async def test_list_and_get_show_own_exports_only(api: Api) -> None:
    org = await api.org()
    first = await create_export(api, org, org.member, CSV)
    second = await create_export(api, org, org.member, SNAPSHOT)
    theirs = await create_export(api, org, org.admin, SNAPSHOT)
    r = await api.call("GET", org.path("/exports"), org.member)
    assert r.status_code == 200
    assert [e["id"] for e in r.json()["items"]] == [second["id"], first["id"]]
    r = await api.call("GET", org.path("/exports"), org.owner)
    assert r.json() == {"items": []}
    r = await api.call("GET", org.path(f"/exports/{first['id']}"), org.member)
    assert r.status_code == 200 and r.json()["id"] == first["id"]
    # Not even the owner of the org sees another person's export.
    assert_problem(await api.call("GET", org.path(f"/exports/{theirs['id']}"), org.owner), 404, "not_found")


async def test_idor_matrix(api: Api) -> None:
    a = await api.org("A")
    b = await api.org("B")
    own = await create_export(api, a, a.member, CSV)
    other_user = await create_export(api, a, a.admin, CSV)
    other_org = await create_export(api, b, b.member, CSV)
    unknown = str(uuid.uuid4())
    refused = [
        (a, other_user["id"]),
        (a, other_org["id"]),
        (a, unknown),
        (a, "not-a-uuid"),
        (a, "%00"),
        (b, other_org["id"]),  # another org's path: a.member is no member there
        (b, own["id"]),
        (b, unknown),
        (b, "not-a-uuid"),
    ]
    bodies = []
    for org, export_id in refused:
        for method, suffix in (("GET", ""), ("GET", "/result"), ("DELETE", "")):
            r = await api.call(method, org.path(f"/exports/{export_id}{suffix}"), a.member)
            bodies.append(assert_problem(r, 404, "not_found"))
    assert all(body == bodies[0] for body in bodies), "every refusal must look the same"
    # The refused deletes changed nothing; the caller's own export answers normally.
    for org, export_id, owner in ((a, other_user["id"], a.admin), (b, other_org["id"], b.member)):
        r = await api.call("GET", org.path(f"/exports/{export_id}"), owner)
        assert r.status_code == 200 and r.json()["state"] == "queued"
    assert (await api.call("GET", a.path(f"/exports/{own['id']}"), a.member)).status_code == 200
    assert_problem(await api.call("GET", a.path(f"/exports/{own['id']}/result"), a.member), 409, "export_not_ready")


async def test_result_route_answers_in_order(api: Api, db: Database, settings: Settings, users: UserFactory) -> None:
    org = await api.org("Headers Ltd")
    await add_tickets(db, org.id, org.member, ["one", "two"])
    oid = uid(org.id)
    path = lambda e: org.path(f"/exports/{e['id']}/result")  # noqa: E731

    ready = await create_export(api, org, org.member, CSV)
    # 401 comes first, for any export.
    assert_problem(await api.call("GET", path(ready)), 401, "unauthenticated")
    r = await api.call("GET", path(ready), headers={"Authorization": "Bearer spc_not-a-real-token"})
    assert_problem(r, 401, "unauthenticated")

    # Queued, then running: 409 export_not_ready with Retry-After.
    r = await api.call("GET", path(ready), org.member)
    assert_problem(r, 409, "export_not_ready")
    assert int(r.headers["retry-after"]) > 0
    gate = Gate({"batch"})
    async with background(
        run_export(runner(tuned(settings, export_batch_rows=1), db), uid(ready["id"]), oid, gate=gate), gate
    ) as w:
        await gate.reached("batch")
        r = await api.call("GET", path(ready), org.member)
        assert_problem(r, 409, "export_not_ready")
        assert int(r.headers["retry-after"]) > 0
        gate.open_all()
        assert await w == "completed"

    # 200 with every header of §6.
    r = await api.call("GET", path(ready), org.member)
    assert r.status_code == 200, r.text
    job = await job_row(db, org.id, ready["id"])
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{ready["id"]}.csv"'
    assert r.headers["cache-control"] == "private, no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert int(r.headers["content-length"]) == len(r.content) == job.byte_size
    assert r.headers["etag"] == f'"{job.sha256}"' == f'"{hashlib.sha256(r.content).hexdigest()}"'
    status = (await api.call("GET", org.path(f"/exports/{ready['id']}"), org.member)).json()
    assert status["canDownload"] is True and status["sha256"] == job.sha256 and status["byteSize"] == job.byte_size

    snap = await create_export(api, org, org.admin, SNAPSHOT)
    await run_export(runner(settings, db), uid(snap["id"]), oid)
    r = await api.call("GET", path(snap), org.admin)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{snap["id"]}.json"'

    # Failed: 409 export_failed with the job's errorCode. Cancelled likewise.
    failed = await create_export(api, org, org.owner, CSV)
    await run_export(runner(tuned(settings, export_row_limit=1), db), uid(failed["id"]), oid)
    body = assert_problem(await api.call("GET", path(failed), org.owner), 409, "export_failed")
    assert body["errorCode"] == "too_many_rows"
    cancelled = await create_export(api, org, org.owner, CSV)
    assert (await api.call("DELETE", org.path(f"/exports/{cancelled['id']}"), org.owner)).status_code == 204
    body = assert_problem(await api.call("GET", path(cancelled), org.owner), 409, "export_failed")
    assert body["errorCode"] == "cancelled"

    # A former member: 403 access_revoked (before any state check), not 404.
    assert (await api.call("DELETE", org.path(f"/members/{org.admin.id}"), org.owner)).status_code == 204
    assert_problem(await api.call("GET", path(snap), org.admin), 403, "access_revoked")
    # ... but the status route and list are a member's: 404 for them now.
    assert_problem(await api.call("GET", org.path(f"/exports/{snap['id']}"), org.admin), 404, "not_found")

    # A team export whose owner became a customer: 403 access_revoked.
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "customer"})
    assert r.status_code == 200
    assert_problem(await api.call("GET", path(ready), org.member), 403, "access_revoked")
    assert (await api.call("GET", org.path(f"/exports/{ready['id']}"), org.member)).json()["canDownload"] is False

    # Own-scope export of a customer: still theirs. Then the org starts deleting: 409 for every download.
    own = await create_export(api, org, org.customer, CSV)
    await run_export(runner(settings, db), uid(own["id"]), oid)
    assert (await api.call("GET", path(own), org.customer)).status_code == 200
    await set_org_state(db, org.id, "deleting")
    assert_problem(await api.call("GET", path(own), org.customer), 409, "org_deleting")
    # The refusals before it keep their place in the order.
    assert_problem(await api.call("GET", path(ready), org.member), 403, "access_revoked")
    stranger = await users.make("stranger")
    assert_problem(await api.call("GET", path(own), stranger), 404, "not_found")


async def test_expired_result_is_410_before_any_cleanup(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["short-lived"])
    export = await create_export(api, org, org.member, CSV)
    ttl = tuned(settings, export_ttl_seconds=0.5)
    assert await run_export(runner(ttl, db), uid(export["id"]), uid(org.id)) == "completed"
    job = await job_row(db, org.id, export["id"])
    assert job.expires_at is not None and job.completed_at is not None
    assert (job.expires_at - job.completed_at).total_seconds() == pytest.approx(0.5)

    async def expired() -> bool:
        r = await download(api, org, org.member, export["id"])
        return r.status_code == 410

    await wait_for(expired, "the result to expire")
    assert_problem(await download(api, org, org.member, export["id"]), 410, "export_expired")
    # The bytes are still there (no cleanup ran): expiry alone decides.
    assert await chunk_count(db, org.id, export["id"]) > 0
    assert (await job_row(db, org.id, export["id"])).purged_at is None
    status = (await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)).json()
    assert status["canDownload"] is False and status["state"] == "completed"


async def test_delete_cancels_or_removes(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b"])
    oid = uid(org.id)

    queued = await create_export(api, org, org.member, CSV)
    assert (await api.call("DELETE", org.path(f"/exports/{queued['id']}"), org.member)).status_code == 204
    status = (await api.call("GET", org.path(f"/exports/{queued['id']}"), org.member)).json()
    assert (status["state"], status["errorCode"]) == ("cancelled", "cancelled")
    assert await run_export(runner(settings, db), uid(queued["id"]), oid) == "not_claimed"

    running = await create_export(api, org, org.member, CSV)
    gate = Gate({"batch"})
    async with background(
        run_export(runner(tuned(settings, export_batch_rows=1), db), uid(running["id"]), oid, gate=gate), gate
    ) as w:
        await gate.reached("batch")
        assert (await api.call("DELETE", org.path(f"/exports/{running['id']}"), org.member)).status_code == 204
        gate.open_all()
        assert await w == "lease_lost"  # its next fenced write found the export cancelled
    job = await job_row(db, org.id, running["id"])
    assert (job.state, job.error_code, job.sha256) == ("cancelled", "cancelled", None)

    done = await create_export(api, org, org.member, CSV)
    await run_export(runner(settings, db), uid(done["id"]), oid)
    assert await chunk_count(db, org.id, done["id"]) > 0
    assert (await api.call("DELETE", org.path(f"/exports/{done['id']}"), org.member)).status_code == 204
    assert_problem(await api.call("GET", org.path(f"/exports/{done['id']}"), org.member), 404, "not_found")
    assert_problem(await download(api, org, org.member, done["id"]), 404, "not_found")
    assert_problem(await api.call("DELETE", org.path(f"/exports/{done['id']}"), org.member), 404, "not_found")
    assert done["id"] not in [
        e["id"] for e in (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    ]
    assert await chunk_count(db, org.id, done["id"]) == 0
