"""The export lists a page at a time (SPEC §27: lists paginated): `limit`, `before` and `next` (absent on the last page), for the caller's
own exports and the org's (owners and admins), newest first, every export exactly once across the pages."""

from __future__ import annotations

import datetime as dt

from space.db import Database
from tests.exports.fixtures import insert_export
from tests.helpers import Api, assert_problem


async def _walk(api: Api, path: str, user: object, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    before: str | None = None
    while True:
        suffix = f"&before={before}" if before else ""
        sep = "&" if "?" in path else "?"
        r = await api.call("GET", f"{path}{sep}limit={limit}{suffix}", user)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append([x["id"] for x in body["items"]])
        before = body.get("next")
        if before is None:
            return pages


async def test_own_and_org_lists_page_through_every_export_once(api: Api, db: Database) -> None:
    org = await api.org()
    mine = [
        str(await insert_export(db, org.id, org.member.id, completed_ago=dt.timedelta(minutes=n))) for n in range(7)
    ]
    theirs = [
        str(await insert_export(db, org.id, org.admin.id, completed_ago=dt.timedelta(minutes=n, seconds=30)))
        for n in range(5)
    ]

    pages = await _walk(api, org.path("/exports"), org.member, 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    # Newest first (inserted newest first), each once; the admin's exports are not the member's.
    assert [x for p in pages for x in p] == mine

    pages = await _walk(api, org.path("/exports?scope=org"), org.admin, 4)
    assert [len(p) for p in pages] == [4, 4, 4]
    everything = [x for p in pages for x in p]
    assert sorted(everything) == sorted(mine + theirs) and len(set(everything)) == 12
    # Interleaved by creation time: m0, t0, m1, t1, ...
    assert everything[:4] == [mine[0], theirs[0], mine[1], theirs[1]]

    # Without `limit`: the whole list as before (up to 200), and no `next`.
    r = await api.call("GET", org.path("/exports"), org.member)
    assert [x["id"] for x in r.json()["items"]] == mine and "next" not in r.json()
    # An empty list is a page too.
    r = await api.call("GET", org.path("/exports"), org.customer)
    assert r.json() == {"items": []}


async def test_a_cursor_is_only_good_in_the_list_it_came_from(api: Api, db: Database) -> None:
    org = await api.org()
    other = await api.org("Other")
    for n in range(3):
        await insert_export(db, org.id, org.member.id, completed_ago=dt.timedelta(minutes=n))
        await insert_export(db, other.id, other.member.id, completed_ago=dt.timedelta(minutes=n))
    r = await api.call("GET", org.path("/exports?limit=1"), org.member)
    cursor = r.json()["next"]
    assert cursor is not None
    # Another user's list, another org's, and anything this service did not make: 400 naming `before`.
    for path, user in [
        (org.path(f"/exports?before={cursor}"), org.admin),
        (other.path(f"/exports?before={cursor}"), other.member),
        (org.path("/exports?before=bm90LWEtY3Vyc29y"), org.member),
        (org.path("/exports?before=%00"), org.member),
    ]:
        body = assert_problem(await api.call("GET", path, user), 400, "invalid_request")
        assert "before" in body["detail"], body
    # The org's list takes the cursor of a member's export (it is one of the org's), for owners and admins.
    r = await api.call("GET", org.path(f"/exports?scope=org&before={cursor}"), org.owner)
    assert r.status_code == 200, r.text
    for bad in ["0", "201", "x"]:
        assert_problem(await api.call("GET", org.path(f"/exports?limit={bad}"), org.member), 400, "invalid_request")
