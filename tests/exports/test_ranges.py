"""Ranges and conditional requests on the result route (SPEC §11), by bearer token and by link.

The result here is stored in chunks of 1000 bytes, so ranges start, end and cross chunk boundaries.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from typing import Any

import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import add_tickets, create_export, runner, tuned, uid
from tests.helpers import Api, Org, UserFactory, assert_problem

CHUNK = 1000


class Target:
    """One result, fetched either with the owner's bearer token or through a fresh link."""

    def __init__(self, api: Api, org: Org, export_id: str, body: bytes, via: str) -> None:
        self.api, self.org, self.export_id, self.body, self.via = api, org, export_id, body, via
        self.path = org.path(f"/exports/{export_id}/result")
        self.url = ""

    @property
    def etag(self) -> str:
        """The quoted sha256 of the whole body."""
        return f'"{hashlib.sha256(self.body).hexdigest()}"'

    async def request(self, method: str = "GET", **headers: str) -> Any:
        """The route, as the owner (bearer) or through the link."""
        if self.via == "bearer":
            return await self.api.call(method, self.path, self.org.owner, headers=headers)
        if not self.url:
            r = await self.api.call("POST", self.org.path(f"/exports/{self.export_id}/links"), self.org.owner)
            assert r.status_code == 201, r.text
            self.url = r.json()["url"]
        return await self.api.client.request(method, self.url, headers=headers)


@pytest.fixture(scope="module")
async def stored(api: Api, db: Database, settings: Settings) -> tuple[Org, str, bytes]:
    """The owner's CSV of about 12 KB in 1000-byte chunks."""
    org = await api.org("Ranges")
    await add_tickets(db, org.id, org.member, [f"range ticket {i} " + "x" * (i % 50) for i in range(160)])
    export = await create_export(api, org, org.owner, {"kind": "tickets_csv"})
    assert await run_export(runner(tuned(settings, export_chunk_bytes=CHUNK), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    r = await api.call("GET", org.path(f"/exports/{export['id']}/result"), org.owner)
    assert r.status_code == 200 and len(r.content) > 10 * CHUNK
    return org, export["id"], r.content


@pytest.fixture(params=["bearer", "link"])
def target(request: pytest.FixtureRequest, api: Api, stored: tuple[Org, str, bytes]) -> Target:
    """The stored result, by each way in."""
    return Target(api, *stored, via=request.param)


def _same_headers(r: Any, target: Target) -> None:
    assert r.headers["etag"] == target.etag
    assert r.headers["accept-ranges"] == "bytes"
    assert r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.headers["cache-control"] == "private, no-store"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{target.export_id}.csv"'
    assert ("referrer-policy" in r.headers) is (target.via == "link")


async def test_one_range_is_206_with_its_content_range(target: Target) -> None:
    body, size = target.body, len(target.body)
    cases = {
        "bytes=0-0": (0, 1),
        "bytes=0-999": (0, 1000),
        "bytes=999-1000": (999, 1001),
        "bytes=1500-4321": (1500, 4322),
        f"bytes={size - 1}-": (size - 1, size),
        "bytes=2000-": (2000, size),
        "bytes=-1": (size - 1, size),
        "bytes=-2500": (size - 2500, size),
        f"bytes=-{size + 100}": (0, size),
        f"bytes=10-{size + 100}": (10, size),
        "BYTES=5-9": (5, 10),
    }
    for header, (start, end) in cases.items():
        r = await target.request(range=header)
        assert r.status_code == 206, (header, r.status_code, r.text[:200])
        assert r.content == body[start:end], header
        assert r.headers["content-range"] == f"bytes {start}-{end - 1}/{size}", header
        assert r.headers["content-length"] == str(end - start), header
        _same_headers(r, target)


async def test_an_unsatisfiable_range_is_416(target: Target) -> None:
    size = len(target.body)
    for header in (f"bytes={size}-", f"bytes={size + 5}-{size + 10}", "bytes=-0"):
        r = await target.request(range=header)
        assert_problem(r, 416, "range_not_satisfiable")
        assert r.headers["content-range"] == f"bytes */{size}", header


async def test_several_or_malformed_ranges_get_the_whole_body(target: Target) -> None:
    for header in (
        "bytes=0-1,5-6",
        "bytes=0-1, 3-4",
        "bytes=5-3",
        "bytes=abc",
        "items=0-1",
        "bytes=",
        "bytes=-",
        "0-9",
    ):
        r = await target.request(range=header)
        assert r.status_code == 200, (header, r.status_code)
        assert r.content == target.body and r.headers["content-length"] == str(len(target.body)), header
        assert "content-range" not in r.headers
        _same_headers(r, target)


async def test_if_range_serves_the_range_only_for_the_current_etag(target: Target) -> None:
    r = await target.request(range="bytes=10-19", **{"if-range": target.etag})
    assert r.status_code == 206 and r.content == target.body[10:20]
    for other in ('"not-the-etag"', f"W/{target.etag}", "Tue, 01 Dec 2026 10:00:00 GMT"):
        r = await target.request(range="bytes=10-19", **{"if-range": other})
        assert r.status_code == 200 and r.content == target.body, other


async def test_if_none_match_with_the_current_etag_is_304_without_a_body(target: Target) -> None:
    for value in (target.etag, f"W/{target.etag}", f'"other", {target.etag}', "*"):
        r = await target.request(**{"if-none-match": value})
        assert r.status_code == 304, (value, r.status_code)
        assert r.content == b"" and r.headers["etag"] == target.etag, value
        assert "content-length" not in r.headers or r.headers["content-length"] == str(len(target.body))
    # It wins over a range (RFC 9110 §13.2.2); HEAD answers the same.
    r = await target.request(range="bytes=0-9", **{"if-none-match": target.etag})
    assert r.status_code == 304 and r.content == b""
    r = await target.request("HEAD", **{"if-none-match": target.etag})
    assert r.status_code == 304 and r.content == b""
    r = await target.request(**{"if-none-match": '"other"'})
    assert r.status_code == 200 and r.content == target.body


async def test_head_has_the_status_and_headers_of_get_and_no_body(target: Target) -> None:
    for headers in ({}, {"range": "bytes=100-199"}, {"range": "bytes=0-1,4-5"}):
        got = await target.request("GET", **headers)
        head = await target.request("HEAD", **headers)
        assert head.status_code == got.status_code, headers
        assert head.content == b"", headers
        for name in ("content-length", "content-range", "content-type", "etag", "accept-ranges", "content-disposition"):
            assert head.headers.get(name) == got.headers.get(name), (name, headers)


async def test_seven_random_ranges_reassemble_the_whole_file(target: Target) -> None:
    size = len(target.body)
    rng = random.Random(f"seven-{target.via}")
    cuts = sorted(rng.sample(range(1, size), 6))
    bounds = list(zip([0, *cuts], [*cuts, size], strict=True))
    rng.shuffle(bounds)  # fetched in any order, placed by their Content-Range
    pieces: dict[int, bytes] = {}
    for start, end in bounds:
        r = await target.request(range=f"bytes={start}-{end - 1}")
        assert r.status_code == 206
        first = int(r.headers["content-range"].split()[1].split("-")[0])
        pieces[first] = r.content
    whole = b"".join(pieces[k] for k in sorted(pieces))
    assert whole == target.body
    assert f'"{hashlib.sha256(whole).hexdigest()}"' == target.etag


async def test_authorization_runs_before_any_range_or_condition(
    api: Api, stored: tuple[Org, str, bytes], users: UserFactory
) -> None:
    org, export_id, body = stored
    path = org.path(f"/exports/{export_id}/result")
    etag = f'"{hashlib.sha256(body).hexdigest()}"'
    stranger = await users.make("stranger")
    conditions: list[dict[str, str]] = [{"range": "bytes=0-9"}, {"if-none-match": etag}, {"range": f"bytes={10**9}-"}]
    for method in ("GET", "HEAD"):
        for headers in conditions:
            r = await api.call(method, path, None, headers=headers)
            assert r.status_code == 401, (method, headers)
            for who, where in [
                (stranger, path),
                (org.admin, path),
                (org.owner, org.path(f"/exports/{uuid.uuid4()}/result")),
            ]:
                r = await api.call(method, where, who, headers=headers)
                assert r.status_code == 404, (method, headers, r.status_code)
            r = await api.client.request(method, path, params={"token": "forged"}, headers=headers)
            assert r.status_code == 401, (method, headers)
    for headers in conditions:
        assert_problem(await api.call("GET", path, None, headers=headers), 401, "unauthenticated")
        assert_problem(await api.call("GET", path, stranger, headers=headers), 404, "not_found")
