"""In-app notifications and preferences (SPEC §19), through the real outcome seam and the real /me API: who is
told of what, the caller's own list across orgs (an org they left shows none), reading, paging, preferences."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import add_tickets, create_export, runner, tuned, uid
from tests.helpers import Api, Org, TestUser, assert_problem
from tests.orgs.fixtures import request_deletion


async def listed(api: Api, user: TestUser, query: str = "") -> dict[str, Any]:
    """GET /me/notifications as `user` (200)."""
    r = await api.call("GET", f"/me/notifications{query}", user)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def built(api: Api, db: Database, settings: Settings, org: Org, user: TestUser, body: dict[str, Any]) -> str:
    """`user`'s export, created through the API and run to its end by the real pipeline; its id."""
    export = await create_export(api, org, user, body)
    await run_export(runner(settings, db), uid(export["id"]), uid(org.id))
    return str(export["id"])


async def test_a_completed_export_tells_its_creator_and_no_one_else(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["one", "two", "three"])
    export_id = await built(api, db, settings, org, org.member, {"kind": "tickets_csv", "filters": {"q": "one"}})

    page = await listed(api, org.member)
    assert page["unread"] == 1 and page["next"] is None
    (item,) = page["items"]
    assert set(item) == {"id", "at", "type", "orgId", "exportId", "title", "readAt"}
    assert item["type"] == "export.completed"
    assert item["orgId"] == org.id and item["exportId"] == export_id
    assert item["title"] == "Your Tickets (CSV) export in Acme is ready"
    assert item["readAt"] is None
    for other in (org.owner, org.admin, org.customer):
        assert await listed(api, other) == {"items": [], "next": None, "unread": 0}
    # One row per channel for the one recipient: the in-app one delivered, the email one owed.
    rows = owner.execute(
        "SELECT channel, user_id, state, details FROM notifications WHERE export_id = %s ORDER BY channel",
        (export_id,),
    ).fetchall()
    assert [(c, u, s) for c, u, s, _ in rows] == [
        ("app", org.member.id, "delivered"),
        ("email", org.member.id, "pending"),
    ]
    details = rows[1][3]
    assert details["kind"] == "tickets_csv" and details["rows"] == 1 and details["bytes"] > 0
    assert details["expiresAt"] and "q" not in details and "filters" not in details


async def test_a_failed_export_tells_its_creator_why(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["one", "two"])
    export_id = await built(api, db, tuned(settings, export_row_limit=1), org, org.member, {"kind": "tickets_csv"})
    (item,) = (await listed(api, org.member))["items"]
    assert (item["type"], item["exportId"]) == ("export.failed", export_id)
    assert item["title"] == "Your Tickets (CSV) export in Acme failed"


async def test_a_cancellation_by_an_admin_is_told_one_s_own_is_not(api: Api, owner: psycopg.Connection[Any]) -> None:
    org = await api.org()
    own = await create_export(api, org, org.member, {"kind": "snapshot"})
    r = await api.call("DELETE", org.path(f"/exports/{own['id']}"), org.member)
    assert r.status_code == 204, r.text
    assert (await listed(api, org.member))["items"] == []

    stopped = await create_export(api, org, org.member, {"kind": "snapshot"})
    r = await api.call("DELETE", org.path(f"/exports/{stopped['id']}"), org.admin)
    assert r.status_code == 204, r.text
    (item,) = (await listed(api, org.member))["items"]
    assert (item["type"], item["exportId"]) == ("export.cancelled", stopped["id"])
    assert item["title"] == "Your Snapshot (JSON) export in Acme was cancelled"
    assert (await listed(api, org.admin))["items"] == []
    (details,) = owner.execute(
        "SELECT details FROM notifications WHERE export_id = %s AND channel = 'email'", (stopped["id"],)
    ).fetchone()  # type: ignore[misc]
    assert details == {"kind": "snapshot", "errorCode": "cancelled_by_admin"}


async def test_a_role_change_that_stops_an_export_tells_its_creator(api: Api) -> None:
    org = await api.org()
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.admin, json={"role": "customer"})
    assert r.status_code == 200, r.text
    (item,) = (await listed(api, org.member))["items"]
    assert (item["type"], item["exportId"]) == ("export.cancelled", export["id"])


async def test_a_deletion_request_tells_every_owner(api: Api) -> None:
    org = await api.org()
    second = org.admin
    r = await api.call("PATCH", org.path(f"/members/{second.id}"), org.owner, json={"role": "owner"})
    assert r.status_code == 200, r.text
    await request_deletion(api, org)
    for who in (org.owner, second):
        (item,) = (await listed(api, who))["items"]
        assert item["type"] == "org.deletion_requested" and item["orgId"] == org.id
        assert item["title"] == "Acme is going to be deleted" and "exportId" not in item
    for who in (org.member, org.customer):
        assert (await listed(api, who))["items"] == []


async def test_reading_one_and_reading_all(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    ids = [await built(api, db, settings, org, org.member, {"kind": "snapshot"}) for _ in range(3)]
    page = await listed(api, org.member)
    assert page["unread"] == 3
    assert [i["exportId"] for i in page["items"]] == ids[::-1]  # newest first
    newest = page["items"][0]["id"]

    r = await api.call("POST", f"/me/notifications/{newest}/read", org.member)
    assert r.status_code == 204, r.text
    page = await listed(api, org.member)
    assert page["unread"] == 2
    read_at = page["items"][0]["readAt"]
    assert read_at is not None and all(i["readAt"] is None for i in page["items"][1:])
    # Reading it again changes nothing.
    r = await api.call("POST", f"/me/notifications/{newest}/read", org.member)
    assert r.status_code == 204 and (await listed(api, org.member))["items"][0]["readAt"] == read_at

    r = await api.call("POST", "/me/notifications/read", org.member)
    assert r.status_code == 204, r.text
    page = await listed(api, org.member)
    assert page["unread"] == 0 and all(i["readAt"] for i in page["items"])
    assert page["items"][0]["readAt"] == read_at


async def test_another_user_s_notification_is_404(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await built(api, db, settings, org, org.member, {"kind": "snapshot"})
    (item,) = (await listed(api, org.member))["items"]
    for who in (org.owner, org.admin):
        r = await api.call("POST", f"/me/notifications/{item['id']}/read", who)
        assert_problem(r, 404, "not_found")
        r = await api.call("POST", "/me/notifications/read", who)
        assert r.status_code == 204
    for bad in (str(uuid.uuid4()), "not-a-uuid"):
        assert_problem(await api.call("POST", f"/me/notifications/{bad}/read", org.member), 404, "not_found")
    # Nobody else's reading touched it.
    assert (await listed(api, org.member))["items"][0]["readAt"] is None
    assert_problem(await api.call("GET", "/me/notifications"), 401, "unauthenticated")


async def test_the_list_spans_orgs_and_an_org_the_caller_left_shows_none(
    api: Api, db: Database, settings: Settings
) -> None:
    first = await api.org()
    second = await api.org("Beta")
    person = first.member
    r = await api.call("POST", second.path("/members"), second.owner, json={"email": person.email, "role": "member"})
    assert r.status_code == 201, r.text
    in_first = await built(api, db, settings, first, person, {"kind": "snapshot"})
    in_second = await built(api, db, settings, second, person, {"kind": "snapshot"})
    page = await listed(api, person)
    assert [(i["orgId"], i["exportId"]) for i in page["items"]] == [(second.id, in_second), (first.id, in_first)]
    assert page["unread"] == 2
    left = page["items"][1]["id"]

    r = await api.call("DELETE", first.path(f"/members/{person.id}"), first.owner)
    assert r.status_code == 204, r.text
    page = await listed(api, person)
    assert [i["orgId"] for i in page["items"]] == [second.id] and page["unread"] == 1
    assert_problem(await api.call("POST", f"/me/notifications/{left}/read", person), 404, "not_found")
    # Added back, the old notifications are theirs again: they were never anyone else's.
    r = await api.call("POST", first.path("/members"), first.owner, json={"email": person.email, "role": "member"})
    assert r.status_code == 201, r.text
    assert (await listed(api, person))["unread"] == 2


async def test_pages_follow_the_cursor(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    ids = [await built(api, db, settings, org, org.member, {"kind": "snapshot"}) for _ in range(3)]
    seen: list[str] = []
    query = "?limit=2"
    while True:
        page = await listed(api, org.member, query)
        assert page["unread"] == 3
        seen += [i["exportId"] for i in page["items"]]
        if page["next"] is None:
            break
        query = f"?limit=2&before={page['next']}"
    assert seen == ids[::-1]
    for bad in ("?before=nope", "?limit=0", "?limit=201", f"?before={page['items'][0]['id']}"):
        assert_problem(await api.call("GET", f"/me/notifications{bad}", org.member), 400, "invalid_request")
    # Another user's cursor names no row of theirs.
    first = (await listed(api, org.member, "?limit=1"))["next"]
    assert_problem(await api.call("GET", f"/me/notifications?before={first}", org.owner), 400, "invalid_request")


async def test_preferences_default_on_and_change_by_type(api: Api) -> None:
    user = await api.users.make("prefs")
    other = await api.users.make("other")
    everything = {
        "export.completed",
        "export.failed",
        "export.cancelled",
        "org.deletion_requested",
        "schedule.paused",
        "import.completed",
        "import.failed",
    }
    r = await api.call("GET", "/me/preferences", user)
    assert r.status_code == 200, r.text
    assert r.json() == {"email": dict.fromkeys(everything, True)}

    r = await api.call("PUT", "/me/preferences", user, json={"email": {"export.completed": False}})
    assert r.status_code == 200, r.text
    assert r.json()["email"] == {**dict.fromkeys(everything, True), "export.completed": False}
    r = await api.call("PUT", "/me/preferences", user, json={"email": {"export.failed": False}})
    assert r.json()["email"] == {**dict.fromkeys(everything, True), "export.completed": False, "export.failed": False}
    r = await api.call("PUT", "/me/preferences", user, json={"email": {"export.completed": True}})
    assert r.json()["email"] == {**dict.fromkeys(everything, True), "export.failed": False}
    assert (await api.call("GET", "/me/preferences", user)).json() == r.json()
    # One user's choice is theirs alone.
    assert (await api.call("GET", "/me/preferences", other)).json() == {"email": dict.fromkeys(everything, True)}


@pytest.mark.parametrize(
    "body",
    [
        {"email": {"export.started": False}},
        {"email": {"export.completed": "no"}},
        {"email": {"export.completed": None}},
        {"email": []},
        {"email": {}, "sms": {}},
        {},
    ],
)
async def test_malformed_preferences_are_400(api: Api, body: dict[str, Any]) -> None:
    user = await api.users.make("prefs")
    body_r = await api.call("PUT", "/me/preferences", user, json=body)
    problem = assert_problem(body_r, 400, "invalid_request")
    if "export.started" in str(body):
        assert "export.started" in problem["detail"]
    assert (await api.call("GET", "/me/preferences", user)).json()["email"]["export.completed"] is True
