"""Ticket search `q` (SPEC §14): always returns exactly the tickets whose title or body contains `q` (served by an
index, so it answers within the API's statement timeout on an org of 1,000,000 tickets: tests/test_million_rows.py)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from space.db import Database, Tenant, UnitOfWork
from space.tickets.service import SEARCH_MAX_IDS
from tests.exports.fixtures import add_tickets
from tests.helpers import Api, Org, OrgFactory

RARE = "Xylophonique"
"""The word the searches look for."""


async def _list(api: Api, org: Org | str, token_user: Any, q: str, **params: Any) -> dict[str, Any]:
    path = org.path("/tickets") if isinstance(org, Org) else f"/orgs/{org}/tickets"
    r = await api.call("GET", path, token_user, params={"q": q, **params})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


# --- the search's rules, on the suite's database ----------------------------------------------------------------


async def test_search_finds_title_or_body_case_insensitively_and_only_that(
    api: Api, orgs: OrgFactory, db: Database
) -> None:
    org = await orgs.make()
    hits = await add_tickets(db, org.id, org.member, [f"about {RARE.lower()} here", "plain"], body="")
    hits += await add_tickets(db, org.id, org.member, ["plain title"], body=f"body says {RARE.upper()}!")
    await add_tickets(db, org.id, org.member, ["Xylophon ique", "nothing"], body="Xylophoniqu")
    # LIKE's own characters are literal in q.
    percent = await add_tickets(db, org.id, org.member, ["100%_done"])
    await add_tickets(db, org.id, org.member, ["1000 done"])
    page = await _list(api, org, org.member, RARE)
    assert [t["number"] for t in page["items"]] == [hits[0], hits[2]] and page["total"] == 2
    page = await _list(api, org, org.member, "0%_d")
    assert [t["number"] for t in page["items"]] == percent and page["total"] == 1


async def test_search_for_customers_stays_their_own(api: Api, orgs: OrgFactory, db: Database) -> None:
    org = await orgs.make()
    mine = await add_tickets(db, org.id, org.customer, [f"{RARE} one", f"{RARE} two"])
    theirs = await add_tickets(db, org.id, org.customer2, [f"{RARE} three"])
    staff = await add_tickets(db, org.id, org.member, [f"{RARE} four"])
    assert [t["number"] for t in (await _list(api, org, org.customer, RARE))["items"]] == mine
    assert [t["number"] for t in (await _list(api, org, org.customer2, RARE))["items"]] == theirs
    assert (await _list(api, org, org.admin, RARE))["total"] == len(mine + theirs + staff)


async def test_search_function_lists_only_the_callers_context(api: Api, orgs: OrgFactory, db: Database) -> None:
    org, other = await orgs.make(), await orgs.make()
    await add_tickets(db, org.id, org.member, [f"{RARE} a", f"{RARE} b", f"{RARE} c"])
    await add_tickets(db, other.id, other.member, [f"{RARE} elsewhere"])
    pattern = f"%{RARE}%"

    async def search(tenant: Tenant, cap: int) -> Any:
        async with UnitOfWork(db.sessionmaker, tenant) as uow:
            return await uow.session.scalar(text("SELECT space_ticket_search(:p, :n)"), {"p": pattern, "n": cap})

    assert len(await search(Tenant(org_id=uuid.UUID(org.id)), 3)) == 3
    assert await search(Tenant(org_id=uuid.UUID(org.id)), 2) is None  # more than the cap: not selective
    assert await search(Tenant(), 10) == []  # no tenant context, nothing
    assert len(await search(Tenant(org_id=uuid.UUID(other.id)), 10)) == 1
    customer = Tenant(org_id=uuid.UUID(org.id), user_id=org.customer.id, customer_id=org.customer.id)
    assert await search(customer, 10) == []


async def test_an_unselective_search_is_still_exact(api: Api, orgs: OrgFactory, db: Database) -> None:
    # More matches than the list reads by id: it walks the org in number order instead, with the same answer.
    org = await orgs.make()
    n = SEARCH_MAX_IDS + 5
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        await uow.session.execute(
            text(
                "WITH c AS (UPDATE ticket_counters SET last_number = last_number + :n WHERE org_id = :org"
                " RETURNING last_number - :n AS start)"
                " INSERT INTO tickets (id, org_id, number, title, creator_id)"
                " SELECT gen_random_uuid(), :org, c.start + i, CASE WHEN i % 2 = 0 THEN 'common word' ELSE 'x' END"
                " || ' #' || i, :creator FROM c, generate_series(1, CAST(:n AS int)) AS i"
            ),
            {"n": 2 * n, "org": uuid.UUID(org.id), "creator": org.member.id},
        )
    page = await _list(api, org, org.member, "COMMON", pageSize=5, page=3)
    assert page["total"] == n
    assert [t["number"] for t in page["items"]] == [22, 24, 26, 28, 30]
