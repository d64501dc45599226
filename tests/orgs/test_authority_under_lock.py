"""Authority is decided under the org lock, the org lock lets other tenants' work through, assignees race cleanly.

The races follow TESTING.md: a second connection (the owner role, psycopg) holds the org row lock, the
request is sent from a thread (`Api.concurrently`: the test client serves one request at a time), the test
waits until `pg_blocking_pids` shows the request waiting on that connection, changes the world in the
holding transaction (removes or demotes the caller), commits, and checks the answer and that nothing changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from httpx import Response

from space.db import Database, Tenant, UnitOfWork
from space.orgs.service import lock_org
from tests import helpers
from tests.exports.fixtures import WAIT, add_tickets, background, blocked_by, wait_for
from tests.helpers import Api, Org, assert_problem

API_APP = "space-api"
"""The application_name of the API's connections (space.app)."""


@dataclass
class Holder:
    """A second connection, as the owner role, tagged so pg_blocking_pids can name it."""

    conn: psycopg.AsyncConnection[Any]
    app: str

    async def execute(self, query: str, params: tuple[Any, ...] = ()) -> None:
        """Run a statement in the holding transaction."""
        await self.conn.execute(query, params)

    async def lock_org(self, org_id: str) -> None:
        """Take the org row lock the way the app's lock_org does."""
        await self.execute("SELECT 1 FROM organizations WHERE id = %s FOR NO KEY UPDATE", (org_id,))


@contextlib.asynccontextmanager
async def holder(owner_url: str) -> AsyncIterator[Holder]:
    """A holding connection; whatever it holds is rolled back on exit unless the test committed it."""
    app = f"space-holder-{uuid.uuid4().hex[:8]}"
    conn = await psycopg.AsyncConnection.connect(owner_url, application_name=app)
    try:
        yield Holder(conn, app)
    finally:
        await conn.rollback()
        await conn.close()


async def waiting_on(owner_url: str, waiter: str, holder_app: str) -> None:
    """Wait until a session tagged `waiter` is blocked by one tagged `holder_app`."""
    await wait_for(lambda: blocked_by(owner_url, waiter, holder_app), f"{waiter} to wait on {holder_app}")


def send(api: Api, method: str, path: str, user: helpers.TestUser, body: Any = None) -> asyncio.Task[list[Response]]:
    """Send one request from a thread, so this loop stays free while it waits on a lock."""
    return asyncio.ensure_future(api.concurrently([(method, path, user, body)]))


async def race(
    api: Api,
    owner_url: str,
    org: Org,
    request: tuple[str, str, helpers.TestUser, Any],
    change: Callable[[Holder], Awaitable[None]],
) -> Response:
    """Hold the org lock, let `request` wait on it, `change` the world in the holding transaction, release."""
    async with holder(owner_url) as h:
        await h.lock_org(org.id)
        async with background(api.concurrently([request])) as sent:
            try:
                await waiting_on(owner_url, API_APP, h.app)
                assert not sent.done()
                await change(h)
                await h.conn.commit()
            finally:
                # Release before `background` awaits the request, whatever happened.
                await h.conn.rollback()
            [answer] = await asyncio.wait_for(sent, WAIT)
    return answer


def remove(user: helpers.TestUser, org: Org) -> Callable[[Holder], Awaitable[None]]:
    """The holding transaction removes `user` from the org."""

    async def change(h: Holder) -> None:
        await h.execute("DELETE FROM memberships WHERE org_id = %s AND user_id = %s", (org.id, user.id))

    return change


def demote(user: helpers.TestUser, org: Org, role: str) -> Callable[[Holder], Awaitable[None]]:
    """The holding transaction gives `user` a lesser role."""

    async def change(h: Holder) -> None:
        await h.execute("UPDATE memberships SET role = %s WHERE org_id = %s AND user_id = %s", (role, org.id, user.id))

    return change


async def roles(api: Api, org: Org) -> dict[str, str]:
    """userId -> role, as the org's first owner sees them."""
    r = await api.call("GET", org.path("/members"), org.owner)
    assert r.status_code == 200, r.text
    return {m["userId"]: m["role"] for m in r.json()["items"]}


async def org_body(api: Api, org: Org) -> dict[str, Any]:
    """The org as its first owner reads it."""
    r = await api.call("GET", org.path(), org.owner)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


# --- member routes: the caller's membership is read again under the lock ---------------------------------------

# A caller removed while waiting is no longer a member: 404 as for any non-member. One demoted below the
# route's role: 403 `forbidden`, as the role guard answers before the lock.
OUTCOMES = {"removed": (404, "not_found"), "demoted": (403, "forbidden")}


@pytest.mark.parametrize("what", ["removed", "demoted"])
@pytest.mark.parametrize("route", ["add", "change_role", "remove"])
async def test_member_change_by_an_admin_who_lost_authority_while_waiting(
    api: Api, owner_url: str, route: str, what: str
) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")
    requests = {
        "add": ("POST", org.path("/members"), org.admin, {"email": newcomer.email, "role": "member"}),
        "change_role": ("PATCH", org.path(f"/members/{org.member.id}"), org.admin, {"role": "customer"}),
        "remove": ("DELETE", org.path(f"/members/{org.member.id}"), org.admin, None),
    }
    before = await roles(api, org)
    change = remove(org.admin, org) if what == "removed" else demote(org.admin, org, "member")
    answer = await race(api, owner_url, org, requests[route], change)
    assert_problem(answer, *OUTCOMES[what])
    after = await roles(api, org)
    # Only the holder's change happened: no newcomer, the member untouched.
    expected = dict(before)
    if what == "removed":
        del expected[str(org.admin.id)]
    else:
        expected[str(org.admin.id)] = "member"
    assert after == expected


async def test_member_added_while_the_org_was_suspended_meanwhile_is_refused(api: Api, owner_url: str) -> None:
    org = await api.org()
    newcomer = await api.users.make("newcomer")

    async def suspend(h: Holder) -> None:
        await h.execute("UPDATE organizations SET state = 'suspended' WHERE id = %s", (org.id,))

    request = ("POST", org.path("/members"), org.owner, {"email": newcomer.email, "role": "member"})
    assert_problem(await race(api, owner_url, org, request, suspend), 409, "org_suspended")
    assert str(newcomer.id) not in await roles(api, org)


# --- lifecycle routes: owner-only, re-checked under the lock ---------------------------------------------------

LIFECYCLE = {
    # route: (method, path suffix, body, the state the org is in before and after the refusal)
    "suspend": ("POST", "/suspend", None, "active"),
    "reactivate": ("POST", "/reactivate", None, "suspended"),
    "request_deletion": ("POST", "/deletion", {"confirm": "Acme", "skipFinalExport": True}, "active"),
    "cancel_deletion": ("DELETE", "/deletion", None, "deleting"),
}


@pytest.mark.parametrize("what", ["removed", "demoted"])
@pytest.mark.parametrize("route", list(LIFECYCLE))
async def test_lifecycle_change_by_an_owner_who_lost_authority_while_waiting(
    api: Api, owner_url: str, route: str, what: str
) -> None:
    org = await api.org()
    # A second owner, so demoting or removing the caller leaves the org an owner.
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200, r.text
    method, suffix, body, state = LIFECYCLE[route]
    if state == "suspended":
        assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    if state == "deleting":
        r = await api.call("POST", org.path("/deletion"), org.owner, json={"confirm": "Acme", "skipFinalExport": True})
        assert r.status_code == 202, r.text
    before = await org_body(api, org)
    change = remove(org.admin, org) if what == "removed" else demote(org.admin, org, "admin")
    answer = await race(api, owner_url, org, (method, org.path(suffix), org.admin, body), change)
    assert_problem(answer, *OUTCOMES[what])
    after = await org_body(api, org)
    assert after == before and after["state"] == state


# --- the org lock is FOR NO KEY UPDATE: inserts that reference the org go on ----------------------------------


async def test_ticket_creation_goes_on_while_a_member_change_waits_for_the_org_lock(api: Api, owner_url: str) -> None:
    org = await api.org()
    async with holder(owner_url) as h:
        await h.lock_org(org.id)
        async with (
            background(
                send(api, "PATCH", org.path(f"/members/{org.member.id}"), org.owner, {"role": "customer"})
            ) as change,
            background(send(api, "POST", org.path("/tickets"), org.customer, {"title": "still served"})) as ticket,
        ):
            try:
                # The ticket's foreign-key check takes FOR KEY SHARE on the org row: no conflict.
                [created] = await asyncio.wait_for(asyncio.shield(ticket), WAIT)
                assert created.status_code == 201, created.text
                await waiting_on(owner_url, API_APP, h.app)
                assert not change.done()
            finally:
                await h.conn.rollback()
            [changed] = await asyncio.wait_for(change, WAIT)
    assert changed.status_code == 200, changed.text
    assert (await roles(api, org))[str(org.member.id)] == "customer"


async def test_the_apps_own_org_lock_orders_changes_but_not_ticket_creation(api: Api, owner_url: str) -> None:
    org = await api.org()
    oid = uuid.UUID(org.id)
    app = f"space-locker-{uuid.uuid4().hex[:8]}"
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with UnitOfWork(database.sessionmaker, Tenant(org_id=oid)) as uow:
            await lock_org(uow.session, oid)
            locked.set()
            # Longer than any wait below, so a request stuck behind the lock fails its own wait first.
            await asyncio.wait_for(release.wait(), 4 * WAIT)

    change = ("PATCH", org.path(f"/members/{org.member.id}"), org.owner, {"role": "customer"})
    suspension = ("POST", org.path("/suspend"), org.owner, None)
    ticket = ("POST", org.path("/tickets"), org.customer, {"title": "served"})
    async with (
        helpers.app_database(owner_url, app) as database,
        background(hold()) as held,
        background(_after(locked, api, change)) as changed,
        background(_after(locked, api, suspension)) as suspended,
        background(_after(locked, api, ticket)) as created,
    ):
        try:
            await asyncio.wait_for(locked.wait(), WAIT)
            # Role changes and lifecycle transitions still queue on lock_org (as export publishes do).
            await wait_for(lambda: _blocked_count(owner_url, app, 2), "the role change and the suspension to wait")
            # A ticket's foreign-key check takes FOR KEY SHARE on the org row: it does not wait.
            [t] = await asyncio.wait_for(asyncio.shield(created), WAIT)
            assert t.status_code == 201, t.text
            assert not suspended.done() and not changed.done()
        finally:
            # Release before the backgrounds await the requests, whatever happened.
            release.set()
        await asyncio.wait_for(held, WAIT)
        [c] = await asyncio.wait_for(changed, WAIT)
        [s] = await asyncio.wait_for(suspended, WAIT)
    # Either order is fine (a suspension first refuses the role change as a write to a suspended org).
    assert s.status_code == 200 and s.json()["state"] == "suspended", s.text
    assert c.status_code == 200 or assert_problem(c, 409, "org_suspended"), c.text


async def _after(event: asyncio.Event, api: Api, request: tuple[str, str, helpers.TestUser, Any]) -> list[Response]:
    await asyncio.wait_for(event.wait(), WAIT)
    return await api.concurrently([request])


async def _blocked_count(owner_url: str, holder_app: str, n: int) -> bool:
    # The second waiter queues behind the first (pg_blocking_pids names it, not the holder): follow the chain.
    async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
        cur = await conn.execute(
            """
            WITH RECURSIVE chain(pid) AS (
              SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()
              UNION
              SELECT a.pid FROM pg_stat_activity a, chain c WHERE c.pid = ANY (pg_blocking_pids(a.pid))
            )
            SELECT count(*) FROM pg_stat_activity a JOIN chain c USING (pid) WHERE a.application_name = %s
            """,
            (holder_app, API_APP),
        )
        row = await cur.fetchone()
        return row is not None and row[0] >= n


# --- assigning a ticket while its assignee is removed ----------------------------------------------------------


async def _ticket(api: Api, org: Org, number: int) -> dict[str, Any]:
    r = await api.call("GET", org.path("/tickets"), org.owner)
    assert r.status_code == 200, r.text
    return next(t for t in r.json()["items"] if t["number"] == number)


async def test_assigning_to_a_member_being_removed_answers_400_once_the_removal_commits(
    api: Api, db: Database, owner_url: str
) -> None:
    org = await api.org()
    [number] = await add_tickets(db, org.id, org.customer, ["help"])
    assignee = org.memberships["member"]
    async with holder(owner_url) as h:
        # The removal has run but not committed: the assignee check must wait for its outcome.
        await h.execute("DELETE FROM memberships WHERE id = %s", (assignee,))
        request = ("PATCH", org.path(f"/tickets/{number}"), org.owner, {"assigneeId": assignee})
        async with background(api.concurrently([request])) as sent:
            try:
                await waiting_on(owner_url, API_APP, h.app)
                await h.conn.commit()
            finally:
                await h.conn.rollback()
            [answer] = await asyncio.wait_for(sent, WAIT)
    body = assert_problem(answer, 400, "invalid_request")
    assert "assigneeId" in body["detail"]
    assert (await _ticket(api, org, number))["assigneeId"] is None
    assert str(org.member.id) not in await roles(api, org)


async def test_a_removal_waits_for_an_assignment_that_checked_the_assignee(
    api: Api, db: Database, owner_url: str
) -> None:
    org = await api.org()
    [number] = await add_tickets(db, org.id, org.customer, ["help"])
    assignee = org.memberships["member"]
    async with holder(owner_url) as ticket_lock, holder(owner_url) as remover:
        # Pause the assignment after its assignee check, at the ticket UPDATE, by holding the ticket row.
        await ticket_lock.execute(
            "SELECT 1 FROM tickets WHERE org_id = %s AND number = %s FOR UPDATE", (org.id, number)
        )
        request = ("PATCH", org.path(f"/tickets/{number}"), org.owner, {"assigneeId": assignee})
        async with background(api.concurrently([request])) as sent:
            try:
                await waiting_on(owner_url, API_APP, ticket_lock.app)
                removal = remover.execute("DELETE FROM memberships WHERE id = %s", (assignee,))
                async with background(removal) as removed:
                    # The checked assignee stays until the assignment commits: the removal waits for it.
                    await waiting_on(owner_url, remover.app, API_APP)
                    assert not removed.done()
                    await ticket_lock.conn.rollback()
                    [answer] = await asyncio.wait_for(asyncio.shield(sent), WAIT)
                    await asyncio.wait_for(removed, WAIT)
                    await remover.conn.commit()
            finally:
                await ticket_lock.conn.rollback()
                await remover.conn.rollback()
    assert answer.status_code == 200, answer.text
    assert answer.json()["assigneeId"] == assignee
    # The removal came after: its ON DELETE SET NULL unassigned the ticket.
    assert (await _ticket(api, org, number))["assigneeId"] is None
    assert str(org.member.id) not in await roles(api, org)
