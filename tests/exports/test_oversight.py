"""Oversight (SPEC §12): owners and admins see every export and stop any of them, never download another member's;
a role change or removal cancels at once what the member's new role can't hold, and the running worker stops."""

from __future__ import annotations

import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    Gate,
    add_project,
    add_tickets,
    background,
    chunk_count,
    create_export,
    download,
    job_row,
    runner,
    snapshot,
    tuned,
    uid,
    wait_for,
)
from tests.helpers import Api, Org, assert_problem
from tests.helpers import TestUser as User


async def _former_member(api: Api, org: Org) -> User:
    """A user who was a member of the org (their own export stays behind) and has been removed."""
    former = await api.users.make("former")
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": former.email, "role": "member"})
    assert r.status_code == 201, r.text
    r = await api.call("DELETE", org.path(f"/members/{former.id}"), org.owner)
    assert r.status_code == 204, r.text
    return former


async def test_org_wide_list_for_owners_and_admins_only(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.customer, ["mine"])
    by_member = await create_export(api, org, org.member, {"kind": "snapshot"})
    by_customer = await create_export(api, org, org.customer, {"kind": "tickets_csv"})
    assert await run_export(runner(settings, db), uid(by_customer["id"]), uid(org.id)) == "completed"
    by_admin = await create_export(api, org, org.admin, {"kind": "tickets_csv"})
    assert await run_export(runner(settings, db), uid(by_admin["id"]), uid(org.id)) == "completed"
    former = await _former_member(api, org)

    for who in [org.owner, org.admin]:
        r = await api.call("GET", org.path("/exports?scope=org"), who)
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        # Every member's, newest first, each naming its creator.
        assert [i["id"] for i in items] == [by_admin["id"], by_customer["id"], by_member["id"]]
        creators = {i["id"]: i["creator"] for i in items}
        assert creators[by_member["id"]] == {"userId": str(org.member.id), "name": org.member.name}
        assert creators[by_customer["id"]] == {"userId": str(org.customer.id), "name": org.customer.name}
        # Metadata only: only the creator could download, so only the admin's own export says so, to the admin.
        downloadable = {i["id"] for i in items if i["canDownload"]}
        assert downloadable == ({by_admin["id"]} if who is org.admin else set())
    for who in [org.member, org.customer]:
        assert_problem(await api.call("GET", org.path("/exports?scope=org"), who), 403, "forbidden")
    assert_problem(await api.call("GET", org.path("/exports?scope=org"), former), 404, "not_found")
    # The default list stays the caller's own.
    own = (await api.call("GET", org.path("/exports"), org.admin)).json()["items"]
    assert [i["id"] for i in own] == [by_admin["id"]] and "creator" not in own[0]
    assert_problem(await api.call("GET", org.path("/exports?scope=everyone"), org.owner), 400, "invalid_request")


@pytest.mark.parametrize("manager", ["owner", "admin"])
async def test_admin_cancels_a_running_export_and_the_worker_publishes_nothing(
    api: Api, db: Database, settings: Settings, manager: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b", "c"])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    eid, oid = uid(export["id"]), uid(org.id)
    gate = Gate({"batch"})
    async with background(run_export(runner(_small(settings), db), eid, oid, gate=gate), gate) as w:
        await gate.reached("batch")  # mid-read: one batch stored, two to go
        await wait_for(lambda: _some_chunks(db, org.id, export["id"]), "the first chunks to be stored")
        r = await api.call("DELETE", org.path(f"/exports/{export['id']}"), getattr(org, manager))
        assert r.status_code == 204, r.text
        cancelled = snapshot(await job_row(db, org.id, eid))
        assert (cancelled["state"], cancelled["error_code"]) == ("cancelled", "cancelled_by_admin")
        gate.open_all()
        assert await w == "lease_lost"
    assert snapshot(await job_row(db, org.id, eid)) == cancelled
    assert await chunk_count(db, org.id, eid) == 0
    body = assert_problem(await download(api, org, org.member, export["id"]), 409, "export_failed")
    assert body["errorCode"] == "cancelled_by_admin"
    # The owner still sees it, cancelled, with the reason.
    status = (await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)).json()
    assert (status["state"], status["errorCode"], status["canDownload"]) == ("cancelled", "cancelled_by_admin", False)


async def test_admin_removes_a_completed_result_and_its_owner_gets_410(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    await add_project(db, org.id, "p", ["t"])
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    eid = export["id"]
    assert await run_export(runner(settings, db), uid(eid), uid(org.id)) == "completed"
    assert (await download(api, org, org.member, eid)).status_code == 200
    # The admin can never take the content, only take it away.
    assert_problem(await download(api, org, org.admin, eid), 404, "not_found")
    r = await api.call("DELETE", org.path(f"/exports/{eid}"), org.admin)
    assert r.status_code == 204, r.text
    assert_problem(await download(api, org, org.member, eid), 410, "export_revoked")
    await wait_for(lambda: _no_chunks(db, org.id, eid), "the revoked result's chunks to go")
    status = (await api.call("GET", org.path(f"/exports/{eid}"), org.member)).json()
    assert (status["state"], status["errorCode"], status["canDownload"]) == ("completed", "export_revoked", False)
    # Again: nothing left to take away, still 204; the owner's answer stays 410 export_revoked.
    assert (await api.call("DELETE", org.path(f"/exports/{eid}"), org.owner)).status_code == 204
    assert_problem(await download(api, org, org.member, eid), 410, "export_revoked")
    # The owner may still delete it from their list.
    assert (await api.call("DELETE", org.path(f"/exports/{eid}"), org.member)).status_code == 204
    assert_problem(await api.call("GET", org.path(f"/exports/{eid}"), org.member), 404, "not_found")


async def _no_chunks(db: Database, org_id: str, export_id: str) -> bool:
    return await chunk_count(db, org_id, export_id) == 0


async def _some_chunks(db: Database, org_id: str, export_id: str) -> bool:
    return await chunk_count(db, org_id, export_id) > 0


def _small(settings: Settings) -> Settings:
    # One ticket per batch and tiny chunks: the paused worker has stored chunks that must not outlive its cancel.
    return tuned(settings, export_batch_rows=1, export_chunk_bytes=16)


async def test_admin_matrix_over_list_cancel_and_download(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_project(db, org.id, "p", ["t"])
    former = await _former_member(api, org)
    # Someone else's export, in each state the matrix needs: completed (download), queued (cancel).
    done = await create_export(api, org, org.member, {"kind": "snapshot"})
    assert await run_export(runner(settings, db), uid(done["id"]), uid(org.id)) == "completed"
    people = {"owner": org.owner, "admin": org.admin, "customer": org.customer, "former": former}
    allowed = {"owner": 200, "admin": 200, "customer": 403, "former": 404}
    for role, who in people.items():
        r = await api.call("GET", org.path("/exports?scope=org"), who)
        assert r.status_code == allowed[role], (role, r.text)
        # Nobody but its creator downloads an export, whatever their role.
        assert_problem(await download(api, org, who, done["id"]), 404, "not_found")
    # A member (not the creator) is answered like anyone without the export: list 403, cancel and download 404.
    other = await api.users.make("colleague")
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": other.email, "role": "member"})
    assert r.status_code == 201
    assert_problem(await api.call("GET", org.path("/exports?scope=org"), other), 403, "forbidden")
    assert_problem(await download(api, org, other, done["id"]), 404, "not_found")
    for role in ["customer", "former"]:
        queued = await create_export(api, org, org.member, {"kind": "snapshot"})
        assert_problem(await api.call("DELETE", org.path(f"/exports/{queued['id']}"), people[role]), 404, "not_found")
        assert_problem(await api.call("DELETE", org.path(f"/exports/{queued['id']}"), other), 404, "not_found")
        assert (await job_row(db, org.id, queued["id"])).state == "queued"
        # Owners and admins stop it.
        manager = org.owner if role == "customer" else org.admin
        assert (await api.call("DELETE", org.path(f"/exports/{queued['id']}"), manager)).status_code == 204
        job = await job_row(db, org.id, queued["id"])
        assert (job.state, job.error_code) == ("cancelled", "cancelled_by_admin")
    # Unknown and malformed ids stay 404 for admins too.
    for export_id in ["00000000-0000-0000-0000-000000000000", "nope"]:
        assert_problem(await api.call("DELETE", org.path(f"/exports/{export_id}"), org.admin), 404, "not_found")


@pytest.mark.parametrize("change", ["demote", "remove"])
async def test_revocation_cancels_at_once_and_the_paused_worker_publishes_nothing(
    api: Api, db: Database, settings: Settings, change: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b", "c"])
    running = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    queued = await create_export(api, org, org.member, {"kind": "snapshot"})
    eid, oid = uid(running["id"]), uid(org.id)
    gate = Gate({"batch"})
    async with background(run_export(runner(_small(settings), db), eid, oid, gate=gate), gate) as w:
        await gate.reached("batch")  # the worker is paused mid-read
        await wait_for(lambda: _some_chunks(db, org.id, running["id"]), "the first chunks to be stored")
        if change == "demote":
            r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "customer"})
            assert r.status_code == 200, r.text
        else:
            r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
            assert r.status_code == 204, r.text
        # Cancelled by the change's own transaction, while the worker still sleeps.
        for export in (running, queued):
            job = await job_row(db, org.id, export["id"])
            assert (job.state, job.error_code) == ("cancelled", "access_revoked"), export["id"]
        after_change = snapshot(await job_row(db, org.id, eid))
        gate.open_all()
        assert await w == "lease_lost"
    # The worker wrote nothing more: no progress, no failure, no publish; its chunks are gone.
    assert snapshot(await job_row(db, org.id, eid)) == after_change
    assert "before_publish" not in gate.seen
    assert await chunk_count(db, org.id, eid) == 0
    assert await run_export(runner(settings, db), uid(queued["id"]), oid) == "not_claimed"
    assert_problem(await download(api, org, org.member, running["id"]), 403, "access_revoked")


async def test_role_changes_cancel_only_what_the_new_role_cannot_hold(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    team = await create_export(api, org, org.member, {"kind": "snapshot"})
    own = await create_export(api, org, org.customer, {"kind": "tickets_csv"})
    done = await create_export(api, org, org.admin, {"kind": "snapshot"})
    assert await run_export(runner(settings, db), uid(done["id"]), uid(org.id)) == "completed"

    async def role(user: User, new: str) -> None:
        r = await api.call("PATCH", org.path(f"/members/{user.id}"), org.owner, json={"role": new})
        assert r.status_code == 200, r.text

    # Staff to staff keeps a team export; a customer promoted keeps their own-scope one.
    await role(org.member, "admin")
    await role(org.customer, "member")
    assert (await job_row(db, org.id, team["id"])).state == "queued"
    assert (await job_row(db, org.id, own["id"])).state == "queued"
    # Back to customer: own scope is still theirs to hold.
    await role(org.customer, "customer")
    assert (await job_row(db, org.id, own["id"])).state == "queued"
    # Demoted to customer: the team export goes. A finished one is left alone (its download is refused: §6).
    await role(org.admin, "customer")
    assert (await job_row(db, org.id, done["id"])).state == "completed"
    assert_problem(await download(api, org, org.admin, done["id"]), 403, "access_revoked")
    await role(org.member, "customer")
    job = await job_row(db, org.id, team["id"])
    assert (job.state, job.error_code) == ("cancelled", "access_revoked")
    # Removed: even their own-scope export goes.
    r = await api.call("DELETE", org.path(f"/members/{org.customer.id}"), org.owner)
    assert r.status_code == 204
    job = await job_row(db, org.id, own["id"])
    assert (job.state, job.error_code) == ("cancelled", "access_revoked")
