"""Tickets over HTTP: numbering, roles, customer scope (RLS), filters, pagination, triage, IDOR, bad input."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import event, select, text

from space.db import Database, Tenant, UnitOfWork
from space.tickets.models import Ticket
from tests.helpers import Api, Org, OrgFactory, assert_problem

if TYPE_CHECKING:
    # Imported for annotations only: pytest would try to collect a Test* class imported at runtime.
    from tests.helpers import TestUser


async def _ticket(api: Api, org: Org, user: TestUser, title: str = "Help", **fields: Any) -> dict[str, Any]:
    r = await api.call("POST", org.path("/tickets"), user, json={"title": title, **fields})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def _list(api: Api, org: Org, user: TestUser, **params: Any) -> dict[str, Any]:
    r = await api.call("GET", org.path("/tickets"), user, params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _numbers(api: Api, org: Org, user: TestUser, **params: Any) -> list[int]:
    return [t["number"] for t in (await _list(api, org, user, **params))["items"]]


async def _patch(api: Api, org: Org, number: int, user: TestUser | None = None, **fields: Any) -> dict[str, Any]:
    r = await api.call("PATCH", org.path(f"/tickets/{number}"), user or org.member, json=fields)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def test_ticket_numbers_are_per_org(api: Api, orgs: OrgFactory) -> None:
    a = await orgs.make("A")
    b = await orgs.make("B")
    first = await _ticket(api, a, a.customer, "Printer on fire", body="Smoke", priority="urgent")
    assert set(first) >= {"number", "title", "body", "status", "priority", "creatorId", "assigneeId"}
    assert first["number"] == 1 and first["title"] == "Printer on fire" and first["body"] == "Smoke"
    assert first["status"] == "open" and first["priority"] == "urgent" and first["assigneeId"] is None
    assert first["creatorId"] == str(a.customer.id) and first["createdAt"] == first["updatedAt"]
    assert (await _ticket(api, a, a.member))["number"] == 2
    assert (await _ticket(api, b, b.owner))["number"] == 1
    assert (await _ticket(api, a, a.admin))["number"] == 3
    assert (await _ticket(api, b, b.customer2))["number"] == 2
    assert await _numbers(api, a, a.owner) == [1, 2, 3]
    assert await _numbers(api, b, b.owner) == [1, 2]


async def test_concurrent_creates_get_distinct_consecutive_numbers(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    makers = [org.owner, org.admin, org.member, org.customer, org.customer2] * 2
    calls = [("POST", org.path("/tickets"), u, {"title": f"t{i}"}) for i, u in enumerate(makers)]
    responses = await api.concurrently(calls)
    assert [r.status_code for r in responses] == [201] * 10, [r.text for r in responses]
    assert sorted(r.json()["number"] for r in responses) == list(range(1, 11))
    assert await _numbers(api, org, org.owner) == list(range(1, 11))


async def test_roles_on_tickets(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    for user in (org.owner, org.admin, org.member, org.customer):
        await _ticket(api, org, user, f"from {user.name}")
    # Customers open tickets but never triage them, not even their own.
    r = await api.call("PATCH", org.path("/tickets/4"), org.customer, json={"status": "closed"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("PATCH", org.path("/tickets/1"), org.customer, json={"priority": "low"})
    assert_problem(r, 403, "forbidden")
    r = await api.call("GET", org.path("/tickets"), org.customer)
    assert [(t["number"], t["status"]) for t in r.json()["items"]] == [(4, "open")]
    for n, user in enumerate((org.owner, org.admin, org.member), start=1):
        assert (await _patch(api, org, n, user, status="pending"))["status"] == "pending"


async def test_customers_see_only_their_own_tickets_even_when_all_match(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    marker = f"mk{uuid.uuid4().hex[:8]}"
    mine = [(await _ticket(api, org, org.customer, f"{marker} one {i}"))["number"] for i in range(3)]
    theirs = [(await _ticket(api, org, org.customer2, f"{marker} two {i}"))["number"] for i in range(3)]
    staff = (await _ticket(api, org, org.member, f"{marker} staff"))["number"]
    for n in (*mine, *theirs, staff):
        await _patch(api, org, n, status="pending", priority="high")
    # Every ticket matches these filters, so only the customer scope can tell them apart.
    filters = {"status": "pending", "priority": "high", "q": marker, "assignment": "all"}
    for customer, own in ((org.customer, mine), (org.customer2, theirs)):
        for params in (filters, {}, {"q": marker}, {"assignment": "unassigned"}):
            page = await _list(api, org, customer, **params)
            assert [t["number"] for t in page["items"]] == own and page["total"] == 3, (params, page)
            assert {t["creatorId"] for t in page["items"]} == {str(customer.id)}
    for user in (org.owner, org.admin, org.member):
        page = await _list(api, org, user, **filters)
        assert [t["number"] for t in page["items"]] == sorted([*mine, *theirs, staff]) and page["total"] == 7


async def test_filters(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    n_pct = (await _ticket(api, org, org.customer, "Discount 100% off", priority="low"))["number"]
    n_plain = (await _ticket(api, org, org.customer, "Discount 1000 off", priority="high"))["number"]
    n_under = (await _ticket(api, org, org.customer2, "file a_b.txt", body="see attachment"))["number"]
    n_any = (await _ticket(api, org, org.member, "file axb.txt", body="Attachment missing", priority="high"))["number"]
    n_back = (await _ticket(api, org, org.admin, "path C:\\temp", priority="urgent"))["number"]
    await _patch(api, org, n_pct, assigneeId=org.memberships["member"], status="solved")
    await _patch(api, org, n_plain, assigneeId=org.memberships["admin"])
    await _patch(api, org, n_back, status="closed")

    assert await _numbers(api, org, org.owner) == [n_pct, n_plain, n_under, n_any, n_back]
    assert await _numbers(api, org, org.owner, status="open") == [n_plain, n_under, n_any]
    assert await _numbers(api, org, org.owner, status="solved") == [n_pct]
    assert await _numbers(api, org, org.owner, priority="high") == [n_plain, n_any]
    assert await _numbers(api, org, org.owner, priority="high", status="open") == [n_plain, n_any]
    assert await _numbers(api, org, org.owner, priority="normal") == [n_under]

    # `mine` is the caller's membership id, never their user id.
    assert await _numbers(api, org, org.member, assignment="mine") == [n_pct]
    assert await _numbers(api, org, org.admin, assignment="mine") == [n_plain]
    assert await _numbers(api, org, org.owner, assignment="mine") == []
    assert await _numbers(api, org, org.owner, assignment="unassigned") == [n_under, n_any, n_back]
    assert await _numbers(api, org, org.owner, assignment="all") == [n_pct, n_plain, n_under, n_any, n_back]

    # q matches title or body, case-insensitively, with LIKE wildcards taken literally.
    assert await _numbers(api, org, org.owner, q="%") == [n_pct]
    assert await _numbers(api, org, org.owner, q="100%") == [n_pct]
    assert await _numbers(api, org, org.owner, q="_") == [n_under]
    assert await _numbers(api, org, org.owner, q="a_b") == [n_under]
    assert await _numbers(api, org, org.owner, q="\\") == [n_back]
    assert await _numbers(api, org, org.owner, q="ATTACHMENT") == [n_under, n_any]
    assert await _numbers(api, org, org.owner, q="discount") == [n_pct, n_plain]
    assert await _numbers(api, org, org.owner, q="") == [n_pct, n_plain, n_under, n_any, n_back]
    assert await _numbers(api, org, org.owner, q="attachment", priority="high") == [n_any]


async def test_pagination(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    for i in range(5):
        await _ticket(api, org, org.customer, f"page {i}", priority="low" if i % 2 else "normal")
    default = await _list(api, org, org.owner)
    assert default["page"] == 1 and default["pageSize"] == 50 and default["total"] == 5
    pages = [await _list(api, org, org.owner, page=p, pageSize=2) for p in (1, 2, 3, 4)]
    assert [[t["number"] for t in p["items"]] for p in pages] == [[1, 2], [3, 4], [5], []]
    assert {(p["total"], p["pageSize"]) for p in pages} == {(5, 2)}
    assert [p["page"] for p in pages] == [1, 2, 3, 4]
    # The total counts the filtered rows, not the org's.
    low = await _list(api, org, org.owner, priority="low", pageSize=1, page=2)
    assert [t["number"] for t in low["items"]] == [4] and low["total"] == 2
    assert (await _list(api, org, org.owner, pageSize=200))["pageSize"] == 200


async def test_patch_ticket(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    other = await orgs.make("Other")
    t = await _ticket(api, org, org.customer, "Broken", body="It broke", priority="low")
    n = t["number"]

    a = await _patch(api, org, n, status="pending")
    assert (a["status"], a["priority"], a["assigneeId"]) == ("pending", "low", None)
    assert dt.datetime.fromisoformat(a["updatedAt"]) > dt.datetime.fromisoformat(t["updatedAt"])
    assert a["createdAt"] == t["createdAt"] and a["title"] == "Broken" and a["body"] == "It broke"
    b = await _patch(api, org, n, org.admin, priority="urgent", assigneeId=org.memberships["member"])
    assert (b["status"], b["priority"], b["assigneeId"]) == ("pending", "urgent", org.memberships["member"])
    # Fields left out stay as they are; an explicit null unassigns.
    c = await _patch(api, org, n, org.owner, status="solved")
    assert (c["status"], c["priority"], c["assigneeId"]) == ("solved", "urgent", org.memberships["member"])
    d = await _patch(api, org, n, org.owner, assigneeId=None)
    assert (d["status"], d["priority"], d["assigneeId"]) == ("solved", "urgent", None)
    assert dt.datetime.fromisoformat(d["updatedAt"]) > dt.datetime.fromisoformat(c["updatedAt"])

    # Assignees are staff memberships of this org: not a user id, not another org's, not a customer's.
    for bad in (
        str(org.owner.id),
        other.memberships["member"],
        org.memberships["customer"],
        str(uuid.uuid4()),
        "not-a-uuid",
        5,
    ):
        r = await api.call("PATCH", org.path(f"/tickets/{n}"), org.owner, json={"assigneeId": bad})
        body = assert_problem(r, 400, "invalid_request")
        assert "assigneeId" in body["detail"], body
    page = await _list(api, org, org.owner)
    assert [(x["assigneeId"], x["status"]) for x in page["items"]] == [(None, "solved")]


async def test_other_orgs_unknown_and_malformed_ticket_numbers_are_one_404(api: Api, orgs: OrgFactory) -> None:
    mine = await orgs.make()
    theirs = await orgs.make("Other")
    await _ticket(api, mine, mine.customer, "mine")
    for i in range(3):
        await _ticket(api, theirs, theirs.customer, f"secret {i}")
    bodies = []
    # 3 exists only in the other org; the rest can't be a ticket here at all.
    for number in ("3", "999", "0", "-1", "1.5", "abc", "99999999999999999999", "%201", "\u0661"):
        r = await api.call("PATCH", mine.path(f"/tickets/{number}"), mine.owner, json={"status": "closed"})
        bodies.append(assert_problem(r, 404, "not_found"))
    r = await api.call("PATCH", theirs.path("/tickets/1"), mine.owner, json={"status": "closed"})
    bodies.append(assert_problem(r, 404, "not_found"))
    r = await api.call("GET", theirs.path("/tickets"), mine.customer)
    bodies.append(assert_problem(r, 404, "not_found"))
    assert all(b == bodies[0] for b in bodies), bodies
    page = await _list(api, theirs, theirs.owner)
    assert {t["status"] for t in page["items"]} == {"open"} and page["total"] == 3


async def test_bad_ticket_input_is_400(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    await _ticket(api, org, org.customer)
    for params, field in [
        ({"status": "bogus"}, "status"),
        ({"priority": "critical"}, "priority"),
        ({"assignment": "yours"}, "assignment"),
        ({"page": "0"}, "page"),
        ({"page": "abc"}, "page"),
        ({"page": "99999999999999999999999"}, "page"),
        ({"pageSize": "500"}, "pageSize"),
        ({"pageSize": "0"}, "pageSize"),
        ({"q": "x" * 201}, "q"),
        ({"q": "a\x00b"}, "q"),
    ]:
        for user in (org.owner, org.customer):
            r = await api.call("GET", org.path("/tickets"), user, params=params)
            body = assert_problem(r, 400, "invalid_request")
            assert body["detail"].startswith(f"{field}:"), body
    # 200 characters is still fine.
    assert (await _list(api, org, org.owner, q="x" * 200))["total"] == 0

    for fields in (
        {"title": "t", "priority": "critical"},
        {"title": "t", "status": "closed"},
        {"title": "t", "creatorId": str(org.owner.id)},
        {"title": "nul\x00here"},
        {"title": "t", "body": "nul\x00here"},
        {"title": "x" * 501},
        {"title": " \n "},
        {"body": "no title"},
    ):
        r = await api.call("POST", org.path("/tickets"), org.customer, json=fields)
        assert_problem(r, 400, "invalid_request")
    patches: list[dict[str, Any]] = [
        {"status": "reopened"},
        {"status": None},
        {"priority": "critical"},
        {"title": "renamed"},
        {"number": 7},
    ]
    for change in patches:
        r = await api.call("PATCH", org.path("/tickets/1"), org.member, json=change)
        assert_problem(r, 400, "invalid_request")
    for method, path in (("POST", "/tickets"), ("PATCH", "/tickets/1")):
        r = await api.call(
            method, org.path(path), org.member, content=b'{"title": "x"', headers={"content-type": "application/json"}
        )
        assert_problem(r, 400, "invalid_request")
    # Nothing was written by the refused requests.
    page = await _list(api, org, org.owner)
    assert [(t["number"], t["title"], t["status"], t["priority"]) for t in page["items"]] == [
        (1, "Help", "open", "normal")
    ]


async def _csv_columns(db: Database, org: Org, number: int) -> tuple[str, str, dt.datetime, dt.datetime]:
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        row = (
            await uow.session.execute(
                select(Ticket.csv_head, Ticket.csv_tail, Ticket.created_at, Ticket.updated_at).where(
                    Ticket.org_id == uuid.UUID(org.id), Ticket.number == number
                )
            )
        ).one()
    return row.csv_head, row.csv_tail, row.created_at, row.updated_at


def _utc(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def test_stored_csv_text_follows_every_write(api: Api, orgs: OrgFactory, db: Database) -> None:
    org = await orgs.make()
    n = (await _ticket(api, org, org.customer, '=SUM(A1) "quoted", comma'))["number"]
    head, tail, created, updated = await _csv_columns(db, org, n)
    # Guarded (formula start), quoted, inner quotes doubled; the cells after the assignee: both timestamps.
    assert head == f'"{n}","\'=SUM(A1) ""quoted"", comma","open","normal",'
    assert tail == f',"{_utc(created)}","{_utc(updated)}"\r\n' and created == updated

    await _patch(api, org, n, status="pending", priority="urgent", assigneeId=org.memberships["member"])
    head, tail, created2, updated2 = await _csv_columns(db, org, n)
    assert head == f'"{n}","\'=SUM(A1) ""quoted"", comma","pending","urgent",'
    assert created2 == created and updated2 > updated
    assert tail == f',"{_utc(created)}","{_utc(updated2)}"\r\n'

    # A whole second (no fraction) still gets all six fractional digits.
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        await uow.session.execute(
            text("UPDATE tickets SET updated_at = '2030-01-02 03:04:05+00' WHERE org_id = :o AND number = :n"),
            {"o": uuid.UUID(org.id), "n": n},
        )
    assert (await _csv_columns(db, org, n))[1].endswith(',"2030-01-02T03:04:05.000000Z"\r\n')

    plain = (await _ticket(api, org, org.member, "Plain title"))["number"]
    assert (await _csv_columns(db, org, plain))[0] == f'"{plain}","Plain title","open","normal",'
    full_width = (await _ticket(api, org, org.member, "\uff0b1 full-width plus"))["number"]
    assert (await _csv_columns(db, org, full_width))[0].startswith(f'"{full_width}","\'\uff0b1 full-width plus"')


async def test_stored_display_name_follows_a_rename(api: Api, orgs: OrgFactory, db: Database, owner_url: str) -> None:
    org = await orgs.make()

    async def csv_name() -> str:
        async with UnitOfWork(db.sessionmaker) as uow:
            name = await uow.session.scalar(text("SELECT csv_name FROM users WHERE id = :u"), {"u": org.member.id})
        return str(name)

    assert await csv_name() == f'"{org.member.name}"'
    # The app role cannot rename users; an operator (the owner role) can, and the column follows.
    for name, cell in [('@here "now"', '"\'@here ""now"""'), ("\u00a0-1", '"\'\u00a0-1"'), ("Ann", '"Ann"')]:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("UPDATE users SET name = %s WHERE id = %s", (name, org.member.id))
        assert await csv_name() == cell


async def test_a_customer_list_names_its_creator_for_the_planner(api: Api, orgs: OrgFactory) -> None:
    org = await orgs.make()
    await _ticket(api, org, org.customer, "mine")
    await _ticket(api, org, org.customer2, "theirs")
    await _ticket(api, org, org.member, "staff")
    engine = api.client.app.state.db.engine.sync_engine
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "FROM tickets" in statement:
            seen.append(statement)

    # RLS alone scopes a customer, in a form the planner cannot use for an index: the page and the count
    # also say `creator_id = <caller>`, so the (org_id, creator_id, number) index answers them.
    event.listen(engine, "before_cursor_execute", record)
    try:
        assert await _numbers(api, org, org.customer) == [1]
        customer_sql, seen[:] = list(seen), []
        assert await _numbers(api, org, org.member) == [1, 2, 3]
        staff_sql = list(seen)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(customer_sql) == 2 and all("tickets.creator_id =" in q for q in customer_sql), customer_sql
    assert staff_sql and not any("tickets.creator_id =" in q for q in staff_sql), staff_sql
    assert (await _list(api, org, org.customer))["total"] == 1
    assert await _numbers(api, org, org.customer2) == [2]
