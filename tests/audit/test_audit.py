"""The audit trail (SPEC §12): a row for every action, written with the change, newest first in keyset pages,
append-only for the app role, and `ip` from the connection (X-Forwarded-For only from a trusted proxy)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from space.audit.service import client_ip
from space.cli import server_config
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from tests.exports.fixtures import add_project, add_tickets, create_export, download, runner, tuned, uid, wait_for
from tests.helpers import Api, Org, assert_problem
from tests.helpers import TestUser as User


async def _trail(api: Api, org: Org, who: User, **params: Any) -> dict[str, Any]:
    r = await api.call("GET", org.path("/audit"), who, params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _line(item: dict[str, Any]) -> tuple[str, str | None, str, str]:
    actor = item["actor"]["userId"] if item["actor"] else None
    return item["action"], actor, item["target"]["type"], item["target"]["id"]


async def test_every_action_is_recorded_with_actor_target_and_order(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_project(db, org.id, "p", ["t"])
    await add_tickets(db, org.id, org.member, ["one", "two", "three"])
    owner, admin, member = org.owner, org.admin, org.member
    expected: list[tuple[str, str | None, str, str]] = [
        ("member.added", str(owner.id), "user", str(u.id)) for u in [org.admin, org.member, org.customer, org.customer2]
    ]

    def see(action: str, actor: User | None, target_type: str, target_id: Any) -> None:
        expected.append((action, None if actor is None else str(actor.id), target_type, str(target_id)))

    x = await api.users.make("x")
    r = await api.call("POST", org.path("/members"), admin, json={"email": x.email, "role": "member"})
    assert r.status_code == 201
    see("member.added", admin, "user", x.id)
    r = await api.call("PATCH", org.path(f"/members/{x.id}"), owner, json={"role": "admin"})
    assert r.status_code == 200
    see("member.role_changed", owner, "user", x.id)
    # The same role again changes nothing, and records nothing.
    r = await api.call("PATCH", org.path(f"/members/{x.id}"), owner, json={"role": "admin"})
    assert r.status_code == 200

    e1 = (await create_export(api, org, x, {"kind": "snapshot"}))["id"]
    see("export.requested", x, "export", e1)
    assert await run_export(runner(settings, db), uid(e1), uid(org.id)) == "completed"
    see("export.completed", None, "export", e1)
    got = await download(api, org, x, e1)
    assert got.status_code == 200
    see("export.downloaded", x, "export", e1)
    assert (await api.call("DELETE", org.path(f"/exports/{e1}"), x)).status_code == 204
    see("export.deleted", x, "export", e1)

    e2 = (await create_export(api, org, x, {"kind": "snapshot"}))["id"]
    see("export.requested", x, "export", e2)
    assert (await api.call("DELETE", org.path(f"/exports/{e2}"), admin)).status_code == 204
    see("export.cancelled", admin, "export", e2)

    e3 = (await create_export(api, org, member, {"kind": "tickets_csv"}))["id"]
    see("export.requested", member, "export", e3)
    assert await run_export(runner(tuned(settings, export_row_limit=1), db), uid(e3), uid(org.id)) == "too_many_rows"
    see("export.failed", None, "export", e3)
    e4 = (await create_export(api, org, member, {"kind": "tickets_csv"}))["id"]
    see("export.requested", member, "export", e4)
    assert (await api.call("DELETE", org.path(f"/exports/{e4}"), member)).status_code == 204
    see("export.cancelled", member, "export", e4)

    assert (await api.call("DELETE", org.path(f"/members/{x.id}"), owner)).status_code == 204
    see("member.removed", owner, "user", x.id)
    for method, path, action, body in [
        ("POST", "/suspend", "org.suspended", None),
        ("POST", "/reactivate", "org.reactivated", None),
        ("POST", "/deletion", "org.deletion_requested", {"confirm": "Acme", "skipFinalExport": True}),
        ("DELETE", "/deletion", "org.deletion_cancelled", None),
    ]:
        r = await api.call(method, org.path(path), owner, **({} if body is None else {"json": body}))
        assert r.status_code in (200, 202), r.text
        see(action, owner, "org", org.id)

    trail = await _trail(api, org, admin, limit=200)
    assert trail["next"] is None
    items = trail["items"]
    assert [_line(i) for i in items] == expected[::-1]
    by_action = {(i["action"], i["target"]["id"]): i for i in items}
    # Names come with actors; what each row says in its details.
    assert items[-1]["actor"] == {"userId": str(owner.id), "name": owner.name}
    assert by_action[("export.downloaded", e1)]["details"] == {
        "via": "bearer",
        "range": None,
        "bytes": int(got.headers["content-length"]),
    }
    assert by_action[("member.role_changed", str(x.id))]["details"] == {"from": "member", "to": "admin"}
    assert by_action[("member.removed", str(x.id))]["details"] == {"role": "admin"}
    assert by_action[("export.requested", e3)]["details"] == {"kind": "tickets_csv", "scope": "team"}
    assert by_action[("export.completed", e1)]["details"]["bytes"] == int(got.headers["content-length"])
    assert by_action[("export.failed", e3)]["details"] == {"errorCode": "too_many_rows"}
    assert by_action[("export.cancelled", e2)]["details"] == {"creatorId": str(x.id), "errorCode": "cancelled_by_admin"}
    assert by_action[("export.cancelled", e4)]["details"] == {"errorCode": "cancelled"}
    assert by_action[("export.deleted", e1)]["details"] == {"revoked": False}
    assert by_action[("org.deletion_requested", org.id)]["details"]["skipFinalExport"] is True
    # The test client's peer is not an address ("testclient"): nothing is made up.
    assert {i["ip"] for i in items} == {None}
    # Times never go backwards along the trail.
    ats = [i["at"] for i in items]
    assert ats == sorted(ats, reverse=True)

    # The same trail in pages of 4, through the cursor alone.
    paged: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await _trail(api, org, owner, limit=4, **({} if cursor is None else {"before": cursor}))
        assert len(page["items"]) <= 4
        paged += page["items"]
        cursor = page["next"]
        if cursor is None:
            break
    assert paged == items
    assert len((await _trail(api, org, owner))["items"]) == min(50, len(items))


def _decoded(cursor: str) -> Any:
    return msgspec.json.decode(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


async def test_the_cursor_says_nothing_of_other_orgs(api: Api) -> None:
    org, other = await api.org("Watcher"), await api.org("Busy")
    first = await _trail(api, org, org.owner, limit=2)
    # Other orgs act between the two pages (and between the org's own rows).
    for _ in range(3):
        x = await api.users.make("x")
        r = await api.call("POST", other.path("/members"), other.owner, json={"email": x.email, "role": "member"})
        assert r.status_code == 201
        r = await api.call("POST", org.path("/members"), org.owner, json={"email": x.email, "role": "member"})
        assert r.status_code == 201
    again = await _trail(api, org, org.owner, limit=1, before=first["next"])
    assert again["items"][0]["id"] != first["items"][-1]["id"]
    # The cursor holds nothing but the last row of its page, which the page shows anyway: no number that other
    # orgs' actions move. Paging on after them is unchanged.
    for page in (first, again, await _trail(api, org, org.owner, limit=2)):
        assert page["next"] is not None
        assert _decoded(page["next"]) == [2, page["items"][-1]["id"]]
    # A cursor of one org's trail is no cursor in another's.
    r = await api.call("GET", other.path("/audit"), other.owner, params={"before": first["next"]})
    assert_problem(r, 400, "invalid_request")


async def test_revocation_is_recorded_with_what_it_cancelled(api: Api) -> None:
    org = await api.org()
    export = await create_export(api, org, org.member, {"kind": "snapshot"})
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.admin, json={"role": "customer"})
    assert r.status_code == 200
    top = (await _trail(api, org, org.owner, limit=2))["items"]
    # Both in the change's transaction: the export's cancel, recorded after the role change it follows from.
    assert [_line(i) for i in top] == [
        ("export.cancelled", str(org.admin.id), "export", export["id"]),
        ("member.role_changed", str(org.admin.id), "user", str(org.member.id)),
    ]
    assert top[0]["details"] == {"creatorId": str(org.member.id), "errorCode": "access_revoked"}


async def test_trail_is_for_owners_and_admins_and_checks_its_input(api: Api) -> None:
    org, other = await api.org(), await api.org()
    for who in [org.member, org.customer]:
        assert_problem(await api.call("GET", org.path("/audit"), who), 403, "forbidden")
    assert_problem(await api.call("GET", org.path("/audit"), other.owner), 404, "not_found")
    assert_problem(await api.call("GET", "/orgs/nope/audit", org.owner), 404, "not_found")
    for params in [{"limit": 0}, {"limit": 201}, {"limit": "x"}]:
        assert_problem(await api.call("GET", org.path("/audit"), org.owner, params=params), 400, "invalid_request")
    for cursor in ["zzz", "", "!!", "WzEsLTFd", "WzIsNV0", "a" * 5000, "\x00"]:
        body = assert_problem(
            await api.call("GET", org.path("/audit"), org.owner, params={"before": cursor}), 400, "invalid_request"
        )
        assert "before" in body["detail"]
    # Each org's trail holds its own rows only.
    mine = {i["id"] for i in (await _trail(api, org, org.owner, limit=200))["items"]}
    theirs = {i["id"] for i in (await _trail(api, other, other.owner, limit=200))["items"]}
    assert mine and theirs and not mine & theirs


async def test_the_app_role_can_not_change_or_delete_audit_rows(api: Api, db: Database) -> None:
    org = await api.org()
    oid = uid(org.id)
    before = (await _trail(api, org, org.owner, limit=200))["items"]
    for statement in [
        "UPDATE audit_events SET action = 'member.removed' WHERE org_id = :org",
        "DELETE FROM audit_events WHERE org_id = :org",
        "TRUNCATE audit_events",
    ]:
        with pytest.raises(ProgrammingError, match="permission denied"):
            async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
                await uow.session.execute(text(statement), {"org": oid})
    # The purge's function erases nothing of a live org (nor of another org than the transaction's).
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=oid)) as uow:
        assert await uow.session.scalar(text("SELECT space_audit_purge(:org, 1000)"), {"org": oid}) == 0
        assert await uow.session.scalar(text("SELECT space_audit_purge(:org, 1000)"), {"org": uuid.uuid4()}) == 0
    assert (await _trail(api, org, org.owner, limit=200))["items"] == before


# --- where a request came from ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _served(settings: Settings) -> AsyncIterator[str]:
    """The real app behind uvicorn on a local port (so the peer is a real address); yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(settings, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: _started(server, task), "the API to listen")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 15)
        sock.close()


async def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # a start-up failure: raise it here
    return server.started


@pytest.mark.parametrize(
    ("trusted", "seen"),
    [
        ("", "127.0.0.1"),  # no proxy trusted: the header is the client's own claim, ignored
        ("127.0.0.1", "203.0.113.9"),  # the proxy vouches for the address it got the request from
        ("127.0.0.0/8, 203.0.113.0/24", "198.51.100.7"),  # two trusted hops
    ],
)
async def test_ip_is_the_peer_or_what_a_trusted_proxy_forwarded(
    api: Api, settings: Settings, trusted: str, seen: str
) -> None:
    org = await api.org()
    async with _served(tuned(settings, trusted_proxies=trusted)) as base, httpx.AsyncClient(base_url=base) as http:
        headers = {**org.owner.headers, "X-Forwarded-For": "198.51.100.7, 203.0.113.9"}
        r = await http.post(org.path("/suspend"), headers=headers)
        assert r.status_code == 200, r.text
    top = (await _trail(api, org, org.owner, limit=1))["items"][0]
    assert (top["action"], top["ip"]) == ("org.suspended", seen)


def test_client_ip_walks_back_through_trusted_proxies_only() -> None:
    nets = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128")]
    assert client_ip("10.1.2.3", ["192.0.2.1, 10.9.9.9"], nets) == "192.0.2.1"
    assert client_ip("192.0.2.50", ["192.0.2.1"], nets) == "192.0.2.50"
    assert client_ip("::1", ["2001:db8::7"], nets) == "2001:db8::7"
    assert client_ip("::ffff:10.0.0.1", ["192.0.2.9"], nets) == "192.0.2.9"
    # A garbled entry: believed no further than the last trusted hop.
    assert client_ip("10.1.2.3", ["192.0.2.1, garbage"], nets) == "10.1.2.3"
    # Every hop trusted: the leftmost; several headers read as one list.
    assert client_ip("10.1.2.3", ["10.0.0.9", "10.0.0.8"], nets) == "10.0.0.9"
    assert client_ip("testclient", ["192.0.2.1"], nets) is None
    assert client_ip(None, [], nets) is None


def test_trusted_proxies_setting_is_checked() -> None:
    from space.config import SettingsError, load_settings

    assert load_settings({"SPACE_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).trusted_proxies == "10.0.0.0/8, ::1"
    with pytest.raises(SettingsError, match="SPACE_TRUSTED_PROXIES"):
        load_settings({"SPACE_TRUSTED_PROXIES": "10.0.0.0/8, proxy.internal"})
    assert msgspec.json.encode(load_settings({}).trusted_proxies) == b'""'


async def test_targets_are_named_so_the_trail_reads_without_ids(api: Api, db: Database, settings: Settings) -> None:
    """SPEC §27: the trail reads as sentences with names; a member target carries the user's name, an export its
    kind, the org its name, and a target that is gone reads as null (never another org's)."""
    org = await api.org("Named Ltd")
    x = await api.users.make("Xavier")
    r = await api.call("POST", org.path("/members"), org.admin, json={"email": x.email, "role": "member"})
    assert r.status_code == 201, r.text
    e = (await create_export(api, org, org.member, {"kind": "tickets_csv"}))["id"]
    assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    other = await api.org("Elsewhere")
    foreign = (await create_export(api, other, other.member, {"kind": "snapshot"}))["id"]
    # A row naming another org's export (as no service writes it): its kind must not leak into this trail.
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id), user_id=org.owner.id)) as uow:
        await uow.session.execute(
            text(
                "INSERT INTO audit_events (id, org_id, actor_id, action, target_type, target_id, details)"
                " VALUES (:id, :org, :actor, 'export.cancelled', 'export', :target, '{}')"
            ),
            {"id": uuid.uuid4(), "org": uid(org.id), "actor": org.owner.id, "target": foreign},
        )

    items = (await _trail(api, org, org.admin))["items"]
    targets = [(i["action"], i["target"]) for i in items]
    assert targets[0] == ("export.cancelled", {"type": "export", "id": foreign, "name": None, "kind": None})
    assert targets[1] == ("org.suspended", {"type": "org", "id": org.id, "name": "Named Ltd", "kind": None})
    assert targets[2] == ("export.requested", {"type": "export", "id": e, "name": None, "kind": "tickets_csv"})
    assert targets[3] == ("member.added", {"type": "user", "id": str(x.id), "name": x.name, "kind": None})
