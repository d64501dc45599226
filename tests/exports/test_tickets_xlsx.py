"""Excel workbooks (SPEC §20): built by the real worker, read back with openpyxl and compared value by value with
the CSV export of the same filters; texts exactly as the tickets have them, never formulas; numbers numeric; dates
date-times; the header frozen; a customer's workbook holds only their tickets; the row limits."""

from __future__ import annotations

import datetime as dt
import io
import re
import xml.etree.ElementTree as ET
import zipfile
from decimal import Decimal
from typing import Any

import openpyxl
import psycopg
import pytest
from openpyxl.worksheet.worksheet import Worksheet

from space.config import Settings
from space.db import Database
from space.exports.failures import ExportFailure
from space.exports.formats.tickets_xlsx import MEDIA_TYPE, SHARED_STRINGS, SHEET, SHEET_ROWS, check_sheet_rows
from space.exports.pipeline import run_export
from tests.exports.fixtures import (
    Gate,
    add_tickets,
    background,
    chunk_count,
    completed_export,
    create_export,
    download,
    job_row,
    parse_csv,
    runner,
    tuned,
    uid,
)
from tests.helpers import Api, Org, assert_problem

HEADER = ["number", "title", "status", "priority", "assignee", "createdAt", "updatedAt"]
TRICKY = [
    "=1+1",
    "@SUM(A1)",
    "+cmd",
    "-2",
    "\uff1d1",
    "Line one\nline two",
    'Quote "inside", comma, and\r\nCRLF',
    "\tTabbed start",
    "  spaces around  ",
    "Four bytes \U0001f600\U00010348 and <b>&amp;</b> ]]>",
    "\u00a0=1+1 after a no-break space",
]
BOSS = '=Boss & <Co> "the" \U0001f451'
# What XML 1.0 can't carry, and text that looks like Excel's escape for it (docs/decisions 0093).
ESCAPED = ["bell \x07 and unit separator \x1f", "not an escape: _x0041_ and _x005F_x0042_", "noncharacter \uffff"]
_XSTRING = re.compile("_x([0-9A-Fa-f]{4})_")


def _xstring(value: str) -> str:
    """ECMA-376's ST_Xstring escapes decoded, as Excel and LibreOffice read them (openpyxl leaves them)."""
    return _XSTRING.sub(lambda m: chr(int(m.group(1), 16)), value)


async def _workbook(api: Api, db: Database, settings: Settings, org: Org, body: dict[str, Any]) -> bytes:
    export_id = await completed_export(api, db, settings, org, body)
    r = await download(api, org, org.owner, export_id)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == MEDIA_TYPE
    assert r.headers["content-disposition"] == f'attachment; filename="space-export-{export_id}.xlsx"'
    return r.content


def _sheet(data: bytes) -> Worksheet:
    book = openpyxl.load_workbook(io.BytesIO(data))
    assert book.sheetnames == ["Tickets"]
    sheet = book["Tickets"]
    assert isinstance(sheet, Worksheet)
    return sheet


def _rfc3339(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).replace(tzinfo=None)


async def test_the_workbook_equals_the_csv_of_the_same_filters_value_by_value(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    org = await api.org()
    boss = org.memberships["admin"]
    owner.execute("UPDATE users SET name = %s WHERE id = %s", (BOSS, org.admin.id))
    titles = dict(
        zip(await add_tickets(db, org.id, org.member, TRICKY, priority="high", assignee_id=boss), TRICKY, strict=True)
    )
    unassigned = await add_tickets(db, org.id, org.customer, ["nobody's", "=also nobody's"], priority="high")
    titles.update(zip(unassigned, ["nobody's", "=also nobody's"], strict=True))
    await add_tickets(db, org.id, org.member, ["=filtered out"], priority="low")
    filters = {"priority": "high"}

    csv = parse_csv(await _workbook_csv(api, db, settings, org, filters))
    sheet = _sheet(await _workbook(api, db, settings, org, {"kind": "tickets_xlsx", "filters": filters}))

    assert sheet.freeze_panes == "A2"
    rows = list(sheet.iter_rows())
    assert [c.value for c in rows[0]] == HEADER == csv[0]
    assert len(rows) == len(csv) == len(titles) + 1
    for cells, record in zip(rows[1:], csv[1:], strict=True):
        assert all(c.data_type != "f" for c in cells), [c.value for c in cells]
        number, title, status, priority, assignee, created, updated = (c.value for c in cells)
        assert cells[0].data_type == "n" and isinstance(number, int) and number == int(record[0])
        # The ticket's own text, not the CSV's guarded one (which differs only by its leading quote).
        assert title == titles[number], (title, titles[number])
        assert record[1] in (title, "'" + title)
        assert (status, priority) == (record[2], record[3]) == ("open", "high")
        if number in unassigned:
            assert assignee is None and record[4] == ""
        else:
            assert cells[4].data_type == "s" and assignee == BOSS and record[4] == "'" + BOSS
        for cell, value, text in ((cells[5], created, record[5]), (cells[6], updated, record[6])):
            assert cell.is_date and isinstance(value, dt.datetime)
            assert "yyyy-mm-dd hh:mm:ss" in cell.number_format
            # Excel keeps milliseconds; openpyxl rounds the serial to them.
            assert abs(value - _rfc3339(text)) <= dt.timedelta(microseconds=500), (value, text)


async def _workbook_csv(api: Api, db: Database, settings: Settings, org: Org, filters: dict[str, Any]) -> bytes:
    export_id = await completed_export(api, db, settings, org, {"kind": "tickets_csv", "filters": filters})
    r = await download(api, org, org.owner, export_id)
    assert r.status_code == 200, r.text
    return r.content


async def test_text_xml_cannot_carry_is_escaped_as_excel_does(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, ESCAPED)
    data = await _workbook(api, db, settings, org, {"kind": "tickets_xlsx"})
    # Every part is well-formed XML 1.0 (a raw control character would make the sheet unreadable).
    with zipfile.ZipFile(io.BytesIO(data)) as book:
        for name in book.namelist():
            ET.fromstring(book.read(name))
        sheet_xml = book.read(SHEET).decode()
    assert "_x0007_" in sheet_xml and "_x001F_" in sheet_xml and "_xFFFF_" in sheet_xml
    assert "_x005F_x0041_" in sheet_xml and "_x005F_x005F_x0042_" in sheet_xml
    titles = [row[1] for row in _sheet(data).iter_rows(min_row=2, values_only=True)]
    assert [_xstring(str(t)) for t in titles] == ESCAPED


async def test_the_workbook_is_a_zip_without_zip64_and_opens_when_empty(
    api: Api, db: Database, settings: Settings
) -> None:
    org = await api.org()
    data = await _workbook(api, db, settings, org, {"kind": "tickets_xlsx", "filters": {"status": "closed"}})
    with zipfile.ZipFile(io.BytesIO(data)) as book:
        assert book.testzip() is None
        assert book.namelist()[0] == "[Content_Types].xml" and SHEET in book.namelist()
        for info in book.infolist():
            # Excel refuses ZIP64 fields on parts that don't need them.
            assert (info.extract_version, info.extra, info.compress_type) == (20, b"", zipfile.ZIP_DEFLATED)
    rows = list(_sheet(data).iter_rows(values_only=True))
    assert rows == [tuple(HEADER)]


async def test_a_customers_workbook_holds_only_their_own_tickets(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    mine = await add_tickets(db, org.id, org.customer, ["mine 1", "=mine 2"])
    await add_tickets(db, org.id, org.customer2, ["theirs 1", "theirs 2"])
    await add_tickets(db, org.id, org.member, ["staff's"])
    export = await create_export(api, org, org.customer, {"kind": "tickets_xlsx", "filters": {"status": "open"}})
    assert export["scope"] == "own"
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.customer, export["id"])
    assert r.status_code == 200, r.text
    rows = list(_sheet(r.content).iter_rows(min_row=2, values_only=True))
    assert [(row[0], row[1]) for row in rows] == list(zip(mine, ["mine 1", "=mine 2"], strict=True))
    assert (await job_row(db, org.id, export["id"])).row_count == 2


async def test_over_the_row_limit_fails_too_many_rows(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(6)])
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx"})
    outcome = await run_export(runner(tuned(settings, export_row_limit=5), db), uid(export["id"]), uid(org.id))
    assert outcome == "too_many_rows"
    job = await job_row(db, org.id, export["id"])
    assert (job.state, job.error_code, job.row_count) == ("failed", "too_many_rows", None)
    assert await chunk_count(db, org.id, export["id"]) == 0
    # At the limit: a whole sheet, never a truncated one.
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx"})
    assert await run_export(runner(tuned(settings, export_row_limit=6), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    r = await download(api, org, org.member, export["id"])
    assert [row[1] for row in _sheet(r.content).iter_rows(min_row=2, values_only=True)] == [f"t{i}" for i in range(6)]


@pytest.mark.parametrize(
    ("limit", "rows", "fails"),
    [
        (1_000_000, 1_000_000, False),
        (1_000_000, 1_000_001, True),
        (2_000_000, SHEET_ROWS, False),
        (2_000_000, SHEET_ROWS + 1, True),
    ],
)
def test_the_limit_is_the_row_limit_or_a_worksheets_rows_whichever_is_lower(limit: int, rows: int, fails: bool) -> None:
    # What the worker checks after counting: its row limit, then the format's worksheet cap.
    failed = rows > limit
    try:
        check_sheet_rows(rows)
    except ExportFailure as failure:
        assert failure.code == "too_many_rows"
        failed = True
    assert failed is fails is (rows > min(limit, SHEET_ROWS))
    assert SHEET_ROWS == 1_048_575


async def test_the_request_takes_filters_only(api: Api) -> None:
    org = await api.org()
    r = await api.call("POST", org.path("/exports"), org.member, json={"kind": "tickets_xlsx", "delimiter": ";"})
    assert "delimiter" in assert_problem(r, 400, "invalid_request")["detail"]
    r = await api.call(
        "POST", org.path("/exports"), org.member, json={"kind": "tickets_xlsx", "filters": {"q": "x" * 201}}
    )
    assert_problem(r, 400, "invalid_request")


async def test_wide_rows_in_many_batches_read_back_whole(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    # 2,000-byte titles: batches far above the size deflated in the event loop, so the thread deflates them.
    titles = [chr(0x1F300 + i) * 500 for i in range(300)]
    await add_tickets(db, org.id, org.member, titles)
    small = tuned(settings, export_batch_bytes=256 * 1024)
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx"})
    assert await run_export(runner(small, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.member, export["id"])
    assert [row[1] for row in _sheet(r.content).iter_rows(min_row=2, values_only=True)] == titles


async def test_every_row_names_its_number_across_batches(api: Api, db: Database, settings: Settings) -> None:
    # Readers such as ClosedXML and EPPlus place rows by their `r`: each row's is its row in the sheet, the
    # header's 1, counted on across keyset batches (7 rows each here), in a filtered export too.
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(40)])
    await add_tickets(db, org.id, org.member, [f"closed {i}" for i in range(5)], status="closed")
    await add_tickets(db, org.id, org.member, [f"u{i}" for i in range(10)])
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx", "filters": {"status": "open"}})
    assert await run_export(runner(tuned(settings, export_batch_rows=7), db), uid(export["id"]), uid(org.id)) == (
        "completed"
    )
    r = await download(api, org, org.member, export["id"])
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        sheet = z.read(SHEET).decode()
    assert re.findall(r"<row( r=\"[0-9]+\")?>", sheet) == [f' r="{n}"' for n in range(1, 52)]
    rows = list(_sheet(r.content).iter_rows(values_only=True))
    assert [row[1] for row in rows[1:]] == [f"t{i}" for i in range(40)] + [f"u{i}" for i in range(10)]


async def test_a_workbooks_chunks_are_a_quarter_of_the_chunk_setting(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any]
) -> None:
    # Its bytes are deflated already (docs/decisions 0097): chunks of a quarter of SPACE_EXPORT_CHUNK_BYTES hold
    # about the stored bytes of a CSV's packed chunk, and cost the worker a quarter of the memory.
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"ticket {i} {i * 7919 % 10007}" for i in range(600)])
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx"})
    small = tuned(settings, export_chunk_bytes=8192, export_batch_rows=50)
    assert await run_export(runner(small, db), uid(export["id"]), uid(org.id)) == "completed"
    sizes = [
        n
        for (n,) in owner.execute(
            "SELECT coalesce(c.raw_size, length(c.data)) FROM export_chunks c JOIN export_jobs j"
            " ON j.id = c.export_id AND j.execution_id = c.execution_id WHERE j.id = %s ORDER BY c.seq",
            (export["id"],),
        )
    ]
    assert len(sizes) > 2 and set(sizes[:-1]) == {2048} and 0 < sizes[-1] <= 2048, sizes
    r = await download(api, org, org.member, export["id"])
    assert r.content[:2] == b"PK" and len(r.content) == sum(sizes)
    assert len(list(_sheet(r.content).iter_rows(min_row=2))) == 600
    # Ranges find their chunks at that size too.
    part = await api.call(
        "GET", org.path(f"/exports/{export['id']}/result"), org.member, headers={"Range": "bytes=3000-5000"}
    )
    assert part.status_code == 206 and part.content == r.content[3000:5001]


async def test_a_workbook_cancelled_midway_stores_nothing(api: Api, db: Database, settings: Settings) -> None:
    org = await api.org()
    await add_tickets(db, org.id, org.member, [f"t{i}" for i in range(5)])
    export = await create_export(api, org, org.member, {"kind": "tickets_xlsx"})
    gate = Gate({"batch"})
    run = run_export(runner(tuned(settings, export_batch_rows=1), db), uid(export["id"]), uid(org.id), gate=gate)
    async with background(run, gate) as worker:
        await gate.reached("batch")
        r = await api.call("DELETE", org.path(f"/exports/{export['id']}"), org.member)
        assert r.status_code == 204, r.text
        gate.open_all()
        assert await worker == "lease_lost"
    assert (await job_row(db, org.id, export["id"])).state == "cancelled"
    assert await chunk_count(db, org.id, export["id"]) == 0
    # The next workbook of the org is whole.
    again = await _workbook(api, db, settings, org, {"kind": "tickets_xlsx"})
    assert len(list(_sheet(again).iter_rows(min_row=2))) == 5


def _serial(moment: dt.datetime) -> str:
    """Excel's serial number of a UTC moment: days since 1899-12-30, twelve decimals, computed exactly."""
    micros = (moment - dt.datetime(1899, 12, 30)) // dt.timedelta(microseconds=1)
    return str((Decimal(micros) / Decimal(86_400_000_000)).quantize(Decimal("1e-12")))


def test_stored_rows_name_the_writers_shared_strings_and_need_no_search_path(owner: psycopg.Connection[Any]) -> None:
    # What pg_restore does when it recomputes the generated columns: an empty search_path.
    owner.execute("SET search_path = ''")
    for word in SHARED_STRINGS[len(HEADER) :]:
        row = owner.execute("SELECT public.space_xlsx_word(%s)", (word,)).fetchone()
        assert row == (f'<c t="s"><v>{SHARED_STRINGS.index(word)}</v></c>',), word
    row = owner.execute(
        "SELECT public.space_xlsx_head(7, ' =1+1 & <b>', 'open', 'maybe'),"
        " public.space_xlsx_tail('1899-12-31 12:00:00+00', '2026-01-02 03:04:05.123456+00')"
    ).fetchone()
    assert row == (
        '<row><c><v>7</v></c><c t="inlineStr"><is><t xml:space="preserve"> =1+1 &amp; &lt;b&gt;</t></is></c>'
        '<c t="s"><v>7</v></c><c t="inlineStr"><is><t>maybe</t></is></c>',
        '<c s="1"><v>1.500000000000</v></c>'
        f'<c s="1"><v>{_serial(dt.datetime(2026, 1, 2, 3, 4, 5, 123456))}</v></c></row>',
    )
