"""Members: list, add, change role, remove; who may do what; the last owner stays; the org lock is taken."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest
from httpx import Response
from sqlalchemy import text

from space.db import Database, Tenant, UnitOfWork
from tests import helpers
from tests.helpers import Api, Org, assert_problem


async def _roles(api: Api, org: Org) -> dict[str, str]:
    r = await api.call("GET", org.path("/members"), org.owner)
    assert r.status_code == 200, r.text
    return {m["userId"]: m["role"] for m in r.json()["items"]}


async def test_every_member_lists_members(api: Api) -> None:
    org = await api.org()
    for caller in (org.owner, org.admin, org.member, org.customer):
        r = await api.call("GET", org.path("/members"), caller)
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert [m["userId"] for m in items] == [
            str(u.id) for u in (org.owner, org.admin, org.member, org.customer, org.customer2)
        ]
        first = items[0]
        assert set(first) == {"id", "userId", "email", "name", "role", "createdAt"}
        assert first["email"] == org.owner.email and first["role"] == "owner"
        assert first["id"] == org.memberships["owner"]


@pytest.mark.parametrize("adder", ["owner", "admin"])
async def test_owner_and_admin_add_by_email(api: Api, adder: str) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")
    r = await api.call(
        "POST", org.path("/members"), getattr(org, adder), json={"email": newcomer.email.upper(), "role": "member"}
    )
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["userId"] == str(newcomer.id) and body["role"] == "member" and body["email"] == newcomer.email
    uuid.UUID(body["id"])
    assert (await _roles(api, org))[str(newcomer.id)] == "member"
    r = await api.call("GET", org.path(), newcomer)
    assert r.status_code == 200
    # Again: already a member, whatever the role asked for.
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": newcomer.email, "role": "customer"})
    assert_problem(r, 409, "already_member")
    assert (await _roles(api, org))[str(newcomer.id)] == "member"


async def test_add_unknown_email_is_not_found(api: Api) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": "nobody@nowhere.test", "role": "member"})
    assert_problem(r, 404, "not_found")


@pytest.mark.parametrize("caller", ["member", "customer"])
async def test_member_and_customer_cannot_add(api: Api, caller: str) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")
    for role in ("customer", "member", "owner"):
        r = await api.call(
            "POST", org.path("/members"), getattr(org, caller), json={"email": newcomer.email, "role": role}
        )
        assert_problem(r, 403, "forbidden")
    assert str(newcomer.id) not in await _roles(api, org)


@pytest.mark.parametrize("caller", ["member", "customer"])
async def test_member_and_customer_cannot_change_or_remove(api: Api, caller: str) -> None:
    org = await api.org()
    me: helpers.TestUser = getattr(org, caller)
    for target in (org.customer2, org.admin, me):
        r = await api.call("PATCH", org.path(f"/members/{target.id}"), me, json={"role": "admin"})
        assert_problem(r, 403, "forbidden")
        r = await api.call("DELETE", org.path(f"/members/{target.id}"), me)
        assert_problem(r, 403, "forbidden")
    roles = await _roles(api, org)
    assert roles[str(me.id)] == caller and roles[str(org.admin.id)] == "admin"


async def test_admin_cannot_create_or_touch_owners(api: Api) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")
    r = await api.call("POST", org.path("/members"), org.admin, json={"email": newcomer.email, "role": "owner"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.admin, json={"role": "owner"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.admin, json={"role": "owner"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("PATCH", org.path(f"/members/{org.owner.id}"), org.admin, json={"role": "member"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("DELETE", org.path(f"/members/{org.owner.id}"), org.admin)
    assert_problem(r, 403, "forbidden")
    roles = await _roles(api, org)
    assert str(newcomer.id) not in roles
    assert (roles[str(org.owner.id)], roles[str(org.admin.id)], roles[str(org.member.id)]) == (
        "owner",
        "admin",
        "member",
    )


async def test_admin_manages_non_owners(api: Api) -> None:
    org = await api.org()
    r = await api.call("PATCH", org.path(f"/members/{org.customer.id}"), org.admin, json={"role": "member"})
    assert r.status_code == 200, r.text
    assert r.json()["role"] == "member" and r.json()["userId"] == str(org.customer.id)
    assert r.json()["id"] == org.memberships["customer"]
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.admin, json={"role": "admin"})
    assert r.status_code == 200 and r.json()["role"] == "admin"
    r = await api.call("DELETE", org.path(f"/members/{org.customer2.id}"), org.admin)
    assert r.status_code == 204 and r.content == b""
    roles = await _roles(api, org)
    assert roles[str(org.customer.id)] == "member" and roles[str(org.member.id)] == "admin"
    assert str(org.customer2.id) not in roles


async def test_owner_makes_and_unmakes_owners(api: Api) -> None:
    org = await api.org()
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200 and r.json()["role"] == "owner"
    # Now the promoted owner may demote the first one: there is still an owner left.
    r = await api.call("PATCH", org.path(f"/members/{org.owner.id}"), org.admin, json={"role": "member"})
    assert r.status_code == 200 and r.json()["role"] == "member"
    # ...but not themselves: they are the last owner now.
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.admin, json={"role": "admin"})
    assert_problem(r, 409, "last_owner")
    r = await api.call("DELETE", org.path(f"/members/{org.admin.id}"), org.admin)
    assert_problem(r, 409, "last_owner")
    r = await api.call("GET", org.path("/members"), org.admin)
    owners = [m["userId"] for m in r.json()["items"] if m["role"] == "owner"]
    assert owners == [str(org.admin.id)]


async def test_last_owner_cannot_be_removed_or_demoted(api: Api) -> None:
    org = await api.org()
    for role in ("admin", "member", "customer"):
        r = await api.call("PATCH", org.path(f"/members/{org.owner.id}"), org.owner, json={"role": role})
        assert_problem(r, 409, "last_owner")
    r = await api.call("DELETE", org.path(f"/members/{org.owner.id}"), org.owner)
    assert_problem(r, 409, "last_owner")
    # Keeping the role is no demotion.
    r = await api.call("PATCH", org.path(f"/members/{org.owner.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200 and r.json()["role"] == "owner"
    assert (await _roles(api, org))[str(org.owner.id)] == "owner"


async def test_unknown_target_is_not_found(api: Api) -> None:
    org = await api.org()
    stranger = await api.users.make("stranger")
    for target in (str(stranger.id), str(uuid.uuid4()), "not-a-uuid", org.memberships["member"]):
        r = await api.call("PATCH", org.path(f"/members/{target}"), org.owner, json={"role": "member"})
        assert_problem(r, 404, "not_found")
        r = await api.call("DELETE", org.path(f"/members/{target}"), org.owner)
        assert_problem(r, 404, "not_found")


async def test_removed_member_loses_the_org(api: Api) -> None:
    org = await api.org()
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204
    for method, suffix in [("GET", ""), ("GET", "/members")]:
        r = await api.call(method, org.path(suffix), org.member)
        assert_problem(r, 404, "not_found")
    r = await api.call("GET", "/orgs", org.member)
    assert r.json() == {"items": []}
    # Removing twice: gone.
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert_problem(r, 404, "not_found")
    # And they can be added back.
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": org.member.email, "role": "customer"})
    assert r.status_code == 201
    r = await api.call("GET", org.path(), org.member)
    assert r.status_code == 200


async def test_admin_may_leave(api: Api) -> None:
    org = await api.org()
    r = await api.call("DELETE", org.path(f"/members/{org.admin.id}"), org.admin)
    assert r.status_code == 204
    r = await api.call("GET", org.path(), org.admin)
    assert_problem(r, 404, "not_found")


async def test_member_validation(api: Api) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")
    cases: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/members", {"email": newcomer.email, "role": "boss"}, "role"),
        ("POST", "/members", {"email": newcomer.email}, "role"),
        ("POST", "/members", {"role": "member"}, "email"),
        ("POST", "/members", {"email": "no-at-sign", "role": "member"}, "email"),
        ("POST", "/members", {"email": "a\x00b@example.test", "role": "member"}, "email"),
        ("POST", "/members", {"email": "x" * 400 + "@example.test", "role": "member"}, "email"),
        ("POST", "/members", {"email": newcomer.email, "role": "member", "userId": str(newcomer.id)}, "userId"),
        ("PATCH", f"/members/{org.member.id}", {"role": "Owner"}, "role"),
        ("PATCH", f"/members/{org.member.id}", {"role": None}, "role"),
        ("PATCH", f"/members/{org.member.id}", {"role": "admin", "orgId": org.id}, "orgId"),
    ]
    for method, suffix, body, field in cases:
        r = await api.call(method, org.path(suffix), org.owner, json=body)
        problem = assert_problem(r, 400, "invalid_request")
        assert field in problem["detail"], (body, problem)
    assert str(newcomer.id) not in await _roles(api, org)
    assert (await _roles(api, org))[str(org.member.id)] == "member"


# --- the org lock: role changes and removals are ordered with everything else that takes it ------------------


def _request_in_thread(api: Api, method: str, path: str, user: helpers.TestUser, **kw: Any) -> asyncio.Future[Response]:
    # The test client blocks its caller's event loop for the whole request (it drives the app on a portal
    # thread), so a request that waits on a lock this loop holds must be sent from another thread.
    return asyncio.ensure_future(asyncio.to_thread(asyncio.run, api.call(method, path, user, **kw)))


def _blocked_api_backends(owner_url: str, holder_pid: int) -> int:
    with psycopg.connect(owner_url) as conn:
        row = conn.execute(
            # A second waiter queues behind the first, so it is blocked by that one rather than the holder:
            # count every API backend in a wait chain that starts at the holder.
            "WITH RECURSIVE chain(pid) AS (SELECT %s::int UNION"
            " SELECT a.pid FROM pg_stat_activity a, chain c WHERE c.pid = ANY(pg_blocking_pids(a.pid)))"
            " SELECT count(*) FROM pg_stat_activity a JOIN chain c USING (pid) WHERE a.application_name = 'space-api'",
            (holder_pid,),
        ).fetchone()
        return row[0] if row else 0


async def _wait_blocked(owner_url: str, holder_pid: int, n: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (seen := _blocked_api_backends(owner_url, holder_pid)) < n:
        assert time.monotonic() < deadline, f"expected {n} API requests blocked on the org lock, saw {seen}"
        await asyncio.sleep(0.02)


async def test_concurrent_owner_demotions_keep_one_owner(api: Api, db: Database, owner_url: str) -> None:
    org = await api.org()
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200
    oid = uuid.UUID(org.id)
    tasks: list[asyncio.Future[Response]] = []
    release = asyncio.Event()

    async def hold_org_lock() -> int:
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
            await uow.session.execute(text("SELECT 1 FROM organizations WHERE id = :id FOR UPDATE"), {"id": oid})
            pid = await uow.session.scalar(text("SELECT pg_backend_pid()"))
            holding.set_result(int(pid or 0))
            await release.wait()
        return 0

    holding: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    holder = asyncio.ensure_future(hold_org_lock())
    try:
        pid = await asyncio.wait_for(holding, 10)
        # One owner steps down, the other leaves; alone each would pass the "another owner exists" check.
        # (Each touches only themselves: the loser still has the authority to try, and meets the count.)
        tasks.append(
            _request_in_thread(api, "PATCH", org.path(f"/members/{org.admin.id}"), org.admin, json={"role": "member"})
        )
        tasks.append(_request_in_thread(api, "DELETE", org.path(f"/members/{org.owner.id}"), org.owner))
        # Both requests wait for the org lock: the rule is checked only once each holds it.
        await _wait_blocked(owner_url, pid, 2)
    finally:
        release.set()
        await asyncio.wait_for(holder, 10)
        results = [await asyncio.wait_for(t, 20) for t in tasks]
    statuses = sorted(r.status_code for r in results)
    assert statuses in ([200, 409], [204, 409]), [(r.status_code, r.text) for r in results]
    loser = next(r for r in results if r.status_code == 409)
    assert_problem(loser, 409, "last_owner")
    roles = await _roles_as_any(api, org)
    assert list(roles.values()).count("owner") == 1, roles


async def _roles_as_any(api: Api, org: Org) -> dict[str, str]:
    # One of the two owners may be gone; the member is still there to ask.
    r = await api.call("GET", org.path("/members"), org.member)
    assert r.status_code == 200, r.text
    return {m["userId"]: m["role"] for m in r.json()["items"]}
