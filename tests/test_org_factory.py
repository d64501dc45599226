"""The direct-insert org factory (tests.helpers.OrgFactory) leaves what POST /orgs and the member routes leave
(`Api.org`), as the API and the database's owner see it: same people, roles, order, creator and ticket counter."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.helpers import Api, Org, OrgFactory


async def _seen(api: Api, org: Org) -> dict[str, Any]:
    """What the org's people see of it through the API."""
    r = await api.call("GET", org.path(), org.owner)
    assert r.status_code == 200, r.text
    members = await api.call("GET", org.path("/members"), org.customer)
    assert members.status_code == 200, members.text
    ticket = await api.call("POST", org.path("/tickets"), org.customer2, json={"title": "first"})
    assert ticket.status_code == 201, ticket.text
    people = {"owner": org.owner, "admin": org.admin, "member": org.member, "customer": org.customer}
    people["customer2"] = org.customer2
    by_user = {str(u.id): key for key, u in people.items()}
    return {
        "org": {k: v for k, v in r.json().items() if k not in ("id", "createdAt", "updatedAt")},
        "members": [
            (by_user[m["userId"]], m["role"], m["id"] == org.memberships[by_user[m["userId"]]])
            for m in members.json()["items"]
        ],
        "first_ticket": ticket.json()["number"],
    }


async def test_a_direct_org_is_what_the_routes_make(api: Api, orgs: OrgFactory, owner: psycopg.Connection[Any]) -> None:
    routed, direct = await api.org("Twin"), await orgs.make("Twin")
    assert await _seen(api, direct) == await _seen(api, routed)
    created_by = dict(
        owner.execute(
            "SELECT id::text, created_by FROM organizations WHERE id = ANY(%s::uuid[])", ([routed.id, direct.id],)
        ).fetchall()
    )
    assert created_by == {routed.id: routed.owner.id, direct.id: direct.owner.id}


async def test_an_owner_given_owns_every_org_made_for_them(api: Api, orgs: OrgFactory) -> None:
    first = await orgs.make("First")
    second = await orgs.make("Second", owner=first.owner)
    assert second.owner == first.owner and second.admin != first.admin
    r = await api.call("GET", "/orgs", first.owner)
    assert r.status_code == 200, r.text
    assert [(o["id"], o["name"]) for o in r.json()["items"]] == [(first.id, "First"), (second.id, "Second")]
