"""The `tickets_xlsx` kind (SPEC §20): the tickets of a `tickets_csv` export, as an Excel workbook.

The same rows, order, scope and filters as the CSV: `TicketsXlsx` is `TicketsCsv` with another line per row. Each
row is `xlsx_head || assignee cell || xlsx_tail`, XML that PostgreSQL computed when the ticket was written
(migration 0019), so the database's part costs what the CSV's does; the assignee cells (inline strings of the
members' names) are looked up per export, as the CSV's are. The query numbers the rows (`<row r="n">`, which
ClosedXML and EPPlus need); cells carry no `r` (docs/decisions 0097).

The workbook is one ZIP (Python's `zipfile`, streaming to a sink it cannot seek: each member is followed by a
data descriptor, never ZIP64, which Excel refuses on small parts): the package's small parts first, then the sheet,
deflated as its batches arrive. Deflating runs in a thread (zlib lets go of the GIL) while the next batch is
being read on the snapshot's backend, so the two share the machine's cores instead of taking turns. Memory is
one batch in flight and one being compressed, and the result's chunks are a quarter of the usual size
(`CHUNK_SHARE`). See docs/decisions 0093 and 0097.

Cells: `number` a number; every text exactly as the ticket has it (never a formula, never a guard prefix): the
header's names and the statuses and priorities from a fixed table of shared strings, titles and names inline;
`createdAt`/`updatedAt` serial numbers in UTC with the date-time format of style 1. The header row is frozen and
filtered.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import uuid
import zipfile
from collections.abc import AsyncGenerator, AsyncIterator
from typing import IO, Any, cast
from xml.sax.saxutils import escape

import msgspec
from sqlalchemy import ColumnElement, Text, bindparam, column, func, literal, literal_column, select, table
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from space.exports.failures import ExportFailure
from space.exports.formats.base import BATCH_BYTES, Batch, ExportRequest, Order, bigint_param
from space.exports.formats.tickets_csv import CSV_HEADER, TicketsCsv
from space.exports.increments import Since
from space.exports.models import ExportScope
from space.orgs.models import Membership
from space.tickets.filters import TicketFilters, parse_filters
from space.tickets.models import Ticket

MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
SHEET_ROWS = 1_048_575
"""Data rows a worksheet holds below its header (Excel's 1,048,576 rows in all)."""
SHEET_BYTES = zipfile.ZIP64_LIMIT
"""The sheet's XML at most, in bytes: a part this large would need ZIP64 (past it the export fails `too_large`)."""
DEFLATE_LEVEL = 1
"""zlib's fastest level: the sheet's XML is repetitive, level 1 already makes it many times smaller (19x on the
bench's tickets), at about four times level 6's speed."""
CHUNK_SHARE = 0.25
"""The workbook's result chunks are a quarter of SPACE_EXPORT_CHUNK_BYTES (1 MiB by default): its bytes are
deflated already, and a CSV's chunk packs about 4:1 (lz4), so each stored row holds about what a CSV's does; and
the worker's two chunk buffers and the chunk in flight cost a quarter as much, which kept the memory of a small
workbook (that fills no chunk) and a large one within 10% (docs/decisions 0097)."""
_INLINE_BYTES = 64 * 1024
"""Smaller pieces are deflated in the event loop; larger ones in a thread."""

SHEET = "xl/worksheets/sheet1.xml"
_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PKG_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
_XML = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
_WIDTHS = (10, 60, 12, 12, 28, 24, 24)
"""Column widths, in characters of the default font."""
SHARED_STRINGS = (*CSV_HEADER, "open", "pending", "solved", "closed", "low", "normal", "high", "urgent")
"""The workbook's shared strings: the header's names, then every status and priority, at the indexes the stored
rows name (migration 0019, space_xlsx_word)."""
_DATE_FORMAT = "yyyy-mm-dd hh:mm:ss.000"
"""Style 1 (the stored date cells name it): a date-time to the millisecond, Excel's own precision."""

# The users' display names (the auth domain's User maps them; the export reads only this column).
_users = table("users", column("id"), column("name", Text))
# The stored row text of migration 0019, named on the page's own `tickets` (the Ticket model doesn't map it: an
# INSERT would return it, and it would name columns a database before 0019 lacks).
_XLSX_HEAD = literal_column("tickets.xlsx_head", Text)
_XLSX_TAIL = literal_column("tickets.xlsx_tail", Text)


class TicketsXlsxRequest(ExportRequest, tag="tickets_xlsx"):
    """`{"kind": "tickets_xlsx", "filters": {...}}`: tickets matching the filters, as a workbook."""

    filters: TicketFilters = msgspec.field(default_factory=TicketFilters)

    def ledger_filters(self) -> dict[str, Any]:
        """The filters as the export's row keeps them (the worker parses them back)."""
        filters: dict[str, Any] = msgspec.to_builtins(self.filters)
        return filters


async def open_tickets_xlsx(session: AsyncSession, order: Order, membership_id: uuid.UUID) -> TicketsXlsx:
    """The export's workbook, from its stored filters; `membership_id` is the creator's (for `assignment=mine`)."""
    creator = order.creator_id if order.scope is ExportScope.own else None
    return TicketsXlsx(
        order.org_id, parse_filters(order.filters), membership_id, ",", creator, getattr(order, "since", None)
    )


def check_sheet_rows(total: int) -> None:
    """Fail `too_many_rows` when the rows don't fit one worksheet (the row limit applies as well: together,
    min(SPACE_EXPORT_ROW_LIMIT, 1,048,575))."""
    if total > SHEET_ROWS:
        raise ExportFailure("too_many_rows", f"{total} rows exceed a worksheet's {SHEET_ROWS}.")


class TicketsXlsx(TicketsCsv):
    """SPEC §20's workbook, read like the tickets CSV (its filters, scope, keyset batches) and zipped as it goes."""

    def __init__(
        self,
        org_id: uuid.UUID,
        filters: TicketFilters,
        membership_id: uuid.UUID | None,
        delimiter: str = ",",
        creator_id: uuid.UUID | None = None,
        since: Since | None = None,
    ) -> None:
        super().__init__(org_id, filters, membership_id, ",", creator_id, since)
        self.rows = 0
        self.snapshot_at: dt.datetime | None = None

    async def count(self, session: AsyncSession) -> dict[str, int]:
        """Matching tickets, the rows of the one sheet; more than a worksheet holds fails `too_many_rows`."""
        total = sum((await super().count(session)).values())
        check_sheet_rows(total)
        self.rows = total
        return {"Tickets": total}

    def header(self, snapshot_at: dt.datetime) -> bytes:
        """Nothing: the ZIP begins with its first part. Keeps the moment the snapshot stands for."""
        self.snapshot_at = snapshot_at
        return b""

    async def _assignee_cells(self, session: AsyncSession) -> str:
        # membership id -> the assignee's name as a finished inline-string cell (see TicketsCsv).
        cells = (
            select(func.jsonb_object_agg(sql_cast(Membership.id, Text), func.space_xlsx_cell(_users.c.name)))
            .select_from(Membership)
            .join(_users, _users.c.id == Membership.user_id)
            .where(Membership.org_id == self.org_id)
        )
        return str(await session.scalar(select(func.coalesce(cells.scalar_subquery(), literal({}, JSONB)).cast(Text))))

    def _batch_params(self, done: int) -> dict[str, int]:
        # The sheet's rows before the batch: the header and the `done` rows written.
        return {"before": done + 1}

    def _line(self) -> ColumnElement[str]:
        cells = select(sql_cast(bindparam("cells", type_=Text), JSONB)).scalar_subquery()
        # An unassigned ticket's cell is empty (no value), so the cells after it keep their columns.
        assignee = func.coalesce(cells.op("->>", return_type=Text)(sql_cast(Ticket.assignee_id, Text)), "<c/>")
        # `<row r="n"`, then the stored head after its `<row`: the row's number is where it lands in this sheet,
        # so the query writes it (the page's rows in `number` order, counted after the rows of earlier batches).
        # ltrim of the letters of `<row` stops at its `>`: it reads only those, where substr() would count the
        # characters of the whole head (a third of the database's cost of the workbook, measured: 0097).
        n = bigint_param("before") + func.row_number().over(order_by=Ticket.number)
        row = literal_column("'<row r=\"'", Text).op("||")(sql_cast(n, Text)).op("||")(literal_column("'\"'", Text))
        head = func.ltrim(_XLSX_HEAD, literal_column("'<row'", Text))
        return row.op("||")(head).op("||")(assignee).op("||")(_XLSX_TAIL)

    async def batches(self, session: AsyncSession, size: int, budget: int = BATCH_BYTES) -> AsyncIterator[Batch]:
        """The workbook's ZIP bytes as they are made: the small parts, then the sheet, deflated batch by batch
        (each read as the CSV's, at most `size` rows and about `budget` bytes of XML)."""
        assert self.snapshot_at is not None, "header() gives the snapshot's moment first"
        sink = _Sink()
        book = zipfile.ZipFile(cast(IO[bytes], sink), "w", zipfile.ZIP_DEFLATED, compresslevel=DEFLATE_LEVEL)
        for name, part in self._parts(self.snapshot_at):
            book.writestr(name, part)
        sheet = book.open(SHEET, "w")
        closed = False
        deflating: asyncio.Future[None] | None = None
        try:
            start = self._sheet_start()
            end = self._sheet_end()
            written = len(start) + len(end)
            sheet.write(start)
            yield Batch(rows=0, last=None, data=sink.take())
            source = super().batches(session, size, budget)
            async with contextlib.aclosing(_read_ahead(source)) as rows:
                async for batch in rows:
                    written += len(batch.data)
                    if written > SHEET_BYTES:
                        raise ExportFailure("too_large", f"The worksheet's XML exceeds {SHEET_BYTES} bytes.")
                    if len(batch.data) < _INLINE_BYTES:
                        sheet.write(batch.data)
                    else:
                        deflating = asyncio.ensure_future(asyncio.to_thread(_write, sheet, batch.data))
                        await asyncio.shield(deflating)
                    yield Batch(rows=batch.rows, last=batch.last, data=sink.take())
            sheet.write(end)
            sheet.close()
            book.close()
            closed = True
            yield Batch(rows=0, last=None, data=sink.take())
        finally:
            if not closed:
                # Stopped midway: a thread still deflating finishes first (it can't be stopped, and the ZIP's
                # writer is not shared between threads); then the ZIP ends into the sink, which is dropped.
                if deflating is not None and not deflating.done():
                    await asyncio.wait([deflating])
                with contextlib.suppress(Exception):
                    sheet.close()
                    book.close()

    def footer(self) -> bytes:
        """Nothing: the ZIP's central directory is the last of its batches."""
        return b""

    def _parts(self, snapshot_at: dt.datetime) -> list[tuple[str, str]]:
        created = snapshot_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return [
            ("[Content_Types].xml", _CONTENT_TYPES),
            ("_rels/.rels", _ROOT_RELS),
            ("docProps/core.xml", _CORE.format(created=created)),
            ("xl/workbook.xml", _WORKBOOK.format(last=self.rows + 1)),
            ("xl/_rels/workbook.xml.rels", _WORKBOOK_RELS),
            ("xl/styles.xml", _STYLES),
            ("xl/sharedStrings.xml", _SHARED),
        ]

    def _sheet_start(self) -> bytes:
        cols = "".join(
            f'<col min="{i}" max="{i}" width="{w}" customWidth="1"/>' for i, w in enumerate(_WIDTHS, start=1)
        )
        head = "".join(f'<c t="s" s="2"><v>{i}</v></c>' for i in range(len(CSV_HEADER)))
        return (
            f'{_XML}<worksheet xmlns="{_MAIN}" xmlns:r="{_REL}"><dimension ref="A1:G{self.rows + 1}"/>'
            '<sheetViews><sheetView tabSelected="1" workbookViewId="0">'
            '<pane ySplit="1" topLeftCell="A2" activePane="bottomLeft" state="frozen"/>'
            '<selection pane="bottomLeft" activeCell="A2" sqref="A2"/></sheetView></sheetViews>'
            f'<sheetFormatPr defaultRowHeight="15"/><cols>{cols}</cols><sheetData><row r="1">{head}</row>'
        ).encode()

    def _sheet_end(self) -> bytes:
        return f'</sheetData><autoFilter ref="A1:G{self.rows + 1}"/></worksheet>'.encode()


def _write(sheet: IO[bytes], data: bytes | bytearray | memoryview) -> None:
    sheet.write(data)


async def _read_ahead(source: AsyncIterator[Batch]) -> AsyncGenerator[Batch]:
    """`source`'s batches, the next one already being read while the caller deflates the current one."""
    ahead: asyncio.Future[Batch | None] = asyncio.ensure_future(anext(source, None))
    try:
        while (batch := await ahead) is not None:
            ahead = asyncio.ensure_future(anext(source, None))
            yield batch
    finally:
        if not ahead.done():
            ahead.cancel()
        with contextlib.suppress(BaseException):
            await ahead
        # Nothing may read on the snapshot's connection once the reader is gone.
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class _Sink:
    """Where the ZIP writes: the bytes since the last `take`. It can't seek, so members get data descriptors."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._pieces.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        return None

    def take(self) -> bytes:
        data = b"".join(self._pieces)
        self._pieces.clear()
        return data


_CONTENT_TYPES = (
    f'{_XML}<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/xl/workbook.xml"'
    ' ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
    '<Override PartName="/xl/worksheets/sheet1.xml"'
    ' ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
    '<Override PartName="/xl/styles.xml"'
    ' ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>'
    '<Override PartName="/xl/sharedStrings.xml"'
    ' ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
    '<Override PartName="/docProps/core.xml" ContentType="application/vnd.openxmlformats-package.core-properties+xml"/>'
    "</Types>"
)
_ROOT_RELS = (
    f'{_XML}<Relationships xmlns="{_PKG_REL}">'
    f'<Relationship Id="rId1" Type="{_REL}/officeDocument" Target="xl/workbook.xml"/>'
    '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/package/2006/relationships/metadata/'
    'core-properties" Target="docProps/core.xml"/>'
    "</Relationships>"
)
_CORE = (
    f"{_XML}"
    '<cp:coreProperties xmlns:cp="http://schemas.openxmlformats.org/package/2006/metadata/core-properties"'
    ' xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:dcterms="http://purl.org/dc/terms/"'
    ' xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
    "<dc:title>Space tickets</dc:title><dc:creator>Space</dc:creator>"
    '<dcterms:created xsi:type="dcterms:W3CDTF">{created}</dcterms:created>'
    "</cp:coreProperties>"
)
_WORKBOOK = (
    f'{_XML}<workbook xmlns="{_MAIN}" xmlns:r="{_REL}"><bookViews><workbookView/></bookViews>'
    '<sheets><sheet name="Tickets" sheetId="1" r:id="rId1"/></sheets>'
    '<definedNames><definedName name="_xlnm._FilterDatabase" localSheetId="0" hidden="1">'
    "Tickets!$A$1:$G${last}</definedName></definedNames></workbook>"
)
_WORKBOOK_RELS = (
    f'{_XML}<Relationships xmlns="{_PKG_REL}">'
    f'<Relationship Id="rId1" Type="{_REL}/worksheet" Target="worksheets/sheet1.xml"/>'
    f'<Relationship Id="rId2" Type="{_REL}/styles" Target="styles.xml"/>'
    f'<Relationship Id="rId3" Type="{_REL}/sharedStrings" Target="sharedStrings.xml"/>'
    "</Relationships>"
)
_SHARED = (
    f'{_XML}<sst xmlns="{_MAIN}" count="{len(SHARED_STRINGS)}" uniqueCount="{len(SHARED_STRINGS)}">'
    + "".join(f"<si><t>{escape(word)}</t></si>" for word in SHARED_STRINGS)
    + "</sst>"
)
# Cell styles: 0 plain, 1 date-time (the stored date cells name s="1"), 2 bold (the header).
_STYLES = (
    f'{_XML}<styleSheet xmlns="{_MAIN}">'
    f'<numFmts count="1"><numFmt numFmtId="164" formatCode="{_DATE_FORMAT}"/></numFmts>'
    '<fonts count="2"><font><sz val="11"/><name val="Calibri"/><family val="2"/></font>'
    '<font><b/><sz val="11"/><name val="Calibri"/><family val="2"/></font></fonts>'
    '<fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill patternType="gray125"/></fill>'
    "</fills>"
    '<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>'
    '<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>'
    '<cellXfs count="3"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0"/>'
    '<xf numFmtId="164" fontId="0" fillId="0" borderId="0" xfId="0" applyNumberFormat="1"/>'
    '<xf numFmtId="0" fontId="1" fillId="0" borderId="0" xfId="0" applyFont="1"/></cellXfs>'
    '<cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/></cellStyles>'
    "</styleSheet>"
)
