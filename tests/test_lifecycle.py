"""Organization lifecycle: the transition table by role, each state's effects, deletion rules, the purge."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from psycopg import sql
from sqlalchemy import make_url, text

from space.app import create_app
from space.config import Settings, load_settings
from space.db import Database, Tenant, UnitOfWork, app_url
from space.db.migrate import downgrade, upgrade
from space.exports.pipeline import run_export
from space.orgs import lifecycle
from space.orgs.jobs import PURGE_TABLES, purge_due, purge_due_job
from space.orgs.lifecycle import Action, change_state
from space.orgs.models import Organization
from space.orgs.schemas import DeletionRequest
from tests.exports_fixtures import (
    WAIT,
    Gate,
    background,
    blocked_by,
    chunk_count,
    create_export,
    download,
    job_row,
    runner,
    uid,
    wait_for,
)
from tests.helpers import Api, Org, UserFactory, assert_problem

# Tables the purge must empty (invitations does not exist yet; the purge skips missing tables).
COUNTED = [t for t in PURGE_TABLES if t != "invitations"]
SKIP = {"skipFinalExport": True}


@pytest.fixture
def owner(owner_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An owner connection: counts rows across orgs, as the app role never can."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def settings0(owner_url: str) -> Settings:
    """Settings with no grace period: a deletion request is due at once."""
    return load_settings({}, database_url=owner_url, deletion_grace_seconds=0)


@pytest.fixture(scope="module")
async def client0(settings0: Settings) -> AsyncIterator[AsyncTestClient]:  # type: ignore[type-arg]
    """The real app built with settings0."""
    async with AsyncTestClient(app=create_app(settings0)) as c:
        yield c


@pytest.fixture
def api0(client0: AsyncTestClient, users: UserFactory) -> Api:  # type: ignore[type-arg]
    """API caller against the no-grace app."""
    return Api(client0, users)


def counts_of(owner: psycopg.Connection[Any], org_id: str) -> dict[str, int]:
    """Rows of the org per purged table, counted as the owner."""
    out = {}
    for table in COUNTED:
        row = owner.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE org_id = %s").format(sql.Identifier(table)), (org_id,)
        ).fetchone()
        assert row is not None
        out[table] = row[0]
    return out


def org_row(owner: psycopg.Connection[Any], org_id: str) -> dict[str, Any]:
    """The organizations row, as the owner sees it."""
    with owner.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM organizations WHERE id = %s", (org_id,)).fetchone()
    assert row is not None
    return row


async def insert_export(
    db: Database,
    org_id: str,
    creator_id: uuid.UUID,
    *,
    kind: str = "snapshot",
    state: str = "completed",
    completed_ago: dt.timedelta = dt.timedelta(hours=1),
    chunks: int = 0,
) -> uuid.UUID:
    """An export_jobs row (and result chunks) written as the app role under the org's tenant context."""
    export_id, execution_id = uuid.uuid4(), uuid.uuid4()
    oid = uuid.UUID(org_id)
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid, user_id=creator_id)) as uow:
        await uow.session.execute(
            text(
                "INSERT INTO export_jobs (id, org_id, creator_id, kind, state, scope, execution_id,"
                " created_at, completed_at, progress, expires_at)"
                " VALUES (:id, :org, :creator, :kind, :state, 'team', :exec, now() - :ago, now() - :ago,"
                " CASE WHEN :state = 'completed' THEN 100 ELSE 0 END,"
                # A completed result can be downloaded for the default TTL after its completion, as published.
                " CASE WHEN :state = 'completed' THEN now() - :ago + interval '24 hours' END)"
            ),
            {
                "id": export_id,
                "org": oid,
                "creator": creator_id,
                "kind": kind,
                "state": state,
                "exec": execution_id,
                "ago": completed_ago,
            },
        )
        for seq in range(chunks):
            await uow.session.execute(
                text(
                    "INSERT INTO export_chunks (export_id, execution_id, seq, org_id, data)"
                    " VALUES (:id, :exec, :seq, :org, :data)"
                ),
                {"id": export_id, "exec": execution_id, "seq": seq, "org": oid, "data": b"chunk-%d" % seq},
            )
    return export_id


async def completed_export(api: Api, db: Database, settings: Settings, org: Org, body: dict[str, Any]) -> str:
    """The owner's export, created through the API and built by the real worker; returns its id."""
    export = await create_export(api, org, org.owner, body)
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    return str(export["id"])


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
    await completed_export(api, db, settings, org, {"kind": "snapshot"})
    await insert_export(db, org.id, org.owner.id, chunks=3)
    await insert_export(db, org.id, org.member.id, kind="tickets_csv", chunks=2)


async def request_deletion(api: Api, org: Org) -> dict[str, Any]:
    """Owner requests deletion skipping the final export; returns the org body."""
    r = await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", **SKIP})
    assert r.status_code == 202, r.text
    body: dict[str, Any] = r.json()
    return body


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


# --- the purge --------------------------------------------------------------------------------------------------


async def test_purge_removes_every_row_of_the_due_org_only(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    doomed, kept = await api0.org(), await api0.org()
    await seed(api0, db, settings0, doomed)
    await seed(api0, db, settings0, kept)
    before, kept_before = counts_of(owner, doomed.id), counts_of(owner, kept.id)
    assert all(n > 0 for n in before.values()), before
    assert all(n > 0 for n in kept_before.values()), kept_before
    project_id = (await api0.call("GET", doomed.path("/projects"), doomed.member)).json()["items"][0]["id"]
    await request_deletion(api0, doomed)

    results = await purge_due(settings0, db)

    mine = [r for r in results if str(r.org_id) == doomed.id]
    assert len(mine) == 1 and str(kept.id) not in [str(r.org_id) for r in results]
    assert counts_of(owner, doomed.id) == dict.fromkeys(COUNTED, 0)
    assert counts_of(owner, kept.id) == kept_before
    row = org_row(owner, doomed.id)
    assert row["state"] == "deleted" and row["deleted_at"] is not None
    assert row["purged_counts"] == before == mine[0].counts
    assert row["name"] == ""
    assert org_row(owner, kept.id)["state"] == "active"
    await assert_gone(api0, doomed, project_id)
    # The second org still works as before.
    assert (await api0.call("GET", kept.path("/projects"), kept.member)).status_code == 200
    # A second run finds nothing more to do for it.
    assert doomed.id not in [str(r.org_id) for r in await purge_due(settings0, db)]


async def test_purge_interrupted_between_batches_resumes(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await seed(api0, db, settings0, org)
    before = counts_of(owner, org.id)
    await request_deletion(api0, org)
    batches: list[tuple[str, int]] = []

    class Crash(Exception):
        pass

    async def crash_after_first(org_id: uuid.UUID, table: str, n: int) -> None:
        if str(org_id) == org.id:
            batches.append((table, n))
            raise Crash()

    # A crash after the first committed batch: the run stops, that batch stays done and counted.
    results = await purge_due(settings0, db, batch_rows=2, after_batch=crash_after_first)
    assert org.id not in [str(r.org_id) for r in results]
    assert batches == [("export_chunks", 2)]
    during = counts_of(owner, org.id)
    assert during["export_chunks"] == before["export_chunks"] - 2
    assert {k: v for k, v in during.items() if k != "export_chunks"} == {
        k: v for k, v in before.items() if k != "export_chunks"
    }
    row = org_row(owner, org.id)
    assert row["state"] == "deleting"
    assert row["purged_counts"]["export_chunks"] == 2
    # Once rows are gone the owner can't go back, and the org still refuses writes.
    assert_problem(await api0.call("DELETE", org.path("/deletion"), org.owner), 409, "invalid_transition")
    assert_problem(await api0.call("POST", org.path("/projects"), org.member, json={"name": "x"}), 409, "org_deleting")

    # The next run picks it up again and finishes in small batches; the counts add up across both runs.
    seen: list[tuple[str, int]] = []

    async def record(org_id: uuid.UUID, table: str, n: int) -> None:
        if str(org_id) == org.id:
            seen.append((table, n))

    results = await purge_due(settings0, db, batch_rows=2, after_batch=record)
    assert org.id in [str(r.org_id) for r in results]
    assert all(n <= 2 for _, n in seen) and len(seen) > len(COUNTED)
    assert counts_of(owner, org.id) == dict.fromkeys(COUNTED, 0)
    row = org_row(owner, org.id)
    assert row["state"] == "deleted" and row["purged_counts"] == before


async def test_purge_leaves_orgs_that_are_not_due(
    api: Api, api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    grace = await api.org()  # deleting, with the default 7-day grace period
    await seed(api, db, settings0, grace, projects=1, tickets=1)
    await request_deletion(api, grace)
    cancelled = await api.org()
    await request_deletion(api, cancelled)
    assert (await api.call("DELETE", cancelled.path("/deletion"), cancelled.owner)).status_code == 200
    suspended = await api0.org()
    assert (await api0.call("POST", suspended.path("/suspend"), suspended.owner)).status_code == 200
    counted = {o.id: counts_of(owner, o.id) for o in (grace, cancelled, suspended)}

    results = await purge_due(settings0, db)

    purged = {str(r.org_id) for r in results}
    for org in (grace, cancelled, suspended):
        assert org.id not in purged
        assert counts_of(owner, org.id) == counted[org.id]
        assert org_row(owner, org.id)["purged_counts"] is None
    assert org_row(owner, grace.id)["state"] == "deleting"
    assert (await api.call("GET", grace.path("/projects"), grace.member)).status_code == 200


async def test_purge_job_entry_point(
    api0: Api, db: Database, settings0: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await seed(api0, db, settings0, org, projects=1, tickets=1)
    before = counts_of(owner, org.id)
    await request_deletion(api0, org)
    out = await purge_due_job({"settings": settings0, "db": db})
    entry = next(p for p in out["purged"] if p["orgId"] == org.id)
    assert entry["counts"] == before
    assert org_row(owner, org.id)["state"] == "deleted"


async def test_due_orgs_are_found_only_through_the_definer_function(
    api0: Api, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await api0.org()
    await request_deletion(api0, org)
    async with UnitOfWork(db.sessionmaker) as uow:
        # The app role, with no tenant context, sees no organization at all...
        assert (await uow.session.execute(text("SELECT count(*) FROM organizations"))).scalar_one() == 0
        # ...but the maintenance function hands it the ids of due orgs, and nothing else.
        ids = {str(i) for i in (await uow.session.execute(text("SELECT space_maintenance_due_purges(1000)"))).scalars()}
    assert org.id in ids
    row = owner.execute(
        "SELECT p.prosecdef, p.proconfig, pg_get_userbyid(p.proowner),"
        " has_function_privilege('space_app', p.oid, 'EXECUTE'), has_function_privilege('public', p.oid, 'EXECUTE')"
        " FROM pg_proc p WHERE p.proname = 'space_maintenance_due_purges'"
    ).fetchone()
    assert row is not None
    secdef, config, fn_owner, app_may, public_may = row
    assert secdef and "search_path=public, pg_temp" in config
    assert fn_owner != "space_app" and app_may and not public_may
    # The purge deletes as the app role under RLS; it never got ownership or BYPASSRLS for it.
    assert owner.execute("SELECT rolbypassrls FROM pg_roles WHERE rolname = 'space_app'").fetchone() == (False,)


def test_migrations_round_trip(owner_url: str) -> None:
    name = f"space_rt_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        downgrade(url, "base")
        upgrade(url)
        downgrade(url, "0001")
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regproc('space_maintenance_due_purges')").fetchone() == (None,)
        upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regproc('space_maintenance_due_purges')").fetchone() != (None,)
            grant = "SELECT has_table_privilege('space_app', 'ticket_counters', 'DELETE')"
            assert conn.execute(grant).fetchone() == (True,)
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
        return await lifecycle.request_deletion(uow.session, row, org.owner.id, DeletionRequest(confirm="Acme"), 60)


async def test_deletion_waits_for_a_publish_holding_the_org_lock(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    export = await create_export(api, org, org.owner, {"kind": "snapshot"})
    eid, oid = uid(export["id"]), uid(org.id)
    worker_app, lifecycle_app = (f"space-{x}-{uuid.uuid4().hex[:8]}" for x in ("worker", "lifecycle"))
    worker_db = Database(app_url(owner_url), application_name=worker_app)
    lifecycle_db = Database(app_url(owner_url), application_name=lifecycle_app)
    gate = Gate({"publish_locked"})
    try:
        async with background(run_export(runner(settings, worker_db), eid, oid, gate=gate), gate) as worker:
            await gate.reached("publish_locked")
            async with background(_deletion_in(lifecycle_db, org)) as requested:
                await wait_for(lambda: blocked_by(owner_url, lifecycle_app, worker_app), "the deletion to wait")
                assert not requested.done()
                gate.resume("publish_locked")
                assert await asyncio.wait_for(worker, WAIT) == "completed"
                # Ordered after the publish: the export just published counts as the final export.
                assert (await asyncio.wait_for(requested, WAIT)).state == "deleting"
    finally:
        await worker_db.dispose()
        await lifecycle_db.dispose()
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
    worker_db = Database(app_url(owner_url), application_name=worker_app)
    lifecycle_db = Database(app_url(owner_url), application_name=lifecycle_app)
    gate = Gate({"before_publish"})
    hold, locked = asyncio.Event(), asyncio.Event()
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
        await worker_db.dispose()
        await lifecycle_db.dispose()
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
