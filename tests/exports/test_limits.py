"""SPEC §14 limits between tenants: exports per user across orgs, orgs per user, stored results per org.

Each limit: n-1 allowed and n refused with its exact code; each race: the lock that orders it held from a
second connection until every request waits behind it (pg_blocking_pids), then released.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any

import psycopg

from space.config import Settings
from space.db import Database
from space.db.locks import USER_LIMITS
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    WAIT,
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
)
from tests.exports.limits_fixtures import lock_holder, tuned_api, wait_queued
from tests.helpers import Api, UserFactory, assert_problem

if TYPE_CHECKING:
    # For annotations only: pytest would try to collect a Test* class imported at runtime.
    from tests.helpers import TestUser

CSV = {"kind": "tickets_csv"}
HOLD_USER_LOCK = "SELECT pg_advisory_xact_lock(%s::int, hashtext(%s))"


async def _own_orgs(api: Api, user: TestUser, n: int) -> list[str]:
    """`n` orgs made by `user` through the API (so `user` owns them)."""
    ids = []
    for i in range(n):
        r = await api.call("POST", "/orgs", user, json={"name": f"Limits {i}"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


async def _export(api: Api, org_id: str, user: TestUser) -> Any:
    return await api.call("POST", f"/orgs/{org_id}/exports", user, json=CSV)


async def _fill_per_org(api: Api, org_ids: list[str], user: TestUser) -> None:
    """Three exports (the per-org limit) in each of the orgs."""
    for org_id in org_ids:
        for _ in range(3):
            r = await _export(api, org_id, user)
            assert r.status_code == 202, r.text


# --- exports per user, across orgs -----------------------------------------------------------------------------


async def test_user_rate_limit_counts_exports_in_every_org(api: Api, settings: Settings) -> None:
    assert settings.export_user_rate_limit == 10
    user = await api.users.make("busy")
    orgs = await _own_orgs(api, user, 4)
    await _fill_per_org(api, orgs[:3], user)
    # Nine counted in three orgs: the tenth, in a fourth org, is allowed...
    assert (await _export(api, orgs[3], user)).status_code == 202
    # ...the eleventh is not, though that org holds only one of the three the per-org limit allows.
    r = await _export(api, orgs[3], user)
    body = assert_problem(r, 429, "export_rate_limited")
    assert "across all your organizations" in body["detail"]
    assert r.headers["retry-after"] == "30"  # all ten still queued: when they end can't be known
    # Another member of that org has their own allowance.
    other = await api.users.make("colleague")
    r = await api.call("POST", f"/orgs/{orgs[3]}/members", user, json={"email": other.email, "role": "member"})
    assert r.status_code == 201
    assert (await _export(api, orgs[3], other)).status_code == 202


async def test_user_rate_limit_window_is_one_minute(api: Api, owner_url: str) -> None:
    user = await api.users.make("window")
    orgs = await _own_orgs(api, user, 4)
    await _fill_per_org(api, orgs[:3], user)
    assert (await _export(api, orgs[3], user)).status_code == 202
    # Finished (cancelled) exports still count while they were created within the minute.
    with psycopg.connect(owner_url, autocommit=True) as conn:
        rows = conn.execute("SELECT id, org_id FROM export_jobs WHERE creator_id = %s", (user.id,)).fetchall()
    assert len(rows) == 10
    for export_id, org_id in rows:
        assert (await api.call("DELETE", f"/orgs/{org_id}/exports/{export_id}", user)).status_code == 204
    r = await _export(api, orgs[3], user)
    assert_problem(r, 429, "export_rate_limited")
    assert 1 <= int(r.headers["retry-after"]) <= 60

    def age(seconds: int) -> None:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE export_jobs SET created_at = now() - make_interval(secs => %s) WHERE creator_id = %s",
                (seconds, user.id),
            )

    # Thirty seconds old: still counted, and freed in about thirty seconds.
    age(30)
    r = await _export(api, orgs[3], user)
    assert_problem(r, 429, "export_rate_limited")
    assert 25 <= int(r.headers["retry-after"]) <= 30, r.headers["retry-after"]
    # Older than a minute: no longer counted.
    age(61)
    assert (await _export(api, orgs[3], user)).status_code == 202


async def test_concurrent_creates_in_different_orgs_share_the_user_limit(api: Api, owner_url: str) -> None:
    user = await api.users.make("racer")
    orgs = await _own_orgs(api, user, 6)
    await _fill_per_org(api, orgs[:3], user)  # nine counted: room for one more
    async with lock_holder(owner_url) as holder:
        await holder.hold(HOLD_USER_LOCK, (USER_LIMITS, str(user.id)))
        # Three orgs, three org locks: only the user's lock orders these requests.
        calls = [("POST", f"/orgs/{org_id}/exports", user, CSV) for org_id in orgs[3:]]
        async with background(api.concurrently(calls)) as requests:
            await wait_queued(owner_url, holder, "space-api", 3)
            await holder.release()
            responses = await asyncio.wait_for(requests, WAIT)
    assert sorted(r.status_code for r in responses) == [202, 429, 429], [r.text for r in responses]
    for r in responses:
        if r.status_code == 429:
            assert_problem(r, 429, "export_rate_limited")


# --- orgs per user ---------------------------------------------------------------------------------------------


async def test_orgs_per_user_limit(api: Api, db: Database, settings: Settings) -> None:
    limit = settings.orgs_per_user
    assert limit == 20
    user = await api.users.make("founder")
    mine = await _own_orgs(api, user, limit - 1)
    # Being made owner of an org someone else created costs the user nothing (SPEC §25): n-1 created, one more.
    other = await api.org("Someone else's")
    r = await api.call("POST", other.path("/members"), other.owner, json={"email": user.email, "role": "owner"})
    assert r.status_code == 201
    assert (await api.call("POST", "/orgs", user, json={"name": "The last"})).status_code == 201
    body = assert_problem(
        await api.call("POST", "/orgs", user, json={"name": "One too many"}), 409, "org_limit_reached"
    )
    assert str(limit) in body["detail"]
    # An org being deleted still counts; a deleted one no longer does.
    await set_org_state(db, mine[0], "deleting")
    assert_problem(await api.call("POST", "/orgs", user, json={"name": "Again"}), 409, "org_limit_reached")
    await set_org_state(db, mine[0], "deleted")
    assert (await api.call("POST", "/orgs", user, json={"name": "After a purge"})).status_code == 201
    # Nothing was made by the refused requests.
    listed = (await api.call("GET", "/orgs", user)).json()["items"]
    assert len(listed) == limit + 1  # `limit` created, and the one the user was made owner of


async def test_the_org_limit_cannot_be_handed_off(settings: Settings, users: UserFactory) -> None:
    # The reproduction of issue 29: make someone else owner, step down to admin (or be removed), create more.
    async with tuned_api(settings, users, orgs_per_user=3) as three:
        founder = await users.make("founder")
        heir = await users.make("heir")
        mine = await _own_orgs(three, founder, 3)
        for org_id in mine:
            add = {"email": heir.email, "role": "owner"}
            assert (await three.call("POST", f"/orgs/{org_id}/members", founder, json=add)).status_code == 201
            demote = {"role": "admin"}
            r = await three.call("PATCH", f"/orgs/{org_id}/members/{founder.id}", founder, json=demote)
            assert r.status_code == 200, r.text
        assert_problem(await three.call("POST", "/orgs", founder, json={"name": "4th"}), 409, "org_limit_reached")
        # Removed from one of them by its new owner: still the founder's creation, still counted.
        r = await three.call("DELETE", f"/orgs/{mine[0]}/members/{founder.id}", heir)
        assert r.status_code == 204, r.text
        assert_problem(await three.call("POST", "/orgs", founder, json={"name": "4th"}), 409, "org_limit_reached")
        # The heir owns three orgs and created none: their own three are theirs to make, the fourth is not.
        await _own_orgs(three, heir, 3)
        assert_problem(await three.call("POST", "/orgs", heir, json={"name": "4th"}), 409, "org_limit_reached")


async def test_concurrent_org_creations_share_the_limit(
    api: Api, settings: Settings, users: UserFactory, owner_url: str
) -> None:
    async with tuned_api(settings, users, orgs_per_user=2) as two:
        user = await users.make("founder")
        await _own_orgs(two, user, 1)
        async with lock_holder(owner_url) as holder:
            await holder.hold(HOLD_USER_LOCK, (USER_LIMITS, str(user.id)))
            calls = [("POST", "/orgs", user, {"name": f"Racing {i}"}) for i in range(2)]
            async with background(two.concurrently(calls)) as requests:
                await wait_queued(owner_url, holder, "space-api", 2)
                await holder.release()
                responses = await asyncio.wait_for(requests, WAIT)
        assert sorted(r.status_code for r in responses) == [201, 409], [r.text for r in responses]
        assert_problem(next(r for r in responses if r.status_code == 409), 409, "org_limit_reached")
        assert len((await two.call("GET", "/orgs", user)).json()["items"]) == 2


# --- stored results per org ------------------------------------------------------------------------------------


async def _completed(api: Api, db: Database, settings: Settings, org: Any, user: TestUser) -> tuple[str, int]:
    """A completed CSV export of `user`'s; its id and byte size."""
    export = await create_export(api, org, user, CSV)
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    size = (await job_row(db, org.id, export["id"])).byte_size
    assert size is not None
    return export["id"], size


async def test_result_quota_refuses_new_exports_at_the_quota(
    api: Api, db: Database, settings: Settings, users: UserFactory, owner_url: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["quota"] * 3)
    first, size = await _completed(api, db, settings, org, org.member)
    second, same = await _completed(api, db, settings, org, org.admin)
    assert same == size  # the same rows, the same bytes
    async with tuned_api(settings, users, org_result_quota_bytes=2 * size + 1) as below:
        # One byte under the quota: allowed (a queued export stores nothing yet, so it doesn't count).
        assert (await _export(below, org.id, org.owner)).status_code == 202
    async with tuned_api(settings, users, org_result_quota_bytes=2 * size) as at:
        body = assert_problem(await _export(at, org.id, org.owner), 409, "export_quota_exceeded")
        assert str(2 * size) in body["detail"]
        # Only downloadable results count: a deleted one frees its bytes...
        assert (await api.call("DELETE", org.path(f"/exports/{first}"), org.member)).status_code == 204
        assert (await _export(at, org.id, org.owner)).status_code == 202
    async with tuned_api(settings, users, org_result_quota_bytes=size) as one:
        assert_problem(await _export(one, org.id, org.customer), 409, "export_quota_exceeded")
        # ...and so does an expired one, before any cleanup has run.
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (second,))
        assert (await _export(one, org.id, org.customer)).status_code == 202


async def test_a_build_that_would_pass_the_quota_fails_quota_exceeded(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["quota"] * 3)
    _, size = await _completed(api, db, settings, org, org.member)
    over = await create_export(api, org, org.admin, CSV)
    fits = await create_export(api, org, org.owner, CSV)
    # One byte short of room for a second result of the same size: it fails, fenced, and stores nothing.
    short = tuned(settings, org_result_quota_bytes=2 * size - 1)
    assert await run_export(runner(short, db), uid(over["id"]), uid(org.id)) == "quota_exceeded"
    job = await job_row(db, org.id, over["id"])
    assert (job.state, job.error_code, job.lease_expires_at) == ("failed", "quota_exceeded", None)
    assert await chunk_count(db, org.id, over["id"]) == 0
    body = assert_problem(await download(api, org, org.admin, over["id"]), 409, "export_failed")
    assert body["errorCode"] == "quota_exceeded"
    # Exactly at the quota: published.
    exact = tuned(settings, org_result_quota_bytes=2 * size)
    assert await run_export(runner(exact, db), uid(fits["id"]), uid(org.id)) == "completed"
    job = await job_row(db, org.id, fits["id"])
    assert job.state == "completed" and job.byte_size == size
    assert (await download(api, org, org.owner, fits["id"])).status_code == 200


async def test_publishes_are_ordered_by_the_org_lock_for_the_quota(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["quota"] * 3)
    _, size = await _completed(api, db, settings, org, org.member)
    exports = [await create_export(api, org, user, CSV) for user in (org.admin, org.owner)]
    # Room for one more result; both builds run at once and reach their publish together.
    room_for_one = tuned(settings, org_result_quota_bytes=2 * size, export_org_concurrency=2)
    gates = [Gate({"before_publish"}), Gate({"before_publish"})]
    runs = [
        run_export(runner(room_for_one, db), uid(e["id"]), uid(org.id), gate=g)
        for e, g in zip(exports, gates, strict=True)
    ]
    async with (
        lock_holder(owner_url) as holder,
        background(runs[0], gates[0]) as a,
        background(runs[1], gates[1]) as b,
    ):
        for gate in gates:
            await gate.reached("before_publish")
        await holder.hold("SELECT 1 FROM organizations WHERE id = %s FOR UPDATE", (uuid.UUID(org.id),))
        for gate in gates:
            gate.resume("before_publish")
        await wait_queued(owner_url, holder, "space-tests", 2)
        await holder.release()
        outcomes = sorted([await asyncio.wait_for(a, WAIT), await asyncio.wait_for(b, WAIT)])
    assert outcomes == ["completed", "quota_exceeded"], outcomes
    jobs = [await job_row(db, org.id, e["id"]) for e in exports]
    assert sorted((j.state, j.byte_size or 0) for j in jobs) == [("completed", size), ("failed", 0)]
