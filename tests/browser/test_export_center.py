"""The export center through a real browser, by clicks and typing only (SPEC §17), on the API as it is now.

Scenarios over download links (§10), oversight (§12) and the archive (§13) are in test_links_oversight_archive.py.
"""

from __future__ import annotations

import datetime as dt
import io
import re
from typing import Any

import openpyxl
import psycopg
import pytest
from playwright.async_api import Page, expect

from space.db import Database
from tests.browser.conftest import OpenPage, go_to, my_exports, sign_in
from tests.exports.fixtures import add_tickets, insert_export
from tests.helpers import Api, Org

pytestmark = pytest.mark.slow


async def _seed_tickets(db: Database, org: Org) -> None:
    """Tickets of which exactly two match status open, priority high and the text "printer"."""
    await add_tickets(db, org.id, org.member, ["Printer jams", "printer on fire"], status="open", priority="high")
    await add_tickets(db, org.id, org.member, ["Printer, low"], status="open", priority="low")
    await add_tickets(db, org.id, org.member, ["Printer, closed"], status="closed", priority="high")
    await add_tickets(db, org.id, org.member, ["Scanner"], status="open", priority="high")


async def _layout_shift(page: Page) -> float:
    """Cumulative layout shift not caused by input since the page loaded (conftest's observer of Chromium's entries)."""
    value: float = await page.evaluate("window.__layoutShift")
    return value


async def test_member_requests_a_filtered_csv_and_watches_it_complete(
    api: Api, db: Database, open_page: OpenPage, worker: None
) -> None:
    org = await api.org("Printers Ltd")
    await _seed_tickets(db, org)
    page = await open_page("member")
    await sign_in(page, org.member)
    await expect(page.get_by_text("You are a member of Printers Ltd.")).to_be_visible()

    await page.get_by_label("Tickets (CSV)").check()
    await page.get_by_label("Status").select_option(label="Open")
    await page.get_by_label("Priority").select_option(label="High")
    await page.get_by_label("Text in title or body").fill("printer")
    await page.get_by_label("Column separator").select_option(label="Semicolon (;)")
    await page.get_by_role("button", name="Request export").click()
    await expect(page.get_by_role("status").filter(has_text="Export requested")).to_be_visible()

    item = my_exports(page).filter(has_text='status open, priority high, text "printer"')
    await expect(item).to_be_visible()
    # From here on the row only updates (progress, then the result's facts): nothing on the page may move.
    await page.evaluate("window.__layoutShift = 0")
    await expect(item.get_by_text("Ready to download")).to_be_visible()
    await expect(item.get_by_text("100 %")).to_be_visible()
    await expect(item.get_by_role("progressbar")).to_have_attribute("value", "100")
    await expect(item.get_by_text("Data as of")).to_be_visible()
    await expect(item.get_by_text(re.compile(r"^Expires in (24 h|23 h 59 min)$"))).to_be_visible()
    await expect(item.get_by_text("2 rows,")).to_be_visible()
    await expect(item.get_by_role("button", name="Download")).to_be_visible()
    await expect(item.get_by_role("button", name="Cancel")).to_be_hidden()

    # What the page asked for is what the API stored, and what it shows is the export's own numbers.
    (export,) = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert export["filters"] == {"status": "open", "priority": "high", "q": "printer"}
    assert export["state"] == "completed" and export["rowCount"] == 2
    await expect(item.get_by_text(f"2 rows, {export['byteSize']} bytes")).to_be_visible()
    # Progress updates and the completion moved nothing on the page.
    assert await _layout_shift(page) < 0.01


async def test_customer_requests_an_excel_workbook_of_their_tickets(
    api: Api, db: Database, open_page: OpenPage, worker: None
) -> None:
    org = await api.org("Workbooks Inc")
    await add_tickets(db, org.id, org.customer, ["=1+1 my printer", "my scanner"])
    page = await open_page("customer-xlsx")
    await sign_in(page, org.customer)
    await page.get_by_label("Tickets (Excel workbook)").check()
    # A workbook's cells are cells: no column separator to choose, the filters as for the CSV.
    await expect(page.get_by_label("Column separator")).to_be_hidden()
    await page.get_by_label("Text in title or body").fill("printer")
    await page.get_by_role("button", name="Request export").click()
    item = my_exports(page).filter(has_text='Tickets (Excel workbook): text "printer"')
    await expect(item.get_by_text("Ready to download")).to_be_visible()

    (export,) = (await api.call("GET", org.path("/exports"), org.customer)).json()["items"]
    assert export["kind"] == "tickets_xlsx" and export["filters"] == {"q": "printer"} and export["rowCount"] == 1
    body = (await api.call("GET", org.path(f"/exports/{export['id']}/result"), org.customer)).content
    sheet = openpyxl.load_workbook(io.BytesIO(body), read_only=True)["Tickets"]
    titles = [row[1] for row in sheet.iter_rows(min_row=2, values_only=True)]
    assert titles == ["=1+1 my printer"]


async def test_customer_never_sees_snapshot_or_archive(api: Api, db: Database, open_page: OpenPage) -> None:
    org = await api.org("Helpdesk Co")
    await add_tickets(db, org.id, org.customer, ["My question"])
    page = await open_page("customer")
    await sign_in(page, org.customer)
    await expect(page.get_by_text("You are a customer of Helpdesk Co.")).to_be_visible()

    await expect(page.get_by_label("Tickets (CSV)")).to_be_checked()
    await expect(page.get_by_label("Snapshot: projects and tasks (JSON)")).to_be_hidden()
    await expect(page.get_by_label("Complete archive: everything (ZIP)")).to_be_hidden()
    # The tickets as a CSV or as an Excel workbook, nothing else (SPEC §20: everyone who may export tickets).
    await expect(page.get_by_role("radio")).to_have_count(2)
    await expect(page.get_by_label("Tickets (Excel workbook)")).to_be_visible()
    # No owner or admin tools either.
    await expect(page.get_by_role("region", name="Every export in this organization")).to_be_hidden()
    await expect(page.get_by_role("region", name="Audit trail")).to_be_hidden()
    await expect(page.get_by_role("button", name="Suspend organization")).to_be_hidden()

    await page.get_by_role("button", name="Request export").click()
    await expect(my_exports(page).filter(has_text="all tickets").get_by_text("Waiting to start")).to_be_visible()


async def test_member_cancels_a_queued_export_and_reads_it_in_words(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Queue Inc")
    page = await open_page("member")
    await sign_in(page, org.member)
    await page.get_by_label("Snapshot: projects and tasks (JSON)").check()
    await expect(page.get_by_role("group", name="Which tickets")).to_be_hidden()
    await page.get_by_role("button", name="Request export").click()
    item = my_exports(page).filter(has_text="Snapshot (JSON)")
    await expect(item.get_by_text("Waiting to start")).to_be_visible()
    await expect(item.get_by_text("0 %")).to_be_visible()

    await item.get_by_role("button", name="Cancel").click()
    await expect(item.get_by_text("Cancelled", exact=True)).to_be_visible()
    await expect(item.get_by_text("You cancelled this export.")).to_be_visible()
    await expect(item.get_by_role("button", name="Request a new one")).to_be_visible()
    (export,) = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert export["state"] == "cancelled" and export["errorCode"] == "cancelled"


async def test_expired_export_says_so_and_offers_a_new_one(api: Api, db: Database, open_page: OpenPage) -> None:
    org = await api.org("Old News")
    await insert_export(db, org.id, org.member.id, kind="snapshot", completed_ago=dt.timedelta(hours=25))
    page = await open_page("member")
    await sign_in(page, org.member)
    item = my_exports(page).filter(has_text="Snapshot (JSON)")
    await expect(item.get_by_text("Expired", exact=True)).to_be_visible()
    await expect(item.get_by_text("This export expired: its file can no longer be downloaded.")).to_be_visible()
    await expect(item.get_by_role("button", name="Download")).to_be_hidden()

    await item.get_by_role("button", name="Request a new one").click()
    await expect(my_exports(page)).to_have_count(2)
    await expect(my_exports(page).first.get_by_text("Waiting to start")).to_be_visible()
    items = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert [(x["kind"], x["state"]) for x in items] == [("snapshot", "queued"), ("snapshot", "completed")]


async def test_owner_suspends_reactivates_and_deletes_with_the_final_export_step(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Closing Down")
    # Phone width: everything readable without sideways scrolling.
    page = await open_page("owner", width=375, height=800)
    await sign_in(page, org.owner)
    await go_to(page, "Settings")
    banner = page.get_by_role("status").filter(has_text="This organization")

    await page.get_by_role("button", name="Suspend organization").click()
    await page.get_by_role("dialog").get_by_role("button", name="Suspend the organization").click()
    await expect(banner).to_contain_text("This organization is suspended")
    await page.get_by_role("button", name="Reactivate organization").click()
    await expect(banner).to_be_hidden()

    confirm = page.get_by_label("Type the organization's name to confirm deletion")
    await confirm.fill("Closing")
    await page.get_by_role("button", name="Request deletion").click()
    await expect(page.get_by_role("alert")).to_contain_text("type the organization's name exactly: Closing Down")

    await confirm.fill("Closing Down")
    await page.get_by_role("button", name="Request deletion").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the organization").click()
    await expect(page.get_by_role("alert")).to_contain_text("Take a complete export before deleting")
    await expect(page.get_by_role("button", name="Export everything first")).to_be_focused()
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"

    await page.get_by_role("button", name="Delete without a final export").click()
    await expect(banner).to_contain_text("This organization is being deleted")
    await go_to(page, "Your exports")
    await expect(page.get_by_role("button", name="Request export")).to_be_disabled()
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "deleting"
    assert await page.evaluate("document.documentElement.scrollWidth") <= 375

    await go_to(page, "Settings")
    await page.get_by_role("button", name="Cancel deletion").click()
    await expect(banner).to_be_hidden()
    await go_to(page, "Your exports")
    await expect(page.get_by_role("button", name="Request export")).to_be_enabled()
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"


async def test_token_lives_in_session_storage_only_and_sign_out_forgets_it(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Tokens R Us")
    page = await open_page("member")
    await page.get_by_label("API token").fill("spc_not-a-real-token")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert").filter(has_text="That token was not accepted")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0

    await sign_in(page, org.member)
    stored = await page.evaluate("({s: {...sessionStorage}, l: localStorage.length, c: document.cookie})")
    assert stored == {"s": {"space.token": org.member.token}, "l": 0, "c": ""}
    assert await page.context.cookies() == []
    assert org.member.token not in page.url
    # A reload in the same tab keeps the session.
    await page.reload()
    await expect(page.get_by_text(f"Signed in as {org.member.name}")).to_be_visible()

    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_label("API token")).to_be_visible()
    assert await page.evaluate("sessionStorage.length") == 0
    await page.reload()
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    await expect(page.get_by_text("Signed in as")).to_be_hidden()


async def test_keyboard_only_sign_in_and_request(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Keys Ltd")
    page = await open_page("member")
    # The token field has the focus when the page opens; Enter submits.
    await expect(page.get_by_label("API token")).to_be_focused()
    await page.keyboard.type(org.member.token)
    await page.keyboard.press("Enter")
    await expect(page.get_by_text(f"Signed in as {org.member.name}")).to_be_visible()

    button = page.get_by_role("button", name="Request export")
    for _ in range(40):
        await page.keyboard.press("Tab")
        if await button.evaluate("b => b === document.activeElement"):
            break
    await expect(button).to_be_focused()
    # The focused control shows it (the focus ring is an outline, not the default "none").
    outline = await button.evaluate("b => getComputedStyle(b).outlineStyle")
    assert outline != "none", outline
    await page.keyboard.press("Enter")
    await expect(my_exports(page).get_by_text("Waiting to start")).to_be_visible()


@pytest.mark.parametrize(
    ("code", "words"),
    [
        # A snapshot has no filters to narrow (SPEC §27): its words say which limit and who can raise it.
        ("too_many_rows", "The organization has more projects and tasks than one snapshot may hold."),
        ("access_revoked", "Your role in the organization changed, so this export was stopped"),
        ("org_deleting", "The organization is being deleted, so this export was stopped."),
        ("worker_lost", "The export was interrupted several times and could not finish."),
    ],
)
async def test_failed_export_says_why_in_words(
    api: Api, db: Database, owner: psycopg.Connection[Any], open_page: OpenPage, code: str, words: str
) -> None:
    org = await api.org("Failures")
    export_id = await insert_export(db, org.id, org.member.id, kind="snapshot", state="failed")
    owner.execute("UPDATE export_jobs SET error_code = %s WHERE id = %s", (code, export_id))
    page = await open_page("member")
    await sign_in(page, org.member)
    item = my_exports(page).filter(has_text="Snapshot (JSON)")
    await expect(item.get_by_text("Failed", exact=True)).to_be_visible()
    await expect(item.get_by_text(words)).to_be_visible()
    await expect(item.get_by_text(code)).to_have_count(0)
    await expect(item.get_by_role("button", name="Request a new one")).to_be_visible()


async def test_rate_limit_says_when_to_ask_again(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Busy Bees")
    page = await open_page("member")
    await sign_in(page, org.member)
    button = page.get_by_role("button", name="Request export")
    for n in range(1, 4):
        await button.click()
        await expect(my_exports(page)).to_have_count(n)
    await button.click()
    notice = page.get_by_role("alert").filter(has_text="You have asked for several exports just now.")
    await expect(notice).to_contain_text(re.compile(r"You can ask again in \d+ s \(at .+\)\."))
    await expect(my_exports(page)).to_have_count(3)
