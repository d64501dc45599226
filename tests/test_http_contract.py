"""HTTP contract of the foundation: auth, problem+json errors, bad input never a 5xx, health and OpenAPI."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from httpx import Response

from space.auth.service import revoke_tokens
from space.db import Database, UnitOfWork
from tests.helpers import Api, assert_problem


def _problem(r: Response) -> dict[str, Any]:
    """Any error: problem+json with status, title, detail and code, and never a 5xx."""
    assert r.status_code < 500, (r.status_code, r.text)
    assert r.status_code >= 400, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/problem+json"), (r.headers, r.text)
    body: dict[str, Any] = r.json()
    assert body["status"] == r.status_code, body
    for key in ("title", "detail", "code"):
        assert isinstance(body[key], str) and body[key], body
    return body


# --- auth ---------------------------------------------------------------------------------------------------


async def test_me(api: Api) -> None:
    user = await api.users.make("me")
    r = await api.call("GET", "/me", user)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": str(user.id), "email": user.email, "name": user.name}


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Basic dXNlcjpwYXNz",
        "Token spc_abc",
        "Bearer spc_not-a-real-token",
        "Bearer " + "x" * 5000,
        "Bearer \t",
    ],
)
async def test_unauthenticated(api: Api, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in [("GET", "/me"), ("GET", "/orgs"), ("POST", "/orgs"), ("GET", f"/orgs/{uuid.uuid4()}")]:
        r = await api.call(method, path, headers=headers, json={"name": "x"} if method == "POST" else None)
        assert_problem(r, 401, "unauthenticated")
        assert r.headers["www-authenticate"].startswith("Bearer")


async def test_wrong_scheme_with_a_valid_token_is_refused(api: Api) -> None:
    user = await api.users.make()
    for auth in (f"Token {user.token}", f"Basic {user.token}", user.token, f"Bearer{user.token}"):
        r = await api.call("GET", "/me", headers={"Authorization": auth})
        assert_problem(r, 401, "unauthenticated")
    # The scheme is case-insensitive (RFC 9110); the token itself is not.
    r = await api.call("GET", "/me", headers={"Authorization": f"bearer {user.token}"})
    assert r.status_code == 200
    r = await api.call("GET", "/me", headers={"Authorization": f"Bearer {user.token.upper()}"})
    assert_problem(r, 401, "unauthenticated")


async def test_non_ascii_authorization_header(api: Api) -> None:
    r = await api.client.get("/me", headers=[(b"authorization", b"Bearer \xff\xfe\x80")])
    assert_problem(r, 401, "unauthenticated")


async def test_revoked_token_is_refused(api: Api, db: Database) -> None:
    org = await api.org()
    r = await api.call("GET", org.path(), org.member)
    assert r.status_code == 200
    async with UnitOfWork(db.sessionmaker) as uow:
        assert await revoke_tokens(uow.session, org.member.id) == 1
    for method, path in [("GET", "/me"), ("GET", org.path()), ("GET", "/orgs")]:
        r = await api.call(method, path, org.member)
        assert_problem(r, 401, "unauthenticated")
    # Someone else's token still works.
    r = await api.call("GET", org.path(), org.owner)
    assert r.status_code == 200


async def test_tokens_are_stored_only_as_hashes(api: Api, owner_url: str) -> None:
    user = await api.users.make()
    assert user.token.startswith("spc_") and len(user.token) >= 4 + 43  # 32 random bytes, base64url
    with psycopg.connect(owner_url) as conn:
        columns = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = 'api_tokens'"
        ).fetchall()
        assert "token" not in {c for c, _ in columns}
        # No column of any row of the user's tokens, as text or as bytes, holds the plaintext.
        rows = conn.execute("SELECT * FROM api_tokens WHERE user_id = %s", (user.id,)).fetchall()
        assert len(rows) == 1
        for value in rows[0]:
            raw = value if isinstance(value, bytes) else str(value).encode()
            assert user.token.encode() not in raw and user.token[4:].encode() not in raw
        hits = conn.execute(
            "SELECT count(*) FROM api_tokens t WHERE position(%s in t::text) > 0 OR position(%s in encode(t.token_hash, 'escape')) > 0",
            (user.token[4:], user.token[4:]),
        ).fetchone()
        assert hits == (0,)
    r = await api.call("GET", "/me", user)
    assert r.status_code == 200


# --- problem+json and validation ----------------------------------------------------------------------------


async def test_validation_errors_name_the_field(api: Api) -> None:
    user = await api.users.make()
    cases: list[tuple[Any, str]] = [
        ({"name": "x" * 201}, "name"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"name": 12}, "name"),
        ({"name": None}, "name"),
        ({"name": ["a"]}, "name"),
        ({}, "name"),
        ({"name": "ok", "unexpected": 1}, "unexpected"),
        ({"Name": "ok"}, "Name"),
    ]
    for body, field in cases:
        r = await api.call("POST", "/orgs", user, json=body)
        problem = assert_problem(r, 400, "invalid_request")
        assert field in problem["detail"], (body, problem)
    r = await api.call("GET", "/orgs", user)
    assert r.json() == {"items": []}, "no org may have been created by a refused request"


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"{bad", "application/json"),
        (b"", "application/json"),
        (b"null", "application/json"),
        (b"[]", "application/json"),
        (b"[1, 2]", "application/json"),
        (b'"name"', "application/json"),
        (b"42", "application/json"),
        (b"true", "application/json"),
        (b'{"name": "a"} trailing', "application/json"),
        (b'{"name": "\xff\xfe"}', "application/json"),
        (b'{"name": "\xc3"}', "application/json"),
        (b'{"name": "\\ud800"}', "application/json"),
        (b'{"name": "\\u0000"}', "application/json"),
        (b'{"name": 1e999}', "application/json"),
        (b'{"name": 123456789012345678901234567890}', "application/json"),
        (b"\xef\xbb\xbf{}", "application/json"),
        ('{"name": "a"}'.encode("utf-16"), "application/json"),
        (b"[" * 100_000, "application/json"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "application/json"),
        (b"name=acme", "application/x-www-form-urlencoded"),
        (b"--b\r\nContent-Disposition: form-data; name=name\r\n\r\nx\r\n--b--\r\n", "multipart/form-data; boundary=b"),
        (b"<org><name>x</name></org>", "application/xml"),
        (b"\x00\x01\x02", "application/octet-stream"),
    ],
)
async def test_malformed_bodies_are_400(api: Api, content: bytes, content_type: str) -> None:
    user = await api.users.make()
    r = await api.call("POST", "/orgs", user, content=content, headers={"Content-Type": content_type})
    body = _problem(r)
    assert r.status_code in (400, 415), body
    if r.status_code == 400:
        assert body["code"] == "invalid_request"
    r = await api.call("GET", "/orgs", user)
    assert r.json() == {"items": []}


async def test_malformed_member_bodies(api: Api) -> None:
    org = await api.org()
    for path, method in [(org.path("/members"), "POST"), (org.path(f"/members/{org.member.id}"), "PATCH")]:
        for content in (b"{bad", b"[]", b'{"role": "\\ud800"}', b'{"role": "\xff"}', b"[" * 100_000):
            r = await api.call(method, path, org.owner, content=content, headers={"Content-Type": "application/json"})
            assert_problem(r, 400, "invalid_request")


async def test_body_over_one_mebibyte_is_413(api: Api) -> None:
    org = await api.org()
    big = b'{"name": "' + b"x" * (1024 * 1024) + b'"}'
    for method, path in [
        ("POST", "/orgs"),
        ("POST", org.path("/members")),
        ("PATCH", org.path(f"/members/{org.member.id}")),
    ]:
        r = await api.call(method, path, org.owner, content=big, headers={"Content-Type": "application/json"})
        body = _problem(r)
        assert r.status_code == 413, body
    # Without a Content-Length (a chunked upload), the limit still holds while the body streams in.
    status, headers, payload = _raw_asgi_post(api, "/orgs", org.owner.headers, [b"x" * 65536] * 20)
    assert status == 413, payload
    assert headers[b"content-type"].startswith(b"application/problem+json")
    assert b'"code":"payload_too_large"' in payload


def _raw_asgi_post(
    api: Api, path: str, headers: dict[str, str], chunks: list[bytes]
) -> tuple[int, dict[bytes, bytes], bytes]:
    """POST a body in chunks with no Content-Length, straight into the app on the test client's loop."""
    pending = list(chunks)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
        "state": {},
    }
    api.client.blocking_portal.call(api.client.app, scope, receive, send)  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


async def test_nul_and_odd_characters_in_paths_and_queries(api: Api) -> None:
    org = await api.org()
    for path in [
        "/orgs/%00",
        f"/orgs/{org.id}%00",
        f"/orgs/{org.id}%00/members",
        "/orgs/%ff%fe",
        "/orgs/%ED%A0%80",
        "/orgs/" + "f" * 5000,
        "/orgs/" + "%2e%2e%2f" * 10,
        "/orgs/'; DROP TABLE organizations; --",
        f"/orgs/{org.id}/members/%00",
        f"/orgs/{org.id}/members/not-a-uuid",
    ]:
        for method in ("GET", "PATCH", "DELETE"):
            r = await api.call(method, path, org.owner, json={"role": "member"} if method == "PATCH" else None)
            body = _problem(r)
            assert r.status_code in (404, 405), (path, method, body)
    for query in ("?x=%00", "?name=%00%ff", "?%00=%00", "?page=-1&pageSize=%00", "?q=" + "%ED%A0%80" * 100):
        r = await api.call("GET", "/orgs" + query, org.owner)
        assert r.status_code == 200, (query, r.text)
        r = await api.call("GET", org.path("/members") + query, org.owner)
        assert r.status_code == 200, (query, r.text)
    # Still there.
    r = await api.call("GET", org.path(), org.owner)
    assert r.status_code == 200


async def test_malformed_ids_are_the_same_404_as_unknown_ones(api: Api) -> None:
    org = await api.org()
    bodies = set()
    for target in ("not-a-uuid", str(uuid.uuid4()), "0", "%00", "{" + str(uuid.uuid4()) + "}x"):
        r = await api.call("GET", f"/orgs/{target}", org.owner)
        assert_problem(r, 404, "not_found")
        bodies.add(r.content)
        r = await api.call("DELETE", org.path(f"/members/{target}"), org.owner)
        assert_problem(r, 404, "not_found")
        bodies.add(r.content)
    # An unknown route says the same: nothing tells a route from a resource.
    r = await api.call("GET", "/no-such-route", org.owner)
    assert_problem(r, 404, "not_found")
    bodies.add(r.content)
    assert len(bodies) == 1, bodies


async def test_method_not_allowed_is_a_problem(api: Api) -> None:
    org = await api.org()
    r = await api.call("PUT", org.path(), org.owner, json={})
    assert _problem(r)["code"] == "method_not_allowed"
    assert r.status_code == 405


async def test_huge_and_unicode_names(api: Api) -> None:
    user = await api.users.make()
    ok = "\U0001f600" * 200  # 200 characters, 800 bytes: the limit is characters
    r = await api.call("POST", "/orgs", user, json={"name": ok})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == ok
    r = await api.call("POST", "/orgs", user, json={"name": ok + "x"})
    assert_problem(r, 400, "invalid_request")
    r = await api.call("POST", "/orgs", user, json={"name": "x" * 900_000})
    assert_problem(r, 400, "invalid_request")
    for name in ("\u202etxt.exe", "=cmd|' /C calc'!A0", "<script>alert(1)</script>", "a\r\nb", "\ufeffbom"):
        r = await api.call("POST", "/orgs", user, json={"name": name})
        assert r.status_code == 201, (name, r.text)
        assert r.json()["name"] == name


# --- health and schema --------------------------------------------------------------------------------------


async def test_authentication_comes_before_reading_the_body(api: Api) -> None:
    # A client without a valid token learns only that: not whether its body or the org would have worked.
    for headers in ({}, {"Authorization": "Bearer spc_unknown"}):
        for body in (b"{not json", b"[" * 10_000, b'{"name": 1, "extra": true}'):
            r = await api.call("POST", "/orgs", headers={**headers, "content-type": "application/json"}, content=body)
            assert_problem(r, 401, "unauthenticated")
        r = await api.call("POST", f"/orgs/{uuid.uuid4()}/exports", headers=headers, content=b"{bad")
        assert_problem(r, 401, "unauthenticated")


async def test_health(api: Api) -> None:
    r = await api.call("GET", "/health")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ok", "database": "ok"}


async def test_openapi_is_served(api: Api) -> None:
    r = await api.call("GET", "/schema/openapi.json")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["openapi"].startswith("3.")
    paths = doc["paths"]
    for path in (
        "/health",
        "/me",
        "/orgs",
        "/orgs/{org_id}",
        "/orgs/{org_id}/members",
        "/orgs/{org_id}/members/{user_id}",
    ):
        assert path in paths, sorted(paths)
    assert {"get", "post"} <= set(paths["/orgs"])
    # Clients and fuzzers learn from the document that a bearer token is expected.
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "API token",
    }
    assert doc["security"] == [{"bearer": []}]
