"""Batches bounded in bytes as well as rows (issue 17): the same bytes whatever the budget, every row once at
each cut, and the read's connection closed after the export instead of pooled with its grown buffers."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections import Counter
from typing import Any

import msgspec
from sqlalchemy import event, text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.demo import bulk_projects_and_tasks, bulk_tickets
from space.exports.formats import snapshot
from space.exports.formats.base import Batch, Format
from space.exports.formats.snapshot import _JSON_ROW_BYTES, Snapshot
from space.exports.formats.tickets_csv import TicketsCsv
from space.exports.pipeline import run_export
from space.tickets.filters import TicketFilters, parse_filters
from tests.exports.fixtures import (
    add_project,
    add_tickets,
    create_export,
    download,
    job_row,
    parse_csv,
    runner,
    tuned,
    uid,
    wait_for,
)
from tests.helpers import Api, Org

UNBOUNDED = 2**40
"""A budget no batch reaches: batches are cut by rows alone, as before the byte budget."""
WIDE = "\U0001f600" * 500
"""The widest title the API accepts: 500 four-byte characters, 2,000 bytes."""


async def _read(db: Database, org_id: str, fmt: Format, size: int, budget: int) -> list[Batch]:
    """Every batch of `fmt`, its data copied, in one snapshot transaction as the worker reads them."""
    tenant = Tenant(org_id=uid(org_id))
    async with UnitOfWork(db.sessionmaker, tenant, isolation="REPEATABLE READ", read_only=True) as uow:
        await uow.session.execute(text("SELECT set_config('TimeZone', 'UTC', true)"))
        return [Batch(b.rows, b.last, bytes(b.data)) async for b in fmt.batches(uow.session, size, budget)]


def _csv(org: Org) -> TicketsCsv:
    return TicketsCsv(uid(org.id), TicketFilters(), None, ",")


async def _demo(api: Api, db: Database) -> Org:
    """An org with the demo's tricky tickets and tasks (space.demo), a few hundred of each."""
    org = await api.org()
    creators = [org.owner.id, org.member.id, org.customer.id]
    assignees = [uid(org.memberships[k]) for k in ("owner", "admin", "member")]
    await bulk_tickets(db, uid(org.id), 300, creators=creators, assignees=assignees)
    await bulk_projects_and_tasks(db, uid(org.id), projects=3, tasks=300)
    return org


def _records(batches: list[Batch]) -> list[bytes]:
    """The CSV records of the batches (every field is quoted, so a record ends at a quote and CRLF)."""
    data = b"".join(bytes(b.data) for b in batches)
    return [r + b'"\r\n' for r in data.split(b'"\r\n')[:-1]]


async def test_byte_bounded_batches_give_the_same_bytes_on_the_demo_data(api: Api, db: Database) -> None:
    org = await _demo(api, db)
    for fmt in (_csv(org), TicketsCsv(uid(org.id), TicketFilters(), None, ";"), Snapshot(uid(org.id), "Acme")):
        before = await _read(db, org.id, fmt, 10_000, UNBOUNDED)
        expected = b"".join(bytes(b.data) for b in before)
        assert sum(b.rows for b in before) == (303 if isinstance(fmt, Snapshot) else 300)
        for size, budget in [(10_000, 1), (10_000, 700), (7, 3_000), (10_000, 5_000)]:
            batches = await _read(db, org.id, fmt, size, budget)
            assert b"".join(bytes(b.data) for b in batches) == expected, (type(fmt).__name__, size, budget)
            assert sum(b.rows for b in batches) == sum(b.rows for b in before)
            # The budget does cut: more batches than by rows alone.
            assert len([b for b in batches if b.rows]) > len([b for b in before if b.rows])


async def test_export_results_are_the_same_bytes_with_and_without_the_budget(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await _demo(api, db)
    results: dict[str, list[bytes]] = {"tickets_csv": [], "snapshot": []}
    # One person per budget: the rate limit allows three recent exports each.
    for budget, person in ((UNBOUNDED, org.owner), (1, org.admin), (1_000, org.member)):
        tight = tuned(settings, export_batch_bytes=budget, export_chunk_bytes=4096)
        for kind in results:
            export = await create_export(api, org, person, {"kind": kind})
            assert await run_export(runner(tight, db), uid(export["id"]), uid(org.id)) == "completed"
            body = (await download(api, org, person, export["id"])).content
            job = await job_row(db, org.id, export["id"])
            assert job.sha256 == hashlib.sha256(body).hexdigest()
            # The snapshot's one moment differs per export; every other byte must not.
            results[kind].append(re.sub(rb'"snapshotAt":"[^"]+"', b'"snapshotAt":""', body, count=1))
    assert len(set(results["tickets_csv"])) == 1
    assert len(set(results["snapshot"])) == 1
    records = parse_csv(results["tickets_csv"][0])
    assert len(records) == 301


async def test_csv_cut_inside_a_run_of_equal_width_rows(api: Api, db: Database) -> None:
    org = await api.org()
    # Numbers 10 to 39: every record has the same width (the timestamps are fixed-width, no assignee).
    await add_tickets(db, org.id, org.member, [f"skip {i}" for i in range(1, 10)], status="closed")
    numbers = await add_tickets(db, org.id, org.member, ["same width"] * 30)
    fmt = TicketsCsv(uid(org.id), parse_filters({"status": "open"}), None, ",")
    whole = await _read(db, org.id, fmt, 10_000, UNBOUNDED)
    widths = {len(r) for r in _records(whole)}
    assert len(widths) == 1
    width = widths.pop()
    # 3.5 records' worth: a record starting under the budget is kept, so a batch holds 4 of them.
    batches = await _read(db, org.id, fmt, 10_000, width * 7 // 2)
    assert [b.rows for b in batches] == [4] * 7 + [2]
    assert [b.last for b in batches] == [*numbers[3::4], numbers[-1]]
    assert all(len(b.data) == b.rows * width for b in batches)
    assert b"".join(bytes(b.data) for b in batches) == b"".join(bytes(b.data) for b in whole)
    # Exactly on a record's end: the next record starts at the budget, not under it.
    batches = await _read(db, org.id, fmt, 10_000, width * 3)
    assert [b.rows for b in batches] == [3] * 10
    assert [b.last for b in batches] == numbers[2::3]
    # With a row limit below the cut, the limit ends the batch.
    assert [b.rows for b in await _read(db, org.id, fmt, 2, width * 7 // 2)] == [2] * 15


async def test_csv_cut_right_after_a_very_wide_row(api: Api, db: Database) -> None:
    org = await api.org()
    titles = [f"narrow {i:02d}" for i in range(12)]
    titles[3] = WIDE
    numbers = await add_tickets(db, org.id, org.member, titles)
    fmt = _csv(org)
    whole = await _read(db, org.id, fmt, 10_000, UNBOUNDED)
    narrow = len(_records(whole)[0])
    batches = await _read(db, org.id, fmt, 10_000, narrow * 5 // 2)
    # Three narrow records a batch; the wide one starts under the budget and ends its batch at once, and the
    # next batch begins with the record after it (its LIMIT still paced by the wide one's width).
    assert [b.rows for b in batches] == [3, 1, 2, 3, 3]
    assert [b.last for b in batches] == [numbers[2], numbers[3], numbers[5], numbers[8], numbers[11]]
    assert WIDE.encode() in batches[1].data and len(batches[1].data) > 2_000
    assert [int(r[0]) for r in parse_csv(b"\xef\xbb\xbf" + b"".join(bytes(b.data) for b in batches))] == numbers
    # A budget below one record: each batch is one record, the wide one too, none lost or repeated.
    single = await _read(db, org.id, fmt, 10_000, 1)
    assert [b.last for b in single] == numbers
    assert b"".join(bytes(b.data) for b in single) == b"".join(bytes(b.data) for b in whole)


async def _tasks(db: Database, org: Org, titles: list[str]) -> list[str]:
    """One project with tasks of these titles; the task ids in the snapshot's order (by id)."""
    await add_project(db, org.id, "Wide", titles)
    tenant = Tenant(org_id=uid(org.id))
    async with UnitOfWork(db.sessionmaker, tenant) as uow:
        rows = await uow.session.execute(text("SELECT id::text, title FROM tasks ORDER BY id"))
        return [f"{row[0]}\t{row[1]}" for row in rows]


def _task_batches(batches: list[Batch]) -> list[tuple[int, Any]]:
    """(rows, last id) of each task batch: the slices after the arrays' separator that end a batch."""
    sep = next(i for i, b in enumerate(batches) if bytes(b.data) == b'],"tasks":[')
    return [(b.rows, b.last) for b in batches[sep + 1 :] if b.rows]


async def test_snapshot_cut_inside_a_run_of_equal_width_rows(api: Api, db: Database) -> None:
    org = await api.org()
    tasks = await _tasks(db, org, ["t" * 40] * 10)
    ids = [t.split("\t")[0] for t in tasks]
    fmt = Snapshot(uid(org.id), "Acme")
    width = 40 + _JSON_ROW_BYTES
    whole = await _read(db, org.id, fmt, 10_000, UNBOUNDED)
    batches = await _read(db, org.id, fmt, 10_000, width * 5 // 2)
    assert _task_batches(batches) == [(3, ids[2]), (3, ids[5]), (3, ids[8]), (1, ids[9])]
    assert b"".join(bytes(b.data) for b in batches) == b"".join(bytes(b.data) for b in whole)
    batches = await _read(db, org.id, fmt, 10_000, width * 2)
    assert _task_batches(batches) == [(2, ids[i + 1]) for i in range(0, 10, 2)]


async def test_snapshot_cut_right_after_a_very_wide_row(api: Api, db: Database) -> None:
    org = await api.org()
    tasks = await _tasks(db, org, [f"narrow {i:02d}" for i in range(11)] + [WIDE])
    ids = [t.split("\t")[0] for t in tasks]
    wide = next(i for i, t in enumerate(tasks) if t.endswith(WIDE))
    fmt = Snapshot(uid(org.id), "Acme")
    whole = await _read(db, org.id, fmt, 10_000, UNBOUNDED)
    batches = await _read(db, org.id, fmt, 10_000, (9 + _JSON_ROW_BYTES) * 5 // 2)
    cuts = _task_batches(batches)
    # The wide task ends its batch; the next batch begins with the task after it.
    assert ids[wide] in [last for _, last in cuts]
    assert [n for n, _ in cuts if n > 3] == []
    assert sum(n for n, _ in cuts) == 12
    assert b"".join(bytes(b.data) for b in batches) == b"".join(bytes(b.data) for b in whole)
    tasks_json = b"".join(bytes(b.data) for b in batches).split(b'"tasks":[')[1]
    assert Counter(re.findall(rb'"id":"([0-9a-f-]{36})"', tasks_json)) == Counter(i.encode() for i in ids)


async def test_wide_task_pages_give_the_json_msgspec_writes(api: Api, db: Database, monkeypatch: Any) -> None:
    # Wide titles, each holding one of the bytes msgspec escapes (the 31 controls text can hold, '"' and '\\'),
    # and some that only look as if they might need it: after the first wide page the rows come as bytes, and a
    # title stored as plain (tasks.title_plain, migration 0014) goes out as it is.
    emoji = "\U0001f600"
    escaped = [chr(c) for c in [*range(1, 0x20), 0x22, 0x5C]]
    titles = [WIDE, "\x7f\u2028\u2029/<>" + emoji * 490, *(emoji * 250 + c + emoji * 249 for c in escaped)]
    tasks = await _tasks(db, org := await api.org(), titles * 2)
    fmt = Snapshot(uid(org.id), "Acme")
    wide = await _read(db, org.id, fmt, 2, UNBOUNDED)
    monkeypatch.setattr(snapshot, "WIDE_ROW_BYTES", UNBOUNDED)  # every page read as text, encoded by msgspec
    plain = await _read(db, org.id, fmt, 2, UNBOUNDED)
    data = b"".join(bytes(b.data) for b in wide)
    assert data == b"".join(bytes(b.data) for b in plain)
    assert [b.rows for b in wide if b.rows] == [b.rows for b in plain if b.rows]
    document = msgspec.json.decode(fmt.header(dt.datetime.now(dt.UTC)) + data + fmt.footer())
    assert [f"{t['id']}\t{t['title']}" for t in document["tasks"]] == tasks


async def test_the_read_connection_is_closed_after_the_export(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, [WIDE] * 20)
    export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
    detached: list[int] = []

    def on_detach(dbapi_connection: Any, record: Any) -> None:
        detached.append(dbapi_connection.driver_connection.info.backend_pid)

    pool = db.engine.sync_engine.pool
    event.listen(pool, "detach", on_detach)
    try:
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    finally:
        event.remove(pool, "detach", on_detach)
    assert len(detached) == 1

    async def gone() -> bool:
        # That backend ends (it is not idle in the pool): its buffers go with it.
        async with UnitOfWork(db.sessionmaker) as uow:
            alive = await uow.session.scalar(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": detached[0]}
            )
        return alive == 0

    assert await wait_for(gone, "the read's backend to end")
