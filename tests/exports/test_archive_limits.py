"""The complete archive's own limits (SPEC §13, §26, §27): SPACE_ARCHIVE_ROW_LIMIT per member file,
SPACE_ARCHIVE_BYTE_LIMIT over the whole ZIP, SPACE_ARCHIVE_TIMEOUT_SECONDS for its read and its queue entry, the
org's result quota still over it; and failure words (`errorDetail`, the result route's detail) that name the
limit passed and the setting that raises it. Built by the real worker on the real database and queue."""

from __future__ import annotations

import asyncio
import io
import json
import math
import zipfile
from types import SimpleNamespace
from typing import Any

from saq.job import Status

from space.config import Settings
from space.db import Database
from space.exports.jobs import wake_after_export_job
from space.exports.pipeline import run_export
from space.queue import open_queue
from tests.exports.fixtures import (
    add_project,
    add_tickets,
    chunk_count,
    create_export,
    download,
    job_row,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api, Org, TestUser, assert_problem

ARCHIVE = {"kind": "archive"}


async def _seeded(api: Api, db: Database, *, tasks: int, tickets: int) -> Org:
    """An org whose snapshot.json holds 1 + `tasks` rows (one live project and its tasks) and whose tickets.csv
    holds `tickets` rows."""
    org = await api.org()
    await add_project(db, org.id, "Big", [f"task {i}" for i in range(tasks)])
    await add_tickets(db, org.id, org.member, [f"ticket {i}" for i in range(tickets)])
    return org


async def _run(
    api: Api, db: Database, settings: Settings, org: Org, body: dict[str, Any], user: TestUser | None = None
) -> tuple[str, str]:
    """Create an export as `user` (the owner), run it with `settings`; its id and outcome."""
    export = await create_export(api, org, user or org.owner, body)
    return export["id"], await run_export(runner(settings, db), uid(export["id"]), uid(org.id))


async def _failed(api: Api, db: Database, org: Org, export_id: str, code: str, user: TestUser | None = None) -> str:
    """Check `user`'s (the owner's) export failed `code` with nothing stored; its errorDetail, which is also the
    result route's detail."""
    user = user or org.owner
    status = (await api.call("GET", org.path(f"/exports/{export_id}"), user)).json()
    assert (status["state"], status["errorCode"]) == ("failed", code)
    assert await chunk_count(db, org.id, export_id) == 0
    body = assert_problem(await download(api, org, user, export_id), 409, "export_failed")
    assert body["errorCode"] == code and body["detail"] == status["errorDetail"]
    detail: str = status["errorDetail"]
    return detail


def _manifest_rows(content: bytes) -> dict[str, int]:
    archive = zipfile.ZipFile(io.BytesIO(content))
    assert archive.testzip() is None
    return {
        f["name"]: f["rows"]
        for f in json.loads(archive.read("manifest.json"))["files"]
        if "rows" in f and not f["name"].startswith("data/")
    }


async def test_an_org_past_one_exports_row_limit_takes_its_archive(api: Api, db: Database, settings: Settings) -> None:
    # 60 rows in snapshot.json, 60 in tickets.csv (and 125 in the data files): each past one export's limit of 50, and so is a snapshot or
    # a CSV of the org. The archive runs under its own limits.
    org = await _seeded(api, db, tasks=59, tickets=60)
    small = tuned(settings, export_row_limit=50)
    archive_id, outcome = await _run(api, db, small, org, ARCHIVE)
    assert outcome == "completed"
    status = (await api.call("GET", org.path(f"/exports/{archive_id}"), org.owner)).json()
    assert status["rowCount"] == 245 and status["errorCode"] is None and status["errorDetail"] is None
    r = await download(api, org, org.owner, archive_id)
    assert r.status_code == 200, r.text
    assert _manifest_rows(r.content) == {"snapshot.json": 60, "tickets.csv": 60}

    snapshot_id, outcome = await _run(api, db, small, org, {"kind": "snapshot"})
    assert outcome == "too_many_rows"
    detail = await _failed(api, db, org, snapshot_id, "too_many_rows")
    # A snapshot has no filters: its words point at the archive and the setting, never at filters.
    assert "60 rows exceed the limit of 50" in detail and "SPACE_EXPORT_ROW_LIMIT" in detail
    assert "archive" in detail and "filter" not in detail.lower()

    csv_id, outcome = await _run(api, db, small, org, {"kind": "tickets_csv"})
    assert outcome == "too_many_rows"
    detail = await _failed(api, db, org, csv_id, "too_many_rows")
    assert "60 rows exceed the limit of 50" in detail and "SPACE_EXPORT_ROW_LIMIT" in detail
    assert "Narrow the filters" in detail


async def test_the_archive_row_limit_counts_each_member_file(api: Api, db: Database, settings: Settings) -> None:
    # snapshot.json 6 rows, tickets.csv 7: 13 in all.
    org = await _seeded(api, db, tasks=5, tickets=7)
    # n = 7: the larger member holds n rows and passes, though the archive holds 13 (rows are not summed).
    archive_id, outcome = await _run(api, db, tuned(settings, archive_row_limit=7), org, ARCHIVE)
    assert outcome == "completed"
    assert _manifest_rows((await download(api, org, org.owner, archive_id)).content) == {
        "snapshot.json": 6,
        "tickets.csv": 7,
    }
    # n = 6: tickets.csv holds n + 1 and fails the archive; snapshot.json's n rows would pass.
    archive_id, outcome = await _run(api, db, tuned(settings, archive_row_limit=6), org, ARCHIVE)
    assert outcome == "too_many_rows"
    detail = await _failed(api, db, org, archive_id, "too_many_rows")
    assert "tickets.csv would hold 7 rows" in detail and "limit of 6 rows per file" in detail
    assert "SPACE_ARCHIVE_ROW_LIMIT" in detail and "filter" not in detail.lower()

    # snapshot.json past the limit names snapshot.json.
    await add_project(db, org.id, "More", ["one more"])
    archive_id, outcome = await _run(api, db, tuned(settings, archive_row_limit=7), org, ARCHIVE)
    assert outcome == "too_many_rows"
    detail = await _failed(api, db, org, archive_id, "too_many_rows")
    assert "snapshot.json would hold 8 rows" in detail and "SPACE_ARCHIVE_ROW_LIMIT" in detail


async def test_the_archive_byte_limit_bounds_the_whole_zip(api: Api, db: Database, settings: Settings) -> None:
    org = await _seeded(api, db, tasks=20, tickets=20)
    archive_id, outcome = await _run(api, db, settings, org, ARCHIVE)
    assert outcome == "completed"
    size = (await job_row(db, org.id, archive_id)).byte_size
    assert size is not None
    # One export's byte limit, far below the ZIP, doesn't apply to it; the archive's own does, to the byte.
    at_limit = tuned(settings, export_byte_limit=100, archive_byte_limit=size)
    archive_id, outcome = await _run(api, db, at_limit, org, ARCHIVE)
    assert outcome == "completed" and (await job_row(db, org.id, archive_id)).byte_size == size
    # (Other staff request the next ones: an owner may start 3 exports of an org a minute.)
    archive_id, outcome = await _run(api, db, tuned(at_limit, archive_byte_limit=size - 1), org, ARCHIVE, org.admin)
    assert outcome == "too_large"
    detail = await _failed(api, db, org, archive_id, "too_large", org.admin)
    assert f"limit of {size - 1} bytes" in detail and "SPACE_ARCHIVE_BYTE_LIMIT" in detail
    assert "filter" not in detail.lower()

    # The org's result quota still applies: two archives are stored, a third that passes the quota fails.
    stored = 2 * size
    quota = tuned(settings, org_result_quota_bytes=stored + size - 1)
    archive_id, outcome = await _run(api, db, quota, org, ARCHIVE, org.member)
    assert outcome == "quota_exceeded"
    detail = await _failed(api, db, org, archive_id, "quota_exceeded", org.member)
    assert "SPACE_ORG_RESULT_QUOTA_BYTES" in detail


async def test_the_archive_read_is_bounded_by_its_own_timeout(api: Api, db: Database, settings: Settings) -> None:
    org = await _seeded(api, db, tasks=2, tickets=2)
    never = asyncio.Event()

    async def stall(point: str, lease: Any) -> None:
        if point == "counted":
            await never.wait()

    # The archive's bound is its own setting: one export's long bound doesn't keep a stalled archive alive.
    quick = tuned(settings, export_timeout_seconds=3600, archive_timeout_seconds=0.3)
    export = await create_export(api, org, org.owner, ARCHIVE)
    assert await run_export(runner(quick, db), uid(export["id"]), uid(org.id), gate=stall) == "timeout"
    detail = await _failed(api, db, org, export["id"], "timeout")
    assert "0.3 s" in detail and "SPACE_ARCHIVE_TIMEOUT_SECONDS" in detail

    # And one export's short bound doesn't cut an archive short: the archive's read waits here until a
    # tickets_csv read (of another org) has run out its 0.3 s, then completes.
    other = await _seeded(api, db, tasks=0, tickets=1)
    short = tuned(settings, export_timeout_seconds=0.3)
    csv = await create_export(api, other, other.owner, {"kind": "tickets_csv"})

    async def outlast(point: str, lease: Any) -> None:
        if point == "counted":
            outcome = await run_export(runner(short, db), uid(csv["id"]), uid(other.id), gate=stall)
            assert outcome == "timeout"

    export = await create_export(api, org, org.owner, ARCHIVE)
    assert await run_export(runner(short, db), uid(export["id"]), uid(org.id), gate=outlast) == "completed"


async def test_the_archives_queue_entry_has_the_archive_timeout(api: Api, db: Database, settings: Settings) -> None:
    lease = math.ceil(settings.export_lease_seconds)
    archive_timeout = math.ceil(settings.archive_timeout_seconds) + 2 * lease + 30
    export_timeout = math.ceil(settings.export_timeout_seconds) + 2 * lease + 30
    assert archive_timeout > export_timeout  # the defaults differ, so the test tells the two apart
    queue = await open_queue(settings, db, application_name="space-test-archive-queue")
    await queue.connect()
    try:
        # Created when the org has room: the service enqueues it.
        org = await api.org()
        archive = await create_export(api, org, org.owner, ARCHIVE)
        entry = await queue.job(archive["id"])
        assert entry is not None and entry.timeout == archive_timeout

        # Created behind another export of the org: the wake-up that follows that one's end enqueues it.
        org = await api.org()
        first = await create_export(api, org, org.owner, {"kind": "snapshot"})
        waiting = await create_export(api, org, org.admin, ARCHIVE)
        entry = await queue.job(first["id"])
        assert entry is not None and entry.timeout == export_timeout
        assert await queue.job(waiting["id"]) is None
        assert await run_export(runner(settings, db), uid(first["id"]), uid(org.id)) == "completed"
        await entry.finish(Status.COMPLETE, result="completed")
        ctx: dict[str, Any] = {"settings": settings, "db": db, "worker": SimpleNamespace(queue=queue), "job": entry}
        await wake_after_export_job(ctx)
        woken = await queue.job(waiting["id"])
        assert woken is not None and woken.timeout == archive_timeout
    finally:
        await queue.disconnect()
