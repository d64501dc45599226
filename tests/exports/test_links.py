"""Download links (SPEC §10): minting, using, refusing, and the keys that sign them.

Tokens the product did not mint (tampered, expired, of another purpose) are made here with PyJWT and the key
read as the owner from `signing_keys`, independently of the product's signer; so is the decoding of a minted
one.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import os
import sys
import time
import uuid
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY
from urllib.parse import parse_qs, urlsplit

import jwt
import msgspec
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from space.app import create_app
from space.auth.service import issue_token
from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.lease import Lease
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    WAIT,
    add_tickets,
    completed_export,
    create_export,
    expire_lease,
    insert_export,
    job_row,
    runner,
    set_org_state,
    uid,
    wait_for,
)
from tests.exports.limits_fixtures import tuned_api
from tests.helpers import Api, Org, UserFactory, assert_problem

CSV = {"kind": "tickets_csv"}
SPACE = str(Path(sys.executable).with_name("space"))
NEW_KEY = "n" * 40
OLD_KEY = "o" * 40


def db_key(owner: psycopg.Connection[Any]) -> bytes:
    """The signing key `space migrate` kept in the database."""
    row = owner.execute("SELECT secret FROM signing_keys").fetchone()
    assert row is not None
    return bytes(row[0])


def live_token_id(owner: psycopg.Connection[Any], user: uuid.UUID) -> str:
    """The id of the user's (one) unrevoked bearer token, read as the owner."""
    row = owner.execute("SELECT id FROM api_tokens WHERE user_id = %s AND revoked_at IS NULL", (user,)).fetchone()
    assert row is not None
    return str(row[0])


def forge(key: bytes | str, org: str, export: str, user: uuid.UUID, execution: uuid.UUID, **changes: Any) -> str:
    """A token with the claims a link carries (valid for a minute), signed here with PyJWT. Its minting bearer
    token (`tok`) is made up unless given: such a token is refused whatever else it says."""
    claims: dict[str, Any] = {
        "pur": "export-download",
        "sub": str(user),
        "org": org,
        "export": export,
        "execution": str(execution),
        "exp": int(time.time()) + 60,
        "tok": str(uuid.uuid4()),
    }
    claims.update(changes)
    algorithm = claims.pop("alg", "HS256")
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, key, algorithm=algorithm)


def token_of(url: str) -> str:
    """The `token=` of a link's URL."""
    return parse_qs(urlsplit(url).query)["token"][0]


async def mint(api: Api, org: Org, export_id: str, user: Any = None) -> dict[str, Any]:
    """POST a link and check the 201."""
    r = await api.call("POST", org.path(f"/exports/{export_id}/links"), user or org.owner)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def fetch(api: Api, url: str, **headers: str) -> Any:
    """GET a link's URL without an Authorization header."""
    return await api.client.get(url, headers=headers)


@pytest.fixture(scope="module")
async def done(api: Api, db: Database, settings: Settings) -> tuple[Org, str, bytes]:
    """An org with tickets and the owner's completed CSV export: (org, export id, its bytes)."""
    org = await api.org("Links")
    await add_tickets(db, org.id, org.member, [f"link ticket {i}" for i in range(40)])
    export_id = await completed_export(api, db, settings, org, CSV)
    r = await api.call("GET", org.path(f"/exports/{export_id}/result"), org.owner)
    assert r.status_code == 200
    return org, export_id, r.content


async def test_a_link_downloads_like_the_bearer_route_with_no_referrer(
    api: Api, done: tuple[Org, str, bytes], owner: psycopg.Connection[Any], settings: Settings
) -> None:
    org, export_id, body = done
    before = int(time.time())
    link = await mint(api, org, export_id)
    assert set(link) == {"url", "expiresAt"}
    path, _, query = link["url"].partition("?")
    assert path == org.path(f"/exports/{export_id}/result") and query.startswith("token=")
    expires = dt.datetime.fromisoformat(link["expiresAt"])
    # Decoded independently: signed over purpose, user, org, export, execution and expiry, at most the TTL out,
    # and the bearer token it was minted with (its row id: the link lives while that token does).
    claims = jwt.decode(token_of(link["url"]), db_key(owner), algorithms=["HS256"])
    job = await job_row(api.users.db, org.id, export_id)
    assert claims == {
        "pur": "export-download",
        "sub": str(org.owner.id),
        "org": org.id,
        "export": export_id,
        "execution": str(job.execution_id),
        "exp": int(expires.timestamp()),
        "tok": live_token_id(owner, org.owner.id),
        "jti": ANY,
    }
    assert before < claims["exp"] <= int(time.time()) + settings.download_link_ttl_seconds

    r = await fetch(api, link["url"])
    assert r.status_code == 200, r.text
    assert r.content == body
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["etag"] == f'"{job.sha256}"'
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{export_id}.csv"'
    assert r.headers["cache-control"] == "private, no-store"
    assert r.headers["accept-ranges"] == "bytes"
    # The same link again (a resumed download repeats its URL), and the bearer route stays as it was.
    assert (await fetch(api, link["url"])).content == body
    bearer = await api.call("GET", org.path(f"/exports/{export_id}/result"), org.owner)
    assert bearer.content == body and "referrer-policy" not in bearer.headers
    # Refusals of link requests carry it too.
    refused = await fetch(api, f"{path}?token=nonsense")
    assert_problem(refused, 401, "link_invalid")
    assert refused.headers["referrer-policy"] == "no-referrer"


async def test_minting_is_authorized_like_a_download(
    api: Api, db: Database, settings: Settings, users: UserFactory
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["a", "b"])
    member_csv = await completed_export(api, db, settings, org, CSV)  # the owner's
    links = org.path(f"/exports/{member_csv}/links")
    assert_problem(await api.call("POST", links, None), 401, "unauthenticated")
    stranger = await users.make("stranger")
    for who, path in [
        (stranger, links),
        (org.admin, links),  # another user's export
        (org.owner, org.path(f"/exports/{uuid.uuid4()}/links")),
        (org.owner, org.path("/exports/not-a-uuid/links")),
        (org.owner, f"/orgs/{uuid.uuid4()}/exports/{member_csv}/links"),
    ]:
        assert_problem(await api.call("POST", path, who), 404, "not_found")

    queued = await create_export(api, org, org.member, CSV)
    r = await api.call("POST", org.path(f"/exports/{queued['id']}/links"), org.member)
    assert_problem(r, 409, "export_not_ready")
    assert r.headers["retry-after"]
    failed = await insert_export(db, org.id, org.member.id, kind="tickets_csv", state="failed")
    assert_problem(await api.call("POST", org.path(f"/exports/{failed}/links"), org.member), 409, "export_failed")
    old = await insert_export(db, org.id, org.member.id, kind="tickets_csv", completed_ago=dt.timedelta(hours=25))
    assert_problem(await api.call("POST", org.path(f"/exports/{old}/links"), org.member), 410, "export_expired")

    # The admin's team export: minted while staff; demoted, removed, then the org being deleted.
    e = await create_export(api, org, org.admin, CSV)
    assert await run_export(runner(settings, db), uid(e["id"]), uid(org.id)) == "completed"
    admin_links = org.path(f"/exports/{e['id']}/links")
    await mint(api, org, e["id"], org.admin)
    r = await api.call("PATCH", org.path(f"/members/{org.admin.id}"), org.owner, json={"role": "customer"})
    assert r.status_code == 200, r.text
    assert_problem(await api.call("POST", admin_links, org.admin), 403, "access_revoked")
    r = await api.call("DELETE", org.path(f"/members/{org.admin.id}"), org.owner)
    assert r.status_code == 204, r.text
    assert_problem(await api.call("POST", admin_links, org.admin), 403, "access_revoked")
    await set_org_state(db, org.id, "deleting")
    assert_problem(await api.call("POST", links, org.owner), 409, "org_deleting")


async def test_a_link_stops_at_once_when_its_member_is_demoted_or_removed(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(30)])
    exports = []
    for _ in range(2):
        e = await create_export(api, org, org.member, CSV)
        assert await run_export(runner(settings, db), uid(e["id"]), uid(org.id)) == "completed"
        exports.append(e["id"])
    first, second = [(await mint(api, org, e, org.member))["url"] for e in exports]
    # A resumed download: the same URL, one range after another, until it is stopped.
    whole = (await fetch(api, first)).content
    r = await fetch(api, first, range="bytes=0-99")
    assert r.status_code == 206 and r.content == whole[:100]
    r = await fetch(api, first, range="bytes=100-")
    assert r.status_code == 206 and whole[:100] + r.content == whole

    # Demoted to customer: the team-scope export's link stops, even for a conditional or a range request.
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "customer"})
    assert r.status_code == 200, r.text
    etag = (await api.call("GET", org.path(f"/exports/{exports[0]}"), org.member)).json()["sha256"]
    for headers in ({}, {"range": "bytes=100-"}, {"if-none-match": f'"{etag}"'}):
        assert_problem(await fetch(api, first, **headers), 403, "access_revoked")
    # Restored, then removed: stopped again.
    r = await api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "member"})
    assert r.status_code == 200, r.text
    assert (await fetch(api, second)).status_code == 200
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204, r.text
    assert_problem(await fetch(api, second, range="bytes=0-9"), 403, "access_revoked")


async def test_a_member_removed_between_two_ranges_of_one_link_is_refused_on_the_second(
    api: Api, db: Database, settings: Settings
) -> None:
    # Issue 35: each range is authorized again from the database, so nothing of the first answer carries over.
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"r{i}" for i in range(30)])
    e = await create_export(api, org, org.member, CSV)
    assert await run_export(runner(settings, db), uid(e["id"]), uid(org.id)) == "completed"
    url = (await mint(api, org, e["id"], org.member))["url"]
    r = await fetch(api, url, range="bytes=0-9")
    assert r.status_code == 206 and len(r.content) == 10
    r = await api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)
    assert r.status_code == 204, r.text
    assert_problem(await fetch(api, url, range="bytes=10-19"), 403, "access_revoked")
    # Nor does the status route answer them: they are no member.
    assert_problem(await api.call("GET", org.path(f"/exports/{e['id']}"), org.member), 404, "not_found")


async def test_bad_tokens_are_refused(
    api: Api, db: Database, settings: Settings, done: tuple[Org, str, bytes], owner: psycopg.Connection[Any]
) -> None:
    org, export_id, _ = done
    other = await completed_export(api, db, settings, org, CSV)
    url = (await mint(api, org, export_id))["url"]
    token = token_of(url)
    result = org.path(f"/exports/{export_id}/result")
    key = db_key(owner)
    job = await job_row(db, org.id, export_id)
    assert job.execution_id is not None
    user, execution = org.owner.id, job.execution_id
    tok = live_token_id(owner, user)

    def live(*args: Any, **changes: Any) -> str:
        # Minted, as far as `tok` goes, with the owner's live bearer token: each case is refused for its own reason.
        return forge(*args, **{"tok": tok, **changes})

    head, payload, signature = token.split(".")
    claims = msgspec.json.decode(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = str(org.admin.id)
    other_payload = base64.urlsafe_b64encode(msgspec.json.encode(claims)).rstrip(b"=").decode()
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    invalid = {
        "a changed signature": f"{head}.{payload}.{flipped}",
        "a changed payload": f"{head}.{other_payload}.{signature}",
        "no signature": f"{head}.{payload}.",
        "alg none": jwt.encode({**claims, "sub": str(user)}, None, algorithm="none"),
        "HS512": live(key, org.id, export_id, user, execution, alg="HS512"),
        "another key": live("x" * 40, org.id, export_id, user, execution),
        "another purpose": live(key, org.id, export_id, user, execution, pur="password-reset"),
        "no purpose": live(key, org.id, export_id, user, execution, pur=None),
        "no expiry": live(key, org.id, export_id, user, execution, exp=None),
        "another export": live(key, org.id, other, user, execution),
        "another org": live(key, str(uuid.uuid4()), export_id, user, execution),
        "another execution": live(key, org.id, export_id, user, uuid.uuid4()),
        "a user id that is none": live(key, org.id, export_id, user, execution, sub="nobody"),
        "an unknown user": live(key, org.id, export_id, uuid.uuid4(), execution),
        "no minting token": live(key, org.id, export_id, user, execution, tok=None),
        "a made-up minting token": live(key, org.id, export_id, user, execution, tok=str(uuid.uuid4())),
        "another user's token": live(key, org.id, export_id, user, execution, tok=live_token_id(owner, org.admin.id)),
        "a minting token that is none": live(key, org.id, export_id, user, execution, tok="nobody"),
        "garbage": "not-a-token",
        "empty": "",
        "a bearer token": org.owner.token,
        "huge": "a" * 3000,
    }
    for what, bad in invalid.items():
        r = await api.client.get(result, params={"token": bad})
        assert (r.status_code, r.json()["code"]) == (401, "link_invalid"), (what, r.text)
        assert_problem(r, 401, "link_invalid")
    # The token of one export on another export's path.
    assert_problem(
        await api.client.get(org.path(f"/exports/{other}/result"), params={"token": token}), 401, "link_invalid"
    )
    # Signed right, but past its expiry (and only then "expired": the signature is checked first).
    expired = live(key, org.id, export_id, user, execution, exp=int(time.time()) - 5)
    assert_problem(await api.client.get(result, params={"token": expired}), 401, "link_expired")
    expired_forged = live("x" * 40, org.id, export_id, user, execution, exp=int(time.time()) - 5)
    assert_problem(await api.client.get(result, params={"token": expired_forged}), 401, "link_invalid")
    # A token with an Authorization header too: 400, whichever of the two is good.
    body = assert_problem(await api.call("GET", url, org.owner), 400, "invalid_request")
    assert "token" in body["detail"]
    # (A bearer token that is no good is answered as on every route: 401.)
    bogus = {"Authorization": "Bearer spc_not-a-token"}
    assert_problem(await api.client.get(url, headers=bogus), 401, "unauthenticated")
    # A link token is no bearer token: not on the result route, and not anywhere else.
    as_bearer = {"Authorization": f"Bearer {token}"}
    for path in (result, org.path(f"/exports/{export_id}"), org.path(f"/exports/{export_id}/links"), "/me"):
        method = "POST" if path.endswith("/links") else "GET"
        assert_problem(await api.client.request(method, path, headers=as_bearer), 401, "unauthenticated")
    # And `token=` opens no other route.
    for path in (org.path(f"/exports/{export_id}"), org.path("/exports"), org.path("")):
        assert_problem(await api.client.get(path, params={"token": token}), 401, "unauthenticated")
    # The genuine one still works.
    assert (await fetch(api, url)).status_code == 200


async def test_an_earlier_executions_token_fails_after_a_retry(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["retried"])
    export = await create_export(api, org, org.owner, CSV)
    # A first worker claims the export and is lost; a second claims it after the lease ran out and completes it.
    first = await Lease.claim(db, settings, uid(export["id"]), uid(org.id))
    assert first is not None
    await expire_lease(db, org.id, export["id"])
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    job = await job_row(db, org.id, export["id"])
    assert job.attempt == 2 and job.execution_id != first.execution_id
    result = org.path(f"/exports/{export['id']}/result")
    tok = live_token_id(owner, org.owner.id)
    stale = forge(db_key(owner), org.id, export["id"], org.owner.id, first.execution_id, tok=tok)
    assert_problem(await api.client.get(result, params={"token": stale}), 401, "link_invalid")
    current = forge(db_key(owner), org.id, export["id"], org.owner.id, job.execution_id, tok=tok)  # type: ignore[arg-type]
    assert (await api.client.get(result, params={"token": current})).status_code == 200
    assert (await fetch(api, (await mint(api, org, export["id"]))["url"])).status_code == 200


@pytest.fixture
async def keyed(settings: Settings, users: UserFactory) -> AsyncIterator[Any]:
    """Builds apps whose SPACE_SECRET_KEY is given; each is closed at the end."""
    clients: list[AsyncTestClient] = []  # type: ignore[type-arg]

    async def make(secret_key: str, **changes: Any) -> Api:
        client = AsyncTestClient(app=create_app(msgspec.structs.replace(settings, secret_key=secret_key, **changes)))
        await client.__aenter__()
        clients.append(client)
        return Api(client, users)

    try:
        yield make
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)


async def test_secret_keys_rotate_and_a_retired_key_fails(
    keyed: Any, api: Api, done: tuple[Org, str, bytes], owner: psycopg.Connection[Any]
) -> None:
    org, export_id, body = done
    old = await keyed(OLD_KEY)
    rotating = await keyed(f"{NEW_KEY},{OLD_KEY}")
    retired = await keyed(NEW_KEY)
    old_link = (await mint(old, org, export_id))["url"]
    new_link = (await mint(rotating, org, export_id))["url"]
    # The first key signs.
    assert jwt.decode(token_of(new_link), NEW_KEY, algorithms=["HS256"])["export"] == export_id
    # During the rotation both verify; afterwards the old key's links fail.
    assert (await fetch(rotating, old_link)).content == body
    assert (await fetch(rotating, new_link)).content == body
    assert (await fetch(retired, new_link)).content == body
    assert_problem(await fetch(retired, old_link), 401, "link_invalid")
    # With SPACE_SECRET_KEY set, the database's key signs nothing that is accepted, and the reverse.
    db_link = (await mint(api, org, export_id))["url"]
    assert_problem(await fetch(retired, db_link), 401, "link_invalid")
    assert_problem(await fetch(api, new_link), 401, "link_invalid")
    assert db_key(owner) not in (NEW_KEY.encode(), OLD_KEY.encode())


async def test_a_link_works_until_it_expires(keyed: Any, done: tuple[Org, str, bytes]) -> None:
    org, export_id, body = done
    short = await keyed(NEW_KEY, download_link_ttl_seconds=2)
    link = await mint(short, org, export_id)
    assert dt.datetime.fromisoformat(link["expiresAt"]) <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    r = await fetch(short, link["url"], range="bytes=0-9")
    assert r.status_code == 206 and r.content == body[:10]

    async def expired() -> bool:
        r = await fetch(short, link["url"], range="bytes=10-")
        if r.status_code == 206:
            assert r.content == body[10:]
            return False
        assert_problem(r, 401, "link_expired")
        return True

    # Waits on the answer itself (at most the poll's timeout), never on a fixed time.
    await wait_for(expired, "the link to expire")
    assert (await fetch(short, (await mint(short, org, export_id))["url"])).content == body


async def test_a_links_user_is_authorized_again_at_every_use(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ["again"])
    export_id = await completed_export(api, db, settings, org, CSV)
    url = (await mint(api, org, export_id))["url"]
    assert (await fetch(api, url)).status_code == 200
    # The org being deleted: 409, and back.
    await set_org_state(db, org.id, "deleting")
    assert_problem(await fetch(api, url), 409, "org_deleting")
    await set_org_state(db, org.id, "active")
    assert (await fetch(api, url)).status_code == 200
    # The result past its expiry (before any cleanup): 410, though the link itself is still valid.
    owner.execute("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (export_id,))
    assert_problem(await fetch(api, url), 410, "export_expired")
    owner.execute("UPDATE export_jobs SET expires_at = now() + interval '1 hour' WHERE id = %s", (export_id,))
    assert (await fetch(api, url)).status_code == 200
    # Deleted by its owner: gone for the link as for the bearer route.
    assert (await api.call("DELETE", org.path(f"/exports/{export_id}"), org.owner)).status_code == 204
    assert_problem(await fetch(api, url), 404, "not_found")
    assert_problem(await fetch(api, url, range="bytes=0-0"), 404, "not_found")


async def test_links_and_their_downloads_are_in_the_audit_trail(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org("Links audited")
    await add_tickets(db, org.id, org.member, [f"audited ticket {i}" for i in range(20)])
    export_id = await completed_export(api, db, settings, org, CSV)
    link = await mint(api, org, export_id)
    whole = await fetch(api, link["url"])
    part = await fetch(api, link["url"], Range="bytes=10-19")
    assert (whole.status_code, part.status_code) == (200, 206)
    # A 304 and a HEAD send no file: nothing is recorded for them.
    assert (await fetch(api, link["url"], **{"If-None-Match": whole.headers["etag"]})).status_code == 304
    assert (await api.client.head(link["url"])).status_code == 200

    r = await api.call("GET", org.path("/audit"), org.owner)
    assert r.status_code == 200, r.text
    rows = [i for i in r.json()["items"] if (i["target"]["type"], i["target"]["id"]) == ("export", export_id)]
    by_action = [(i["action"], i["details"]) for i in rows if i["action"] != "export.completed"][::-1]
    assert by_action[1:] == [
        ("export.link_created", {"expiresAt": link["expiresAt"]}),
        ("export.downloaded", {"via": "link", "range": None, "bytes": len(whole.content)}),
        ("export.downloaded", {"via": "link", "range": "bytes=10-19", "bytes": 10, "link": ANY, "coalesced": True}),
    ]
    assert all(i["actor"] == {"userId": str(org.owner.id), "name": org.owner.name} for i in rows[:3])
    # The trail never holds the token.
    assert token_of(link["url"]) not in r.text


def _downloads(items: list[dict[str, Any]], export_id: str) -> list[dict[str, Any]]:
    """The export's `export.downloaded` details, oldest first."""
    return [i["details"] for i in items[::-1] if i["action"] == "export.downloaded" and i["target"]["id"] == export_id]


async def test_a_links_ranges_are_audited_once_a_minute_and_whole_downloads_every_time(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org("Ranges coalesced")
    await add_tickets(db, org.id, org.member, [f"ranged ticket {i}" for i in range(30)])
    export_id = await completed_export(api, db, settings, org, CSV)
    first, second = (await mint(api, org, export_id))["url"], (await mint(api, org, export_id))["url"]
    # A resumable client's many ranges, a few at once: one row for the link's minute, with the first range.
    assert (await fetch(api, first, Range="bytes=0-9")).status_code == 206
    many = [fetch(api, first, Range=f"bytes={n}-{n + 9}") for n in range(10, 200, 10)]
    assert {r.status_code for r in await asyncio.gather(*many)} == {206}
    # Another link has its own minute; whole downloads are each recorded, as before.
    assert (await fetch(api, second, Range="bytes=5-6")).status_code == 206
    for _ in range(2):
        assert (await fetch(api, first)).status_code == 200
    bearer = await api.call("GET", org.path(f"/exports/{export_id}/result"), org.owner, headers={"Range": "bytes=1-2"})
    assert bearer.status_code == 206
    items = (await api.call("GET", org.path("/audit"), org.owner, params={"limit": 200})).json()["items"]
    rows = _downloads(items, export_id)
    first_link, second_link = rows[0]["link"], rows[1]["link"]
    size = int(bearer.headers["content-range"].rpartition("/")[2])
    assert rows == [
        {"via": "link", "range": "bytes=0-9", "bytes": 10, "link": first_link, "coalesced": True},
        {"via": "link", "range": "bytes=5-6", "bytes": 2, "link": second_link, "coalesced": True},
        {"via": "link", "range": None, "bytes": size},
        {"via": "link", "range": None, "bytes": size},
        {"via": "bearer", "range": "bytes=1-2", "bytes": 2},
    ]
    assert first_link != second_link and token_of(first) not in str(items) and token_of(second) not in str(items)
    # A minute later (the row moved back by the owner: the app role can't change the trail), the link's next
    # range is recorded again.
    with pytest.raises(ProgrammingError, match="permission denied"):
        async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
            await uow.session.execute(text("UPDATE audit_events SET at = at - interval '61 seconds'"))
    owner.execute(
        "UPDATE audit_events SET at = at - interval '61 seconds' WHERE org_id = %s AND details->>'link' = %s",
        (org.id, first_link),
    )
    assert (await fetch(api, first, Range="bytes=20-29")).status_code == 206
    assert (await fetch(api, first, Range="bytes=30-39")).status_code == 206
    items = (await api.call("GET", org.path("/audit"), org.owner, params={"limit": 200})).json()["items"]
    assert _downloads(items, export_id)[5:] == [
        {"via": "link", "range": "bytes=20-29", "bytes": 10, "link": first_link, "coalesced": True}
    ]


async def test_minting_is_rate_limited_per_user_over_all_orgs(
    settings: Settings, users: UserFactory, db: Database, owner: psycopg.Connection[Any]
) -> None:
    async with tuned_api(settings, users, link_rate_limit=3) as three:
        org, other = await three.org("Mints"), await three.org("More mints")
        # The same person in both orgs: the limit is theirs, not the org's.
        add = {"email": org.owner.email, "role": "owner"}
        assert (await three.call("POST", other.path("/members"), other.owner, json=add)).status_code == 201
        export_id = await completed_export(three, db, settings, org, CSV)
        other_export = await completed_export(three, db, settings, other, CSV)
        mine, theirs = org.path(f"/exports/{export_id}/links"), other.path(f"/exports/{other_export}/links")
        # Made by other.owner: the org.owner (an owner there too) can't mint for it, so theirs is their own.
        made = await create_export(three, other, org.owner, CSV)
        assert await run_export(runner(settings, db), uid(made["id"]), uid(other.id)) == "completed"
        own_there = made["id"]
        there = other.path(f"/exports/{own_there}/links")
        for path in (mine, there, mine):
            assert (await three.call("POST", path, org.owner)).status_code == 201
        # n-1 = 3 minted in the minute; the nth is refused, in either org, and records nothing.
        for path in (mine, there):
            r = await three.call("POST", path, org.owner)
            assert_problem(r, 429, "rate_limited")
            assert 55 <= int(r.headers["retry-after"]) <= 60
        trail = (await three.call("GET", org.path("/audit"), org.owner, params={"limit": 200})).json()["items"]
        assert sum(i["action"] == "export.link_created" for i in trail) == 2
        # Another user has their own minute.
        assert (await three.call("POST", theirs, other.owner)).status_code == 201
        # Retry-After says when the oldest mint leaves the window: moved back 30 s, about 30.
        owner.execute("UPDATE link_mints SET at = at - interval '30 seconds' WHERE user_id = %s", (org.owner.id,))
        r = await three.call("POST", org.path(f"/exports/{export_id}/links"), org.owner)
        assert_problem(r, 429, "rate_limited")
        assert 25 <= int(r.headers["retry-after"]) <= 30
        # Past the minute, places are free again.
        owner.execute("UPDATE link_mints SET at = at - interval '31 seconds' WHERE user_id = %s", (org.owner.id,))
        assert (await three.call("POST", org.path(f"/exports/{export_id}/links"), org.owner)).status_code == 201
        left = owner.execute("SELECT count(*) FROM link_mints WHERE user_id = %s", (org.owner.id,)).fetchone()
        assert left == (1,)  # the expired ones were pruned by that mint


async def test_the_default_link_rate_limit_is_sixty_a_minute(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org("Sixty")
    export_id = await completed_export(api, db, settings, org, CSV)
    for _ in range(60):
        assert (await api.call("POST", org.path(f"/exports/{export_id}/links"), org.owner)).status_code == 201
    r = await api.call("POST", org.path(f"/exports/{export_id}/links"), org.owner)
    assert_problem(r, 429, "rate_limited")
    assert "retry-after" in r.headers


async def test_tokens_revoke_ends_the_links_minted_before_it(
    api: Api, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await api.org("Revoked links")
    export_id = await completed_export(api, db, settings, org, CSV)
    link = (await mint(api, org, export_id))["url"]
    assert (await fetch(api, link)).status_code == 200
    # The real command, as an operator runs it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPACE_")} | {"DATABASE_URL": owner_url}
    proc = await asyncio.create_subprocess_exec(SPACE, "tokens", "revoke", org.owner.email, env=env, stderr=PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err
    # At once, for a whole download and for a range.
    assert_problem(await fetch(api, link), 401, "link_invalid")
    assert_problem(await fetch(api, link, Range="bytes=0-0"), 401, "link_invalid")
    # A new token mints links that work; the old link stays dead.
    async with UnitOfWork(db.sessionmaker) as uow:
        renewed = dataclasses.replace(org.owner, token=await issue_token(uow.session, org.owner.id))
    fresh = (await mint(api, org, export_id, renewed))["url"]
    assert (await fetch(api, fresh)).status_code == 200
    assert_problem(await fetch(api, link), 401, "link_invalid")
