"""Export correctness: the real worker functions called directly against the real database."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from collections import Counter
from typing import Any

import psycopg
from sqlalchemy import event, text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.exports.pipeline import run_export
from space.exports.storage.postgres import PgResultStore
from space.exports.storage.protocol import ResultKey
from tests.exports.fixtures import (
    Gate,
    add_project,
    add_tickets,
    background,
    chunk_count,
    create_export,
    download,
    job_row,
    parse_csv,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api, OrgFactory, app_database

HEADER = ["number", "title", "status", "priority", "assignee", "createdAt", "updatedAt"]


async def test_205_rows_in_batches_each_once_with_progress(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    markers = [f"marker-{i:03d}" for i in range(205)]
    await add_tickets(db, org.id, org.member, markers)
    await add_tickets(db, org.id, org.member, ["not this one"], status="closed")
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "filters": {"status": "open"}})
    gate = Gate({"batch", "before_publish"})
    seen: list[tuple[str, int]] = []
    work = run_export(runner(tuned(settings, export_batch_rows=100), db), uid(export["id"]), uid(org.id), gate=gate)
    async with background(work, gate) as task:
        for _ in range(3):
            await gate.reached("batch")
            r = await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)
            seen.append((r.json()["state"], r.json()["progress"]))
            gate.resume("batch")
        await gate.reached("before_publish")
        r = await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)
        assert (r.json()["state"], r.json()["progress"]) == ("running", 95)
        gate.resume("before_publish")
        assert await task == "completed"
    assert seen == [("running", 46), ("running", 93), ("running", 95)]
    r = await api.call("GET", org.path(f"/exports/{export['id']}"), org.member)
    assert r.json()["state"] == "completed" and r.json()["progress"] == 100 and r.json()["rowCount"] == 205

    records = parse_csv((await download(api, org, org.member, export["id"])).content)
    assert records[0] == HEADER
    counts = Counter(rec[1] for rec in records[1:])
    assert counts == Counter(markers)
    assert [int(rec[0]) for rec in records[1:]] == sorted(int(rec[0]) for rec in records[1:])


async def test_list_and_csv_filters_agree(api: Api, orgs: OrgFactory, db: Database, settings: Settings) -> None:
    org = await orgs.make()
    mine = org.memberships["member"]
    await add_tickets(db, org.id, org.member, ["Alpha 100% done", "alpha_x"], status="open", priority="high")
    await add_tickets(db, org.id, org.member, ["ALPHA assigned"], status="open", priority="high", assignee_id=mine)
    await add_tickets(db, org.id, org.member, ["alpha pending"], status="pending", priority="high")
    await add_tickets(db, org.id, org.member, ["beta"], status="open", priority="low", assignee_id=mine)
    await add_tickets(db, org.id, org.customer, ["alpha customer"], status="open", priority="high")
    await add_tickets(db, org.id, org.customer2, ["alpha other customer"], status="open", priority="high")
    cases = [
        {},
        {"status": "open"},
        {"priority": "high", "q": "alpha"},
        {"assignment": "mine"},
        {"assignment": "unassigned", "status": "open"},
        {"q": "100%"},
        {"q": "_"},
    ]
    for user in (org.member, org.customer):
        for filters in cases:
            r = await api.call("GET", org.path("/tickets"), user, params={**filters, "pageSize": 200})
            assert r.status_code == 200, r.text
            listed = [t["number"] for t in r.json()["items"]]
            export = await create_export(api, org, user, {"kind": "tickets_csv", "filters": filters})
            assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
            records = parse_csv((await download(api, org, user, export["id"])).content)
            assert [int(rec[0]) for rec in records[1:]] == listed, (user.name, filters)
            # Three exports per minute per user: let the window pass for the next case.
            await _age_exports(db, org.id, user.id)
    # The cases are not vacuous: the member's view of `q=alpha, priority=high` has rows of three creators.
    r = await api.call("GET", org.path("/tickets"), org.member, params={"q": "alpha", "priority": "high"})
    assert r.json()["total"] == 6


async def _age_exports(db: Database, org_id: str, user_id: uuid.UUID) -> None:
    # Test-only: move this user's exports out of the rate-limit window (a minute) instead of waiting.
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org_id))) as uow:
        await uow.session.execute(
            text("UPDATE export_jobs SET created_at = created_at - interval '2 minutes' WHERE creator_id = :u"),
            {"u": user_id},
        )


async def test_row_limit_plus_one_fails_too_many_rows(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(6)])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    outcome = await run_export(runner(tuned(settings, export_row_limit=5), db), uid(export["id"]), uid(org.id))
    assert outcome == "too_many_rows"
    job = await job_row(db, org.id, export["id"])
    assert (job.state, job.error_code, job.row_count, job.sha256) == ("failed", "too_many_rows", None, None)
    assert await chunk_count(db, org.id, export["id"]) == 0

    # Exactly at the limit is fine: the limit is "above", never a truncation.
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    outcome = await run_export(runner(tuned(settings, export_row_limit=6), db), uid(export["id"]), uid(org.id))
    assert outcome == "completed"
    assert (await job_row(db, org.id, export["id"])).row_count == 6


async def test_byte_limit_fails_too_large_and_stores_nothing(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["x" * 300 for _ in range(30)])
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    small = tuned(settings, export_byte_limit=4000, export_chunk_bytes=1000, export_batch_rows=5)
    outcome = await run_export(runner(small, db), uid(export["id"]), uid(org.id))
    assert outcome == "too_large"
    job = await job_row(db, org.id, export["id"])
    assert (job.state, job.error_code, job.byte_size, job.sha256) == ("failed", "too_large", None, None)
    # Chunks were written on the way (1000 bytes each) and removed with the failure.
    assert await chunk_count(db, org.id, export["id"]) == 0
    r = await download(api, org, org.member, export["id"])
    assert r.status_code == 409 and r.json()["errorCode"] == "too_large"


async def test_multi_chunk_result_streams_back_whole(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    titles = [f"row {i} " + "y" * (i % 50) for i in range(120)]
    await add_tickets(db, org.id, org.member, titles)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    small = tuned(settings, export_chunk_bytes=1024, export_batch_rows=7)
    assert await run_export(runner(small, db), uid(export["id"]), uid(org.id)) == "completed"
    job = await job_row(db, org.id, export["id"])
    assert job.byte_size is not None
    assert await chunk_count(db, org.id, export["id"]) == -(-job.byte_size // 1024)
    r = await download(api, org, org.member, export["id"])
    assert len(r.content) == job.byte_size
    assert [rec[1] for rec in parse_csv(r.content)[1:]] == titles


async def test_snapshot_content(api: Api, orgs: OrgFactory, db: Database, settings: Settings) -> None:
    org = await orgs.make("Snap & Co")
    live = await add_project(db, org.id, "Live project", ["task one", "task two"])
    gone = await add_project(db, org.id, "Deleted project", ["ghost task"], deleted=True)
    await add_tickets(db, org.id, org.customer, ["a ticket is not in a snapshot"])
    export = await create_export(api, org, org.admin, {"kind": "snapshot"})
    assert await run_export(runner(tuned(settings, export_batch_rows=1), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    job = await job_row(db, org.id, export["id"])
    r = await download(api, org, org.admin, export["id"])
    assert r.status_code == 200
    body = json.loads(r.content)
    assert list(body) == ["schemaVersion", "organizationId", "organizationName", "snapshotAt", "projects", "tasks"]
    assert body["schemaVersion"] == 1
    assert body["organizationId"] == org.id and body["organizationName"] == "Snap & Co"
    assert job.snapshot_at is not None
    assert body["snapshotAt"] == job.snapshot_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert [p["id"] for p in body["projects"]] == [str(live)]
    project = body["projects"][0]
    assert set(project) == {"id", "name", "version", "createdAt", "updatedAt"}
    assert project["name"] == "Live project" and project["version"] == 1
    assert sorted(t["title"] for t in body["tasks"]) == ["task one", "task two"]
    assert {t["projectId"] for t in body["tasks"]} == {str(live)}
    assert set(body["tasks"][0]) == {"id", "projectId", "title", "status", "dueDate", "createdAt", "updatedAt"}
    assert [t["id"] for t in body["tasks"]] == sorted(t["id"] for t in body["tasks"])
    assert job.row_count == 3
    raw = r.content.decode()
    assert str(gone) not in raw and "ghost task" not in raw and "Deleted project" not in raw
    for person in (org.owner, org.admin, org.member, org.customer, org.customer2):
        assert person.email not in raw and person.token not in raw
    assert "@" not in raw and "spc_" not in raw


async def test_csv_format_rules(api: Api, orgs: OrgFactory, db: Database, settings: Settings) -> None:
    org = await orgs.make()
    evil = await api.users.make("=HYPERLINK(evil)")
    r = await api.call("POST", org.path("/members"), org.owner, json={"email": evil.email, "role": "member"})
    assert r.status_code == 201
    evil_membership = r.json()["id"]
    titles = [
        'He said "hi", twice',
        "line one\nline two\r\nline three",
        "=SUM(A1:A2)",
        "+1",
        "-1",
        "@import",
        "\uff1dfull width",
        "\uff0bplus",
        "\uff0dminus",
        "\uff20at",
        "\u00a0=nbsp first",
        " \u3000\t=blanks first",
        "\ttab first",
        "\rcr first",
        "\nlf first",
        "a=b stays",
        "plain; with semicolon",
        "",
    ]
    numbers = await add_tickets(db, org.id, org.member, titles, assignee_id=evil_membership)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": ";"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    raw = (await download(api, org, org.member, export["id"])).content
    assert raw.startswith(b'\xef\xbb\xbf"number";"title";"status";"priority";"assignee";"createdAt";"updatedAt"\r\n')
    assert raw.endswith(b"\r\n")
    # Every record ends with CRLF: CRLF count = records + the CRLF inside the second title.
    assert raw.count(b"\r\n") == 1 + len(titles) + 1
    assert b'"He said ""hi"", twice"' in raw
    records = parse_csv(raw, ";")
    assert records[0] == HEADER and len(records) == 1 + len(titles)
    guarded = {
        "=SUM(A1:A2)",
        "+1",
        "-1",
        "@import",
        "\uff1dfull width",
        "\uff0bplus",
        "\uff0dminus",
        "\uff20at",
        "\u00a0=nbsp first",
        " \u3000\t=blanks first",
        "\ttab first",
        "\rcr first",
        "\nlf first",
    }
    expected = [("'" + t) if t in guarded else t for t in titles]
    assert [rec[1] for rec in records[1:]] == expected
    assert [int(rec[0]) for rec in records[1:]] == numbers
    for rec in records[1:]:
        assert len(rec) == 7
        assert rec[2] == "open" and rec[3] == "normal"
        assert rec[4] == "'" + evil.name  # the assignee's display name, guarded too
        assert rec[5].endswith("Z") and "T" in rec[5]
    # Every field is quoted: each record's fields start with a quote right after a delimiter.
    first_data = raw.split(b"\r\n")[1]
    assert first_data.startswith(b'"') and b'";"' in first_data


async def test_two_customers_each_get_only_their_rows(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    a = await add_tickets(db, org.id, org.customer, [f"refund please {i}" for i in range(3)])
    b = await add_tickets(db, org.id, org.customer2, [f"refund please {i}" for i in range(4)])
    await add_tickets(db, org.id, org.member, ["refund please (staff)"])
    filters = {"q": "refund please", "status": "open"}
    got = {}
    for who, user in (("a", org.customer), ("b", org.customer2)):
        export = await create_export(api, org, user, {"kind": "tickets_csv", "filters": filters})
        assert export["scope"] == "own"
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
        got[who] = [int(r[0]) for r in parse_csv((await download(api, org, user, export["id"])).content)[1:]]
    assert got == {"a": a, "b": b}
    # The staff export with the same filter sees all of them: the filter matched every row.
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "filters": filters})
    assert export["scope"] == "team"
    await run_export(runner(settings, db), uid(export["id"]), uid(org.id))
    rows = parse_csv((await download(api, org, org.member, export["id"])).content)[1:]
    assert len(rows) == 3 + 4 + 1


async def test_promotion_does_not_widen_an_own_export(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    own = await add_tickets(db, org.id, org.customer, ["mine 1", "mine 2"])
    await add_tickets(db, org.id, org.customer2, ["theirs"])
    await add_tickets(db, org.id, org.member, ["staff"])
    export = await create_export(api, org, org.customer, {"kind": "tickets_csv"})
    assert export["scope"] == "own"
    r = await api.call("PATCH", org.path(f"/members/{org.customer.id}"), org.owner, json={"role": "member"})
    assert r.status_code == 200, r.text
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.customer, export["id"])
    assert r.status_code == 200
    assert [int(rec[0]) for rec in parse_csv(r.content)[1:]] == own
    assert (await api.call("GET", org.path(f"/exports/{export['id']}"), org.customer)).json()["scope"] == "own"


async def test_read_timeout_fails_timeout(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, owner_url: str
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["slow"])
    quick = tuned(settings, export_timeout_seconds=0.3)

    # The database side: the count statement runs past statement_timeout (the test slows it down).
    async with app_database(owner_url, "space-tests-slow") as slow_db:

        @event.listens_for(slow_db.engine.sync_engine, "before_cursor_execute", retval=True)
        def slow_count(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> Any:
            if statement.startswith("SELECT count(*)") and "FROM tickets" in statement:
                statement = statement.replace("SELECT count(*)", "SELECT count(*) + 0 * length(pg_sleep(5)::text)", 1)
            return statement, params

        export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
        assert await run_export(runner(quick, slow_db), uid(export["id"]), uid(org.id)) == "timeout"
    job = await job_row(db, org.id, export["id"])
    assert (job.state, job.error_code) == ("failed", "timeout")
    assert await chunk_count(db, org.id, export["id"]) == 0

    # The whole read is bounded too, not only each statement: a read stalled between statements fails.
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    never = asyncio.Event()

    async def stall(point: str, lease: Any) -> None:
        if point == "counted":
            await never.wait()

    assert await run_export(runner(quick, db), uid(export["id"]), uid(org.id), gate=stall) == "timeout"
    assert (await job_row(db, org.id, export["id"])).error_code == "timeout"


async def test_both_delimiters_give_the_same_records_and_follow_a_rename(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings, owner_url: str
) -> None:
    # `,` exports concatenate the stored parts; `;` exports rebuild them around the other separator.
    org = await orgs.make()
    titles = [
        'Quote "inside", comma; semicolon',
        "line one\nline two\r\nline three",
        '","',
        '";"',
        "=1+1",
        "\u3000@blank first",
        "",
        "x" * 300,
    ]
    member = org.memberships["member"]
    await add_tickets(db, org.id, org.member, titles, assignee_id=member, status="pending", priority="urgent")
    await add_tickets(db, org.id, org.member, ["unassigned"])
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("UPDATE users SET name = %s WHERE id = %s", ('+Ann "A", B', org.member.id))

    raw = {}
    for delimiter in (",", ";"):
        export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": delimiter})
        quick = tuned(settings, export_batch_rows=3)
        assert await run_export(runner(quick, db), uid(export["id"]), uid(org.id)) == "completed"
        raw[delimiter] = (await download(api, org, org.member, export["id"])).content
    comma, semicolon = parse_csv(raw[","]), parse_csv(raw[";"], ";")
    assert comma == semicolon and len(comma) == 1 + len(titles) + 1
    assert [rec[1] for rec in comma[1:-1]] == ["'" + t if t in ("=1+1", "\u3000@blank first") else t for t in titles]
    assert {rec[4] for rec in comma[1:-1]} == {'\'+Ann "A", B'} and comma[-1][4] == ""
    assert {(rec[2], rec[3]) for rec in comma[1:-1]} == {("pending", "urgent")}
    for delimiter, body in raw.items():
        # Every field quoted, every record ended by CRLF, in both forms.
        first = body.split(b"\r\n")[1]
        assert first.startswith(b'"') and first.count(f'"{delimiter}"'.encode()) == 6, first
        assert body.count(b"\r\n") == len(comma) + 1  # header and records, plus the CRLF in the second title

    # A rename after the fact shows in the next export: the cell is looked up in the read's snapshot.
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("UPDATE users SET name = %s WHERE id = %s", ("Plain Ann", org.member.id))
    await _age_exports(db, org.id, org.member.id)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": ";"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    records = parse_csv((await download(api, org, org.member, export["id"])).content, ";")
    assert {rec[4] for rec in records[1:-1]} == {"Plain Ann"}


async def test_whole_second_timestamps_keep_six_digits(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    await add_tickets(db, org.id, org.member, ["on the second"])
    project = await add_project(db, org.id, "P", ["task"])
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uid(org.id))) as uow:
        for table in ("tickets", "tasks", "projects"):
            await uow.session.execute(
                text(f"UPDATE {table} SET created_at = '2030-01-02 03:04:05+00', updated_at = '2030-01-02 03:04:05+00'")
            )
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    record = parse_csv((await download(api, org, org.member, export["id"])).content)[1]
    assert record[5:] == ["2030-01-02T03:04:05.000000Z"] * 2
    export = await create_export(api, org, org.admin, {"kind": "snapshot"})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    body = json.loads((await download(api, org, org.admin, export["id"])).content)
    assert body["projects"][0]["id"] == str(project)
    for item in (body["projects"][0], body["tasks"][0]):
        assert (item["createdAt"], item["updatedAt"]) == ("2030-01-02T03:04:05.000000Z",) * 2
    assert body["tasks"][0]["dueDate"] is None


async def test_the_store_streams_a_chunk_in_bounded_parts(
    api: Api, orgs: OrgFactory, db: Database, settings: Settings
) -> None:
    org = await orgs.make()
    titles = [f"row {i} " + "z" * (i % 40) for i in range(200)]
    await add_tickets(db, org.id, org.member, titles)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    assert await run_export(runner(tuned(settings, export_chunk_bytes=5000), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    job = await job_row(db, org.id, export["id"])
    assert job.execution_id is not None and job.byte_size is not None
    whole = (await download(api, org, org.member, export["id"])).content
    # A download never holds more than a part of a chunk as one message (libpq keeps buffers that size).
    parts = [
        p
        async for p in PgResultStore(db, part_bytes=700).read(
            ResultKey(uid(org.id), uid(export["id"]), job.execution_id)
        )
    ]
    assert b"".join(parts) == whole and len(whole) == job.byte_size
    assert max(len(p) for p in parts) == 700 and len(parts) >= -(-job.byte_size // 700)
    assert await chunk_count(db, org.id, export["id"]) == -(-job.byte_size // 5000)
