"""Organization lifecycle: the transition table by role, each state's effects on reads and writes, deletion
requests and the final-export rule. The purge is in test_purge.py; exports in each state in
tests/exports/test_lifecycle.py."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest

from space.config import Settings
from space.db import Database
from space.orgs.jobs import purge_due
from tests.exports.fixtures import insert_export
from tests.helpers import Api, UserFactory, assert_problem
from tests.orgs.fixtures import SKIP, assert_gone, org_row, request_deletion, seed

# --- transitions ------------------------------------------------------------------------------------------


async def test_owner_walks_every_allowed_and_refused_transition(api: Api) -> None:
    org = await api.org()
    o = org.owner

    async def ok(method: str, suffix: str, status: int, state: str, **kw: Any) -> dict[str, Any]:
        r = await api.call(method, org.path(suffix), o, **kw)
        assert r.status_code == status, r.text
        body: dict[str, Any] = r.json()
        assert body["state"] == state and body["id"] == org.id, body
        got = await api.call("GET", org.path(), o)
        assert got.json()["state"] == state
        return body

    async def refused(method: str, suffix: str, **kw: Any) -> None:
        before = (await api.call("GET", org.path(), o)).json()
        assert_problem(await api.call(method, org.path(suffix), o, **kw), 409, "invalid_transition")
        assert (await api.call("GET", org.path(), o)).json() == before

    deletion = {"json": {"confirm": "Acme", **SKIP}}
    # active: reactivate and cancel are refused.
    await refused("POST", "/reactivate")
    await refused("DELETE", "/deletion")
    # active -> suspended; suspended refuses suspend and cancel.
    await ok("POST", "/suspend", 200, "suspended")
    await refused("POST", "/suspend")
    await refused("DELETE", "/deletion")
    # suspended -> active.
    await ok("POST", "/reactivate", 200, "active")
    # active -> deleting -> (cancel) active.
    body = await ok("POST", "/deletion", 202, "deleting", **deletion)
    assert body["deleteAfter"] is not None
    await refused("POST", "/suspend")
    await refused("POST", "/reactivate")
    await refused("POST", "/deletion", **deletion)
    body = await ok("DELETE", "/deletion", 200, "active")
    assert body["deleteAfter"] is None
    # suspended -> deleting -> (cancel) suspended: cancel returns to the state before the request.
    await ok("POST", "/suspend", 200, "suspended")
    await ok("POST", "/deletion", 202, "deleting", **deletion)
    body = await ok("DELETE", "/deletion", 200, "suspended")
    assert body["deleteAfter"] is None
    await ok("POST", "/reactivate", 200, "active")


@pytest.mark.parametrize("role", ["admin", "member", "customer"])
async def test_only_owners_change_state(api: Api, users: UserFactory, role: str) -> None:
    org = await api.org()
    caller = getattr(org, role)
    outsider = await users.make("outsider")
    deletion = {"confirm": "Acme", **SKIP}
    for state_setup in ["active", "suspended", "deleting"]:
        if state_setup == "suspended":
            assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
        if state_setup == "deleting":
            assert (await api.call("POST", org.path("/deletion"), org.owner, json=deletion)).status_code == 202
        for method, suffix, kw in [
            ("POST", "/suspend", {}),
            ("POST", "/reactivate", {}),
            ("POST", "/deletion", {"json": deletion}),
            ("DELETE", "/deletion", {}),
        ]:
            assert_problem(await api.call(method, org.path(suffix), caller, **kw), 403, "forbidden")
            assert_problem(await api.call(method, org.path(suffix), outsider, **kw), 404, "not_found")
        assert (await api.call("GET", org.path(), org.owner)).json()["state"] == state_setup


async def test_a_second_owner_may_change_state(api: Api) -> None:
    org = await api.org()
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200, r.text
    assert (await api.call("POST", org.path("/suspend"), org.admin)).json()["state"] == "suspended"


async def test_lifecycle_routes_need_a_token_and_a_real_org(api: Api) -> None:
    org = await api.org()
    assert_problem(await api.call("POST", org.path("/suspend")), 401, "unauthenticated")
    assert_problem(await api.call("POST", "/orgs/not-a-uuid/suspend", org.owner), 404, "not_found")
    assert_problem(await api.call("POST", f"/orgs/{uuid.uuid4()}/suspend", org.owner), 404, "not_found")


# --- the state table ----------------------------------------------------------------------------------------


async def test_state_table_reads_and_writes(api: Api, api0: Api, db: Database) -> None:
    expectations = {"active": None, "suspended": "org_suspended", "deleting": "org_deleting"}
    for state, refusal in expectations.items():
        org = await api.org()
        r = await api.call("POST", org.path("/projects"), org.member, json={"name": "before"})
        assert r.status_code == 201, r.text
        project_id = r.json()["id"]
        if state == "suspended":
            assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
        if state == "deleting":
            await request_deletion(api, org)
        # Reads: every state short of deleted.
        for path, who in [("/projects", org.member), ("/members", org.customer), ("/tickets", org.customer)]:
            r = await api.call("GET", org.path(path), who)
            assert r.status_code == 200, (state, path, r.text)
        assert [p["name"] for p in (await api.call("GET", org.path("/projects"), org.admin)).json()["items"]] == [
            "before"
        ]
        newcomer = await api.users.make("newcomer")
        writes = [
            ("POST", "/projects", org.member, {"name": "new"}),
            ("POST", f"/projects/{project_id}/tasks", org.member, {"title": "task"}),
            ("PATCH", f"/projects/{project_id}", org.admin, {"name": "renamed"}),
            ("POST", "/tickets", org.customer, {"title": "help"}),
            ("POST", "/members", org.owner, {"email": newcomer.email, "role": "member"}),
            ("PATCH", f"/members/{org.member.id}", org.owner, {"role": "admin"}),
        ]
        for method, path, who, body in writes:
            r = await api.call(method, org.path(path), who, json=body)
            if refusal is None:
                assert r.status_code in (200, 201), (state, path, r.text)
            else:
                assert_problem(r, 409, refusal)
        r = await api.call("DELETE", org.path(f"/members/{org.customer2.id}"), org.owner)
        if refusal is None:
            assert r.status_code == 204, r.text
        else:
            assert_problem(r, 409, refusal)
        if refusal is not None:
            # Nothing was written.
            items = (await api.call("GET", org.path("/projects"), org.admin)).json()["items"]
            assert [p["name"] for p in items] == ["before"]
            roles = {
                m["userId"]: m["role"] for m in (await api.call("GET", org.path("/members"), org.owner)).json()["items"]
            }
            assert roles[str(org.member.id)] == "member" and str(org.customer2.id) in roles


async def test_deleted_org_answers_404_everywhere(api0: Api, settings0: Settings, db: Database) -> None:
    org = await api0.org()
    await seed(api0, db, settings0, org, projects=1, tickets=1)
    project_id = (await api0.call("GET", org.path("/projects"), org.member)).json()["items"][0]["id"]
    await request_deletion(api0, org)
    await purge_due(settings0, db)
    await assert_gone(api0, org, project_id)


# --- deletion requests ----------------------------------------------------------------------------------------


async def test_deletion_needs_the_org_name(api: Api) -> None:
    org = await api.org()
    for body in [
        {"confirm": "acme", **SKIP},
        {"confirm": "Acme ", **SKIP},
        {"confirm": "", **SKIP},
        {"confirm": "Other", **SKIP},
        {**SKIP},
        {"confirm": "Acme", "skipFinalExport": "yes"},
        {"confirm": "Acme", "unknown": 1},
    ]:
        body_out = assert_problem(
            await api.call("POST", org.path("/deletion"), org.owner, json=body), 400, "invalid_request"
        )
        assert (
            "confirm" in body_out["detail"]
            or "skipFinalExport" in body_out["detail"]
            or "unknown" in body_out["detail"]
        )
    assert_problem(await api.call("POST", org.path("/deletion"), org.owner), 400, "invalid_request")
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"


async def test_final_export_rule(api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]) -> None:
    org = await api.org()
    path = org.path("/deletion")
    confirm = {"confirm": "Acme"}
    assert_problem(await api.call("POST", path, org.owner, json=confirm), 409, "final_export_recommended")
    # None of these count: another user's snapshot, a CSV, a failed or a running snapshot, one older than 24 h.
    await insert_export(db, org.id, org.admin.id)
    await insert_export(db, org.id, org.owner.id, kind="tickets_csv")
    await insert_export(db, org.id, org.owner.id, state="failed")
    await insert_export(db, org.id, org.owner.id, state="running")
    await insert_export(db, org.id, org.owner.id, completed_ago=dt.timedelta(hours=25))
    # Nor a snapshot the owner took in another org.
    other = await api.org()
    await insert_export(db, other.id, other.owner.id)
    r = await api.call("POST", other.path("/members"), other.owner, json={"email": org.owner.email, "role": "owner"})
    assert r.status_code == 201
    await insert_export(db, other.id, org.owner.id)
    assert_problem(await api.call("POST", path, org.owner, json=confirm), 409, "final_export_recommended")
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"
    # A completed snapshot of this owner from the last hour is enough.
    await insert_export(db, org.id, org.owner.id, completed_ago=dt.timedelta(hours=1))
    r = await api.call("POST", path, org.owner, json=confirm)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["state"] == "deleting"
    row = org_row(owner, org.id)
    assert row["previous_state"] == "active"
    db_now = owner.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    delete_after = dt.datetime.fromisoformat(body["deleteAfter"])
    grace = dt.timedelta(seconds=settings.deletion_grace_seconds)
    assert grace == dt.timedelta(days=7)
    assert row["delete_after"] == delete_after
    assert dt.timedelta(0) <= (db_now + grace) - delete_after < dt.timedelta(minutes=1)
    got = (await api.call("GET", org.path(), org.member)).json()
    assert dt.datetime.fromisoformat(got["deleteAfter"]) == delete_after


async def test_skip_final_export_and_zero_grace(api0: Api, owner: psycopg.Connection[Any]) -> None:
    org = await api0.org()
    r = await api0.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", "skipFinalExport": False})
    assert_problem(r, 409, "final_export_recommended")
    body = await request_deletion(api0, org)
    db_now = owner.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    delete_after = dt.datetime.fromisoformat(body["deleteAfter"])
    assert dt.timedelta(0) <= db_now - delete_after < dt.timedelta(minutes=1)
    # With no grace period left there is nothing to cancel during.
    assert_problem(await api0.call("DELETE", org.path("/deletion"), org.owner), 409, "invalid_transition")
    assert (await api0.call("GET", org.path(), org.owner)).json()["state"] == "deleting"
