"""Results in an S3-compatible object store (SPEC §15), against moto's standalone server over real HTTP.

The worker's multipart upload, the 303 to a presigned GET after the download's authorization, ranges through
it, streaming through the API when redirects are off, aborted uploads (a failed build, a SIGKILLed worker), the
cleanup, expiry, the org purge by prefix, and the start-up check of the bucket.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import itertools
import math
import uuid
import zlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import httpx
import psycopg
import pytest
from litestar.testing import AsyncTestClient

from space.app import create_app
from space.check import Probe, ready_to_serve, result_store
from space.config import Settings, SettingsError, load_settings
from space.db import Database
from space.exports.lease import Lease
from space.exports.maintenance import cleanup
from space.exports.pipeline import run_export
from space.exports.storage.protocol import ResultKey
from space.exports.storage.s3 import PART_BYTES, PRESIGN_SECONDS, S3Location, S3ResultStore
from space.failures import OperatorError
from space.orgs.jobs import purge_org
from tests.exports.fixtures import create_export, runner, tuned, uid, wait_for
from tests.exports.s3_fixtures import AWS_ENV, BUCKET, S3Server, aws_environment, s3_settings, store_for
from tests.helpers import Api, Org, UserFactory, assert_problem, spawn_worker
from tests.observability.scrape import delta, scrape

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def s3set(settings: Settings, s3_server: S3Server) -> Settings:
    """Default settings with results in the test bucket (redirects on, the default)."""
    return s3_settings(settings)


@pytest.fixture(scope="module")
async def s3api(s3set: Settings, users: UserFactory) -> AsyncIterator[Api]:
    """The real app on those settings."""
    async with AsyncTestClient(app=create_app(s3set)) as c:
        yield Api(c, users)


def seed_tickets(owner: psycopg.Connection[Any], org: Org, n: int, *, title_bytes: int = 250) -> None:
    """`n` tickets with long titles, set-based (as the owner), so that the CSV spans several parts."""
    owner.execute(
        "INSERT INTO tickets (id, org_id, number, title, creator_id)"
        " SELECT gen_random_uuid(), %(org)s, g, 'row ' || g || ' ' || repeat('x', %(len)s), %(creator)s"
        " FROM generate_series(1, %(n)s) g",
        {"org": org.id, "n": n, "len": title_bytes, "creator": org.member.id},
    )
    owner.execute("UPDATE ticket_counters SET last_number = %s WHERE org_id = %s", (n, org.id))


def execution_of(owner: psycopg.Connection[Any], export_id: str) -> uuid.UUID:
    """The export's current execution id, read as the owner."""
    row = owner.execute("SELECT execution_id FROM export_jobs WHERE id = %s", (export_id,)).fetchone()
    assert row is not None and row[0] is not None
    return uuid.UUID(str(row[0]))


def object_key(settings: Settings, org: Org, export_id: str, execution_id: uuid.UUID) -> str:
    """Where the store keeps one execution: org, export, execution under the prefix."""
    return f"{S3Location.parse(settings.result_store).root(uid(org.id))}{export_id}/{execution_id}"


def org_prefix(settings: Settings, org: Org) -> str:
    """The org's prefix in the bucket."""
    return S3Location.parse(settings.result_store).root(uid(org.id))


async def completed_csv(api: Api, settings: Settings, db: Database, org: Org) -> dict[str, Any]:
    """A tickets CSV of the member's, built by the worker code into the S3 store; its export resource."""
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)
    body: dict[str, Any] = r.json()
    return body


# --- upload and download --------------------------------------------------------------------------------------


async def test_multipart_result_redirects_to_a_presigned_get_with_headers_and_ranges(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    seed_tickets(owner, org, 55_000)
    done = await completed_csv(s3api, s3set, db, org)
    size = done["byteSize"]
    assert size > 2 * PART_BYTES  # three parts: two of 8 MiB and a smaller last one

    # One object, under org / export / execution, uploaded in parts of at least 5 MiB (moto's multipart ETag
    # ends in the part count, which at 8 MiB each gives this many).
    key = object_key(s3set, org, done["id"], execution_of(owner, done["id"]))
    assert s3_server.keys(org_prefix(s3set, org)) == [key]
    head = s3_server.client.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == size
    assert head["ETag"].strip('"').endswith(f"-{math.ceil(size / PART_BYTES)}")
    assert s3_server.uploads(org_prefix(s3set, org)) == []

    r = await s3api.call("GET", org.path(f"/exports/{done['id']}/result"), org.member, follow_redirects=False)
    assert r.status_code == 303, (r.text, r.headers)
    assert r.headers["cache-control"] == "private, no-store"
    assert r.headers["referrer-policy"] == "no-referrer"
    location = r.headers["location"]
    assert location.startswith(f"{s3_server.endpoint}/{BUCKET}/{key}?")

    async with httpx.AsyncClient() as http:
        whole = await http.get(location)
        assert whole.status_code == 200
        assert whole.headers["content-disposition"] == f'attachment; filename="space-export-{done["id"]}.csv"'
        assert whole.headers["content-type"] == "text/csv; charset=utf-8"
        assert whole.headers["cache-control"] == "private, no-store"
        assert len(whole.content) == size
        assert hashlib.sha256(whole.content).hexdigest() == done["sha256"]
        assert whole.content.startswith(b"\xef\xbb\xbf")

        # A range through the redirect is served by the store itself.
        part = await http.get(location, headers={"Range": f"bytes={PART_BYTES - 10}-{PART_BYTES + 9}"})
        assert part.status_code == 206
        assert part.headers["content-range"] == f"bytes {PART_BYTES - 10}-{PART_BYTES + 9}/{size}"
        assert part.content == whole.content[PART_BYTES - 10 : PART_BYTES + 10]
        tail = await http.get(location, headers={"Range": "bytes=-100"})
        assert tail.status_code == 206 and tail.content == whole.content[-100:]


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
async def test_chunks_of_any_size_make_one_object_of_checksummed_parts(
    s3set: Settings, db: Database, s3_server: S3Server, checksums: str
) -> None:
    """A chunk of at least 5 MiB goes up as a part of its own (uploaded from the writer's buffer, no copy);
    smaller ones are gathered until they make one; the object is the same bytes in order. With botocore's default
    (`when_supported`) the upload is created with CRC32, so the store keeps one for every part and the object's
    composite; with `AWS_REQUEST_CHECKSUM_CALCULATION=when_required` (stores without trailing checksums) none is
    sent or named."""
    key = ResultKey(uuid.uuid4(), uuid.uuid4(), uuid.uuid4())
    sizes = [1 * MIB, MIB * 9 // 2, 8 * MIB, 6 * MIB, 2 * MIB]  # parts: 5.5 MiB gathered, 8 MiB, 6 MiB, the last 2
    chunks = [bytes([n]) * size for n, size in enumerate(sizes, start=1)]
    location = S3Location.parse(s3set.result_store)
    # A store of its own: its client reads botocore's configuration when it is made, inside the block.
    with aws_environment(AWS_REQUEST_CHECKSUM_CALCULATION=checksums):
        store = S3ResultStore(db, location)
        try:
            async with store.sink(key) as sink:
                for seq, chunk in enumerate(chunks):
                    buffer = bytearray(chunk)
                    await sink.write(seq, memoryview(buffer))
                    buffer[:] = b"\0" * len(buffer)  # the writer reuses its buffer as soon as write returns
        finally:
            await store.aclose()
    name = location.key(key)
    whole = b"".join(chunks)
    assert s3_server.client.get_object(Bucket=BUCKET, Key=name)["Body"].read() == whole
    head = s3_server.client.head_object(Bucket=BUCKET, Key=name, ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-4")
    assert s3_server.uploads(name) == []
    if checksums == "when_required":
        assert "ChecksumCRC32" not in head
        return
    # The checksum of a multipart object created with CRC32: the CRC32 of the parts' CRC32s, these four parts.
    bounds = [0, MIB * 11 // 2, MIB * 27 // 2, MIB * 39 // 2, len(whole)]
    crcs = b"".join(zlib.crc32(whole[a:b]).to_bytes(4, "big") for a, b in itertools.pairwise(bounds))
    assert head["ChecksumCRC32"] == base64.b64encode(zlib.crc32(crcs).to_bytes(4, "big")).decode()


async def test_the_redirect_keeps_conditional_requests_the_audit_and_the_metrics(
    s3api: Api, s3set: Settings, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    seed_tickets(owner, org, 500)
    done = await completed_csv(s3api, s3set, db, org)
    path = org.path(f"/exports/{done['id']}/result")
    etag = f'"{done["sha256"]}"'
    before = await scrape(s3api.client)

    # If-None-Match is answered by the API (SPEC §11), before any hand-over, and records nothing.
    r = await s3api.call("GET", path, org.member, headers={"If-None-Match": etag}, follow_redirects=False)
    assert r.status_code == 304 and r.content == b""
    # A range by bearer, then the whole file through a link: each a 303 with the export's ETag.
    r = await s3api.call("GET", path, org.member, headers={"Range": "bytes=10-19"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["etag"] == etag
    minted = await s3api.call("POST", org.path(f"/exports/{done['id']}/links"), org.member)
    assert minted.status_code == 201, minted.text
    r = await s3api.client.get(minted.json()["url"], follow_redirects=False)
    assert r.status_code == 303 and r.headers.get_list("referrer-policy") == ["no-referrer"]
    # HEAD hands nothing over: the API answers it (SPEC §25), and records nothing.
    head = await s3api.client.head(minted.json()["url"], follow_redirects=False)
    assert head.status_code == 200 and "location" not in head.headers
    # A one-byte range: its presigned URL serves whatever its holder asks, so no byte count is recorded for it.
    r = await s3api.call("GET", path, org.member, headers={"Range": "bytes=0-0"}, follow_redirects=False)
    assert r.status_code == 303

    after = await scrape(s3api.client)
    assert delta(before, after, "space_downloads_total", via="bearer") == 2
    assert delta(before, after, "space_downloads_total", via="link") == 1
    trail = await s3api.call("GET", org.path("/audit"), org.owner)
    downloads = [i["details"] for i in trail.json()["items"] if i["action"] == "export.downloaded"][::-1]
    # Every 303 is recorded as it is given, with the range asked for and `redirect`.
    assert downloads == [
        {"via": "bearer", "range": "bytes=10-19", "bytes": None, "redirect": True},
        {"via": "link", "range": None, "bytes": None, "redirect": True},
        {"via": "bearer", "range": "bytes=0-0", "bytes": None, "redirect": True},
    ]


async def test_head_is_answered_by_the_api_with_the_get_headers(
    s3api: Api, s3set: Settings, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    seed_tickets(owner, org, 300)
    done = await completed_csv(s3api, s3set, db, org)
    path = org.path(f"/exports/{done['id']}/result")
    size = done["byteSize"]
    minted = await s3api.call("POST", org.path(f"/exports/{done['id']}/links"), org.member)
    assert minted.status_code == 201, minted.text
    for head in (
        await s3api.call("HEAD", path, org.member, follow_redirects=False),
        await s3api.client.head(minted.json()["url"], follow_redirects=False),
    ):
        assert head.status_code == 200 and head.content == b"", head.headers
        assert "location" not in head.headers
        assert head.headers["content-length"] == str(size)
        assert head.headers["content-type"] == "text/csv; charset=utf-8"
        assert head.headers["etag"] == f'"{done["sha256"]}"'
        assert head.headers["accept-ranges"] == "bytes"
        assert head.headers["content-disposition"] == f'attachment; filename="space-export-{done["id"]}.csv"'
    ranged = await s3api.call("HEAD", path, org.member, headers={"Range": "bytes=5-14"}, follow_redirects=False)
    assert ranged.status_code == 206 and ranged.headers["content-range"] == f"bytes 5-14/{size}"
    assert ranged.headers["content-length"] == "10" and "location" not in ranged.headers
    # Authorized first, as a GET: a former member's HEAD is refused.
    assert (await s3api.call("DELETE", org.path(f"/members/{org.member.id}"), org.owner)).status_code == 204
    refused = await s3api.call("HEAD", path, org.member, follow_redirects=False)
    assert refused.status_code == 403 and "location" not in refused.headers  # access_revoked (a HEAD has no body)
    trail = await s3api.call("GET", org.path("/audit"), org.owner)
    assert not [i for i in trail.json()["items"] if i["action"] == "export.downloaded"]


def _sigv4_matches(url: str, secret: str) -> bool:
    """Recompute a presigned URL's SigV4 signature with the standard library (independently of botocore)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    given = dict(query)["X-Amz-Signature"]
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query) if k != "X-Amz-Signature"
    )
    canonical = "\n".join(["GET", parts.path, canonical_query, f"host:{parts.netloc}\n", "host", "UNSIGNED-PAYLOAD"])
    amz_date = dict(query)["X-Amz-Date"]
    scope = dict(query)["X-Amz-Credential"].split("/", 1)[1]
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret}".encode()
    for piece in scope.split("/"):
        key = hmac.new(key, piece.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), given)


async def test_the_presigned_url_expires_within_60_seconds_and_signs_its_expiry(
    s3api: Api, s3set: Settings, db: Database
) -> None:
    org = await s3api.org()
    done = await completed_csv(s3api, s3set, db, org)
    r = await s3api.call("GET", org.path(f"/exports/{done['id']}/result"), org.member, follow_redirects=False)
    assert r.status_code == 303
    url = r.headers["location"]
    params = dict(parse_qsl(urlsplit(url).query))
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert int(params["X-Amz-Expires"]) == PRESIGN_SECONDS <= 60
    signed_at = dt.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    valid_until = signed_at + dt.timedelta(seconds=int(params["X-Amz-Expires"]))
    assert valid_until <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=PRESIGN_SECONDS)
    # The expiry is part of what is signed: the holder of the URL can't stretch it. (moto serves presigned URLs
    # without checking their age, so the refusal after expiry itself is S3's; what Space controls is checked here.)
    assert _sigv4_matches(url, AWS_ENV["AWS_SECRET_ACCESS_KEY"])
    stretched = url.replace(f"X-Amz-Expires={params['X-Amz-Expires']}", "X-Amz-Expires=604800")
    assert not _sigv4_matches(stretched, AWS_ENV["AWS_SECRET_ACCESS_KEY"])


async def test_the_redirect_is_only_given_after_authorization(
    s3api: Api, s3set: Settings, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    other = await s3api.org()
    done = await completed_csv(s3api, s3set, db, org)
    path = org.path(f"/exports/{done['id']}/result")

    # Another member of the org, a member of another org, no token: refused, and no Location anywhere.
    for user in (org.admin, org.customer, other.owner):
        r = await s3api.call("GET", path, user, follow_redirects=False)
        assert_problem(r, 404, "not_found")
        assert "location" not in r.headers
    r = await s3api.call("GET", path, follow_redirects=False)
    assert_problem(r, 401, "unauthenticated")
    assert "location" not in r.headers

    # The owner of the export, demoted to customer (team scope): 403 at once, no redirect.
    r = await s3api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "customer"})
    assert r.status_code == 200, r.text
    r = await s3api.call("GET", path, org.member, follow_redirects=False)
    assert_problem(r, 403, "access_revoked")
    assert "location" not in r.headers
    r = await s3api.call("PATCH", org.path(f"/members/{org.member.id}"), org.owner, json={"role": "member"})
    assert r.status_code == 200, r.text
    assert (await s3api.call("GET", path, org.member, follow_redirects=False)).status_code == 303

    # Past expiresAt: 410 even though the object is still there.
    owner.execute("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (done["id"],))
    r = await s3api.call("GET", path, org.member, follow_redirects=False)
    assert_problem(r, 410, "export_expired")
    assert "location" not in r.headers


async def test_without_redirects_the_api_streams_the_object(
    s3set: Settings, users: UserFactory, db: Database, owner: psycopg.Connection[Any]
) -> None:
    streaming = tuned(s3set, result_redirect=False)
    async with AsyncTestClient(app=create_app(streaming)) as c:
        api = Api(c, users)
        org = await api.org()
        seed_tickets(owner, org, 25_000)
        done = await completed_csv(api, streaming, db, org)
        r = await api.call("GET", org.path(f"/exports/{done['id']}/result"), org.member, follow_redirects=False)
        assert r.status_code == 200, r.text
        assert r.headers["etag"] == f'"{done["sha256"]}"'
        assert r.headers["content-type"] == "text/csv; charset=utf-8"
        assert int(r.headers["content-length"]) == len(r.content) == done["byteSize"] > PART_BYTES
        assert hashlib.sha256(r.content).hexdigest() == done["sha256"]


# --- what never becomes a visible object ----------------------------------------------------------------------


async def test_a_failed_build_aborts_its_multipart_upload(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    seed_tickets(owner, org, 45_000)
    export = await create_export(s3api, org, org.member, {"kind": "tickets_csv"})
    seen: list[dict[str, Any]] = []

    async def gate(point: str, lease: Lease) -> None:
        # Between batches: note the upload once the first part has gone, to know the failure had one to abort;
        # the cleanup leaves it alone then (its execution runs under a live lease).
        if point == "batch" and not seen:
            seen.extend(s3_server.uploads(org_prefix(s3set, org)))
            if seen:
                assert (await cleanup(db, store_for(s3set, db)))["aborted_uploads"] == 0
                assert s3_server.uploads(org_prefix(s3set, org)) == seen

    small = tuned(s3set, export_byte_limit=10 * MIB, export_batch_rows=1000)
    outcome = await run_export(runner(small, db), uid(export["id"]), uid(org.id), gate=gate)
    assert outcome == "too_large"
    assert seen, "the build failed before it began an upload"
    assert s3_server.uploads(org_prefix(s3set, org)) == []
    assert s3_server.keys(org_prefix(s3set, org)) == []


async def test_a_sigkilled_worker_leaves_no_object_and_the_cleanup_aborts_its_upload(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database, owner: psycopg.Connection[Any], owner_url: str
) -> None:
    org = await s3api.org()
    seed_tickets(owner, org, 60_000)
    export = await create_export(s3api, org, org.member, {"kind": "tickets_csv"})
    # Only this export on the queue: earlier tests leave entries that no worker took.
    owner.execute("DELETE FROM saq.saq_jobs WHERE status = 'queued' AND key <> %s", (export["id"],))
    proc = await spawn_worker(
        owner_url,
        SPACE_RESULT_STORE=s3set.result_store,
        SPACE_EXPORT_LEASE_SECONDS="2",
        SPACE_EXPORT_BATCH_ROWS="500",
    )
    prefix = org_prefix(s3set, org)
    try:

        async def uploading() -> list[dict[str, Any]] | None:
            return s3_server.uploads(prefix) or None

        # The worker process starts and checks the bucket first.
        uploads = await wait_for(uploading, "the worker's multipart upload", within=90)
        proc.kill()
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    killed = execution_of(owner, export["id"])
    assert [u["Key"] for u in uploads] == [object_key(s3set, org, export["id"], killed)]
    assert s3_server.keys(prefix) == []  # parts were uploaded, but nothing is visible

    store = store_for(s3set, db)

    async def lease_over() -> bool | None:
        row = owner.execute(
            "SELECT lease_expires_at < clock_timestamp() FROM export_jobs WHERE id = %s", (export["id"],)
        ).fetchone()
        return True if row and row[0] else None

    await wait_for(lease_over, "the killed worker's lease to run out")
    report = await cleanup(db, store)
    assert report["aborted_uploads"] >= 1
    assert s3_server.uploads(prefix) == []

    # Claimed again, the export completes once: one object, of the new execution.
    assert await run_export(runner(s3set, db), uid(export["id"]), uid(org.id)) == "completed"
    row = owner.execute("SELECT attempt, execution_id FROM export_jobs WHERE id = %s", (export["id"],)).fetchone()
    assert row is not None and row[0] == 2 and uuid.UUID(str(row[1])) != killed
    assert s3_server.keys(prefix) == [object_key(s3set, org, export["id"], uuid.UUID(str(row[1])))]


# --- cleanup, expiry, purge -----------------------------------------------------------------------------------


async def test_cleanup_deletes_unpublished_objects_and_expired_results(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    done = await completed_csv(s3api, s3set, db, org)
    published = object_key(s3set, org, done["id"], execution_of(owner, done["id"]))
    # A stale execution of the same export (a worker that lost its lease after completing its upload), and a
    # stray upload of it.
    stale = object_key(s3set, org, done["id"], uuid.uuid4())
    s3_server.client.put_object(Bucket=BUCKET, Key=stale, Body=b"stale bytes")
    s3_server.client.create_multipart_upload(Bucket=BUCKET, Key=stale)
    store = store_for(s3set, db)

    report = await cleanup(db, store)
    assert report["orphan_objects"] >= 1 and report["aborted_uploads"] >= 1
    assert s3_server.keys(org_prefix(s3set, org)) == [published]
    assert s3_server.uploads(org_prefix(s3set, org)) == []
    assert (
        await s3api.call("GET", org.path(f"/exports/{done['id']}/result"), org.member, follow_redirects=False)
    ).status_code == 303

    owner.execute("UPDATE export_jobs SET expires_at = now() - interval '1 second' WHERE id = %s", (done["id"],))
    report = await cleanup(db, store)
    assert report["purged"] >= 1
    assert s3_server.keys(org_prefix(s3set, org)) == []
    assert_problem(
        await s3api.call("GET", org.path(f"/exports/{done['id']}/result"), org.member, follow_redirects=False),
        410,
        "export_expired",
    )


async def test_deleting_an_export_deletes_its_object(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database
) -> None:
    org = await s3api.org()
    done = await completed_csv(s3api, s3set, db, org)
    assert s3_server.keys(org_prefix(s3set, org)) != []
    r = await s3api.call("DELETE", org.path(f"/exports/{done['id']}"), org.member)
    assert r.status_code == 204
    assert s3_server.keys(org_prefix(s3set, org)) == []


async def test_the_purge_leaves_no_object_under_the_org_prefix(
    s3api: Api, s3set: Settings, s3_server: S3Server, db: Database, owner: psycopg.Connection[Any]
) -> None:
    org = await s3api.org()
    other = await s3api.org()
    await completed_csv(s3api, s3set, db, org)
    await completed_csv(s3api, s3set, db, org)
    kept = await completed_csv(s3api, s3set, db, other)
    # An upload a worker left behind, and an object no ledger row knows.
    s3_server.client.create_multipart_upload(
        Bucket=BUCKET, Key=f"{org_prefix(s3set, org)}{uuid.uuid4()}/{uuid.uuid4()}"
    )
    s3_server.client.put_object(Bucket=BUCKET, Key=f"{org_prefix(s3set, org)}{uuid.uuid4()}/{uuid.uuid4()}", Body=b"x")
    assert len(s3_server.keys(org_prefix(s3set, org))) == 3
    other_keys = s3_server.keys(org_prefix(s3set, other))

    owner.execute(
        "UPDATE organizations SET state = 'deleting', delete_after = now() - interval '1 second' WHERE id = %s",
        (org.id,),
    )
    result = await purge_org(db, uid(org.id), store=store_for(s3set, db))
    assert result is not None
    assert s3_server.keys(org_prefix(s3set, org)) == []
    assert s3_server.uploads(org_prefix(s3set, org)) == []
    assert s3_server.keys(org_prefix(s3set, other)) == other_keys != []
    assert (
        await s3api.call("GET", other.path(f"/exports/{kept['id']}/result"), other.member, follow_redirects=False)
    ).status_code == 303


# --- settings and the start-up check --------------------------------------------------------------------------


def test_result_store_setting_is_validated() -> None:
    assert load_settings({"SPACE_RESULT_STORE": "s3://my-bucket/space/results"}).result_store.startswith("s3://")
    assert load_settings({}).result_store == "postgres"
    assert load_settings({"SPACE_RESULT_REDIRECT": "0"}).result_redirect is False
    for bad in ("s3://", "s3://B_ad", "ftp://bucket", "postgresql", "s3://ab"):
        with pytest.raises(SettingsError, match="SPACE_RESULT_STORE"):
            load_settings({"SPACE_RESULT_STORE": bad})
    assert S3Location.parse("s3://my-bucket/space/results/") == S3Location("my-bucket", "space/results")
    assert S3Location.parse("s3://my-bucket").root() == ""


async def test_the_check_and_start_up_prove_the_bucket_reachable_and_writable(
    s3set: Settings, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = await result_store(Probe(s3set))
    assert found is not None and found.ok, found
    assert "reachable, writable" in found.detail
    await ready_to_serve(s3set)
    assert s3_server.keys(f"{S3Location.parse(s3set.result_store).root()}space-check") == []  # the probe is gone

    assert await result_store(Probe(load_settings({}, database_url=s3set.database_url))) is None  # postgres: no line

    missing = tuned(s3set, result_store="s3://no-such-bucket/x")
    found = await result_store(Probe(missing))
    assert found is not None and not found.ok
    assert "s3://no-such-bucket/x" in found.detail and "can't be reached" in found.detail
    with pytest.raises(OperatorError, match="SPACE_RESULT_STORE: bucket s3://no-such-bucket/x"):
        await ready_to_serve(missing)

    # An endpoint where nothing listens.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    found = await result_store(Probe(s3set))
    assert found is not None and not found.ok and "127.0.0.1:9" in found.detail
