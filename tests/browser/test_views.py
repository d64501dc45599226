"""The page as views with their own addresses (SPEC §17, §27), through a real browser, by clicks and typing.

Each action is answered where it was taken (in the viewport, even at 375 px), the org's views stay within a few
screen heights, the trail and the org's exports read as sentences with names (ids only on demand), every view has
zero axe-core violations at 375 and 1280 px, and a screenshot of each view at both widths is kept as
tests/browser/screenshots/view-<name>-<width>.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Locator, Page, expect

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.worker import run_worker
from tests.browser.conftest import SCREENSHOTS, WAIT_MS, OpenPage, go_to, my_exports, org_exports, serving, sign_in
from tests.exports.fixtures import add_project, add_tickets, create_export, insert_export, runner, tuned, uid
from tests.helpers import Api, Org
from tests.helpers import TestUser as User

pytestmark = pytest.mark.slow

PHONE = {"width": 375, "height": 800}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


async def _in_viewport(page: Page, node: Locator) -> None:
    """The element is shown and wholly inside the viewport (no scrolling needed to read it)."""
    await expect(node).to_be_visible()
    box = await node.bounding_box()
    size = page.viewport_size
    assert box is not None and size is not None
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"], (box, size)
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"], (box, size)


async def test_a_rate_limited_request_is_answered_beside_the_button_at_phone_width(
    api: Api, open_page: OpenPage
) -> None:
    org = await api.org("Busy Phone")
    page = await open_page("member", **PHONE)
    await sign_in(page, org.member)
    button = page.get_by_role("button", name="Request export")
    for n in range(1, 4):
        await button.click()
        await expect(my_exports(page)).to_have_count(n)
    await page.evaluate("window.scrollTo(0, 0)")
    await button.click()
    answer = page.get_by_role("alert").filter(has_text="You have asked for several exports just now.")
    # The time to ask again, in the viewer's zone, with the zone named.
    await expect(answer).to_contain_text(
        re.compile(r"You can ask again in \d+ s \(at \d{1,2}:\d{2}:\d{2}\W*\w* \S+\)\.")
    )
    zone = await page.evaluate("new Date().toLocaleTimeString(undefined, {timeZoneName: 'short'}).split(' ').pop()")
    await expect(answer).to_contain_text(f" {zone})")
    await _in_viewport(page, answer)
    await expect(my_exports(page)).to_have_count(3)


async def test_suspending_asks_first_and_answers_beside_the_control_at_phone_width(
    api: Api, open_page: OpenPage
) -> None:
    org = await api.org("Phone Suspends")
    page = await open_page("owner", **PHONE)
    await sign_in(page, org.owner)
    await go_to(page, "Settings")

    # Going back from the question changes nothing.
    await page.get_by_role("button", name="Suspend organization").click()
    dialog = page.get_by_role("dialog", name="Suspend Phone Suspends?")
    await expect(dialog).to_be_visible()
    await dialog.get_by_role("button", name="Go back").click()
    await expect(dialog).to_be_hidden()
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "active"

    await page.get_by_role("button", name="Suspend organization").click()
    await dialog.get_by_role("button", name="Suspend the organization").click()
    answer = page.get_by_role("status").filter(has_text="The organization is suspended")
    await _in_viewport(page, answer)
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "suspended"
    await expect(page.get_by_role("button", name="Reactivate organization")).to_be_visible()


async def test_the_org_view_of_sixty_exports_stays_within_a_few_screens_at_phone_width(
    api: Api, db: Database, owner: psycopg.Connection[Any], open_page: OpenPage
) -> None:
    org = await api.org("Sixty")
    people = [org.member, org.admin, org.customer, org.owner]
    states = ["completed", "failed", "cancelled", "completed", "queued"]
    for n in range(60):
        export_id = await insert_export(
            db,
            org.id,
            people[n % 4].id,
            kind=["snapshot", "tickets_csv", "archive"][n % 3],
            state=states[n % 5],
            completed_ago=dt.timedelta(minutes=n),
        )
        if states[n % 5] in ("failed", "cancelled"):
            code = "too_many_rows" if states[n % 5] == "failed" else "cancelled"
            owner.execute("UPDATE export_jobs SET error_code = %s WHERE id = %s", (code, export_id))
    page = await open_page("admin", **PHONE)
    await sign_in(page, org.admin)
    await go_to(page, "All exports")
    rows = org_exports(page)
    await expect(rows).to_have_count(10)
    height = await page.evaluate("document.documentElement.scrollHeight")
    assert height <= 4 * PHONE["height"], height
    assert await page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    # Page by page through the API's cursors: every export once, the admin's own among them only once.
    seen: list[str] = []
    older = page.get_by_role("button", name="Older exports")
    for n in range(6):
        await expect(rows).to_have_count(10)
        await expect(rows.first).not_to_have_attribute("data-id", seen[-10] if seen else "")
        seen += await rows.evaluate_all("items => items.map(li => li.dataset.id)")
        # No empty lines in a row: every paragraph that takes room says something.
        empty = await rows.evaluate_all(
            "items => items.flatMap(li => [...li.querySelectorAll('p, div')])"
            ".filter(p => p.getBoundingClientRect().height > 0 && !p.textContent.trim()).length"
        )
        assert empty == 0
        if n < 5:
            await older.click()
    await expect(older).to_be_disabled()
    assert len(seen) == 60 and len(set(seen)) == 60
    await expect(rows.filter(has_text="Requested by you,")).not_to_have_count(0)
    await page.get_by_role("button", name="Newer exports").click()
    await expect(rows.first).to_have_attribute("data-id", seen[40])


async def test_your_exports_come_a_page_at_a_time(api: Api, db: Database, open_page: OpenPage) -> None:
    org = await api.org("Many Mine")
    for n in range(12):
        await insert_export(db, org.id, org.member.id, completed_ago=dt.timedelta(minutes=n))
    page = await open_page("member", **PHONE)
    await sign_in(page, org.member)
    rows = my_exports(page)
    await expect(rows).to_have_count(10)
    newer = page.get_by_role("button", name="Newer exports")
    await expect(newer).to_be_disabled()
    first = await rows.evaluate_all("items => items.map(li => li.dataset.id)")
    await page.get_by_role("button", name="Older exports").click()
    await expect(rows).to_have_count(2)
    second = await rows.evaluate_all("items => items.map(li => li.dataset.id)")
    await expect(page.get_by_role("button", name="Older exports")).to_be_disabled()
    items = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert first + second == [x["id"] for x in items]
    await newer.click()
    await expect(rows).to_have_count(10)


async def test_the_trail_and_the_org_view_read_as_sentences_with_names_from_the_viewers_side(
    api: Api, db: Database, settings: Settings, open_page: OpenPage
) -> None:
    org = await api.org("Sentences")
    await add_tickets(db, org.id, org.member, ["One", "Two"])
    csv = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": ";"})
    assert await run_export(runner(settings, db), uid(csv["id"]), uid(org.id)) == "completed"
    link = await api.call("POST", org.path(f"/exports/{csv['id']}/links"), org.member)
    assert link.status_code == 201, link.text
    got = await api.call("GET", link.json()["url"])
    assert got.status_code == 200
    size = len(got.content)
    queued = await create_export(api, org, org.member, {"kind": "snapshot"})
    assert (await api.call("DELETE", org.path(f"/exports/{queued['id']}"), org.member)).status_code == 204
    newcomer = await api.users.make("Nora")
    r = await api.call("POST", org.path("/members"), org.admin, json={"email": newcomer.email, "role": "customer"})
    assert r.status_code == 201, r.text
    assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    assert (await api.call("POST", org.path("/reactivate"), org.owner)).status_code == 200

    page = await open_page("admin")
    await sign_in(page, org.admin)
    await go_to(page, "Audit trail")
    trail = page.get_by_role("region", name="Audit trail")
    m = org.member.name
    kib = f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KiB"
    for sentence in [
        f"{org.owner.name} reactivated the organization.",
        f"{org.owner.name} suspended the organization.",
        "You added Nora as a customer.",
        f"{m} cancelled Snapshot (JSON).",
        f"{m} requested an export: Snapshot (JSON).",
        f"{m} downloaded Tickets (CSV) through a link, {kib}.",
        f"{m} made a download link for Tickets (CSV), valid until",
        "Tickets (CSV) was ready: 2 rows,",
        f"{m} requested an export: Tickets (CSV).",
    ]:
        await expect(trail.get_by_text(sentence)).to_have_count(1)
    # No ids and no JSON by default; they are there for whoever opens an entry's details.
    text = await trail.inner_text()
    assert not UUID.search(text), text
    assert "{" not in text, text
    entry = trail.get_by_role("listitem").filter(has_text="suspended the organization")
    await entry.get_by_text("Details").click()
    await expect(entry.get_by_text(org.id)).to_be_visible()

    # The org's exports from the admin's side: the member's own cancellation is the member's, by name.
    await go_to(page, "All exports")
    cancelled = org_exports(page).filter(has_text="Snapshot (JSON)")
    await expect(cancelled.get_by_text(f"{m} cancelled this export.")).to_be_visible()
    await expect(cancelled.get_by_text("You cancelled")).to_have_count(0)
    ready = org_exports(page).filter(has_text="Tickets (CSV)")
    await expect(ready.get_by_text("Columns separated by semicolons (;)")).to_be_visible()
    assert not UUID.search(await page.get_by_role("region", name="Every export in this organization").inner_text())

    # And from the member's: "You cancelled", and "Request a new one" repeats the export as it was.
    member = await open_page("member")
    await sign_in(member, org.member)
    mine = my_exports(member).filter(has_text="Snapshot (JSON)")
    await expect(mine.get_by_text("You cancelled this export.")).to_be_visible()
    ready = my_exports(member).filter(has_text="Tickets (CSV)")
    await expect(ready.get_by_text("Columns separated by semicolons (;)")).to_be_visible()


async def test_request_a_new_one_repeats_kind_filters_and_delimiter(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Again Co")
    body = {"kind": "tickets_csv", "filters": {"status": "open", "q": "printer"}, "delimiter": ";"}
    first = await create_export(api, org, org.member, body)
    assert (await api.call("DELETE", org.path(f"/exports/{first['id']}"), org.member)).status_code == 204
    page = await open_page("member")
    await sign_in(page, org.member)
    # The form's separator is the default comma: the repeat must not take it from there.
    await expect(page.get_by_label("Column separator")).to_have_value(",")
    item = my_exports(page).filter(has_text='status open, text "printer"')
    await item.get_by_role("button", name="Request a new one").click()
    await expect(my_exports(page)).to_have_count(2)
    await expect(page.get_by_role("status").filter(has_text="A new export was requested")).to_be_visible()
    items = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert [(x["kind"], x["filters"], x["delimiter"]) for x in items] == [
        ("tickets_csv", {"status": "open", "q": "printer"}, ";")
    ] * 2


async def test_one_exports_place_has_its_own_address(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Place Ltd")
    export = await create_export(api, org, org.member, {"kind": "tickets_csv", "delimiter": ";"})
    theirs = await create_export(api, org, org.admin, {"kind": "snapshot"})
    page = await open_page("member")
    await sign_in(page, org.member)
    await page.goto(f"/#/orgs/{org.id}/exports/{export['id']}")
    place = page.get_by_role("region", name="Tickets (CSV): all tickets")
    await expect(place.get_by_text("Waiting to start")).to_be_visible()
    await expect(place.get_by_text("Columns separated by semicolons (;)")).to_be_visible()
    await place.get_by_text("Details").click()
    await expect(place.get_by_text(export["id"])).to_be_visible()
    # Another member's export has no place here: it is not theirs.
    await page.goto(f"/#/orgs/{org.id}/exports/{theirs['id']}")
    await expect(page.get_by_text("This export does not exist, or it is not yours.")).to_be_visible()
    await page.get_by_role("link", name="Back to your exports").click()
    await expect(page.get_by_role("region", name="Your exports")).to_be_visible()


async def test_customers_are_not_offered_assigned_to_me(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Assigned")
    page = await open_page("customer")
    await sign_in(page, org.customer)
    options = page.get_by_label("Assignment").locator("option")
    await expect(options).to_have_text(["Anyone", "Unassigned"])
    # Staff are.
    staff = await open_page("member")
    await sign_in(staff, org.member)
    await expect(staff.get_by_label("Assignment").locator("option")).to_have_text(
        ["Anyone", "Assigned to me", "Unassigned"]
    )


async def test_durations_go_to_the_nearest_unit(api: Api, open_page: OpenPage) -> None:
    page = await open_page("anyone")
    got = await page.evaluate(
        """import('/static/words.js').then(w => [
             7 * 86400, 7 * 86400 - 1, 6 * 86400 + 20 * 3600, 6 * 86400 + 3600, 47 * 3600 + 59 * 60 + 59, 119.6,
           ].map(w.duration))"""
    )
    assert got == ["7 days", "7 days", "7 days", "6 days", "2 days", "2 min"]


async def test_a_user_with_no_org_creates_one(api: Api, open_page: OpenPage) -> None:
    loner = await api.users.make("loner")
    page = await open_page("loner")
    await page.get_by_label("API token").fill(loner.token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_text("You are not a member of any organization yet.")).to_be_visible()
    await expect(page.get_by_role("region", name="Create an organization").get_by_text("space demo")).to_be_visible()
    await page.get_by_label("Name of the organization").fill("Ranger Co")
    await page.get_by_role("button", name="Create organization").click()
    await expect(page.get_by_text("You are an owner of Ranger Co.")).to_be_visible()
    await expect(page.get_by_role("status").filter(has_text="Ranger Co was created")).to_be_visible()
    (org,) = (await api.call("GET", "/orgs", loner)).json()["items"]
    assert org["name"] == "Ranger Co"
    assert page.url.endswith(f"#/orgs/{org['id']}/exports")
    await expect(page.get_by_role("button", name="Request export")).to_be_enabled()


# --- every view: axe-core and screenshots ------------------------------------------------------------------------


async def _check_view(page: Page, name: str, width: int) -> None:
    """Zero axe-core violations, and the view's screenshot kept for a reviewer."""
    results = await Axe().run(page)
    assert results.violations_count == 0, results.generate_report()
    SCREENSHOTS.mkdir(exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / f"view-{name}-{width}.png", full_page=True)


async def _populated(api: Api, db: Database, owner: psycopg.Connection[Any], settings: Settings) -> tuple[Org, str]:
    org = await api.org(f"Views {uuid.uuid4().hex[:4]}")
    await add_project(db, org.id, "Launch", ["Plan", "Ship"])
    await add_tickets(db, org.id, org.member, ["Printer jams", "Screen flickers"], status="open", priority="high")
    csv = await create_export(api, org, org.owner, {"kind": "tickets_csv", "filters": {"status": "open"}})
    assert await run_export(runner(settings, db), uid(csv["id"]), uid(org.id)) == "completed"
    await create_export(api, org, org.member, {"kind": "snapshot"})
    failed = await insert_export(db, org.id, org.member.id, kind="archive", state="failed")
    owner.execute("UPDATE export_jobs SET error_code = 'too_many_rows' WHERE id = %s", (failed,))
    assert (await api.call("POST", org.path("/suspend"), org.owner)).status_code == 200
    assert (await api.call("POST", org.path("/reactivate"), org.owner)).status_code == 200
    return org, csv["id"]


@pytest.mark.parametrize("width", [375, 1280])
async def test_every_view_has_no_axe_violations_and_is_photographed(
    api: Api, db: Database, owner: psycopg.Connection[Any], settings: Settings, open_page: OpenPage, width: int
) -> None:
    org, export_id = await _populated(api, db, owner, settings)
    page = await open_page("owner", width=width, height=800)
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    await _check_view(page, "sign-in", width)

    await sign_in(page, org.owner)
    await expect(my_exports(page).get_by_text("Ready to download")).to_be_visible()
    await _check_view(page, "exports", width)

    await go_to(page, "All exports")
    await expect(org_exports(page)).to_have_count(3)
    await _check_view(page, "all", width)

    await go_to(page, "Audit trail")
    await expect(page.get_by_role("region", name="Audit trail").get_by_role("listitem").first).to_be_visible()
    await _check_view(page, "audit", width)

    await go_to(page, "Settings")
    await expect(page.get_by_role("region", name="Members").get_by_role("listitem")).to_have_count(5)
    await _check_view(page, "settings", width)

    await page.get_by_role("button", name="Suspend organization").click()
    await expect(page.get_by_role("dialog")).to_be_visible()
    await _check_view(page, "confirm", width)
    await page.get_by_role("dialog").get_by_role("button", name="Go back").click()

    await page.goto(f"/#/orgs/{org.id}/exports/{export_id}")
    await expect(
        page.get_by_role("region", name="Tickets (CSV): status open").get_by_text("Ready to download")
    ).to_be_visible()
    await _check_view(page, "export", width)

    await go_to(page, "New organization")
    await expect(page.get_by_label("Name of the organization")).to_be_visible()
    await _check_view(page, "new-org", width)

    loner = await api.users.make("noorg")
    fresh = await open_page("loner", width=width, height=800)
    await fresh.get_by_label("API token").fill(loner.token)
    await fresh.get_by_role("button", name="Sign in").click()
    await expect(fresh.get_by_text("You are not a member of any organization yet.")).to_be_visible()
    await _check_view(fresh, "no-org", width)


# --- the final archive of an org bigger than one export may be ----------------------------------------------------

ROW_LIMIT = 20
"""SPACE_EXPORT_ROW_LIMIT of the limited server: the org below holds more rows than one export may."""


@pytest.fixture(scope="module")
def limited(settings: Settings) -> Settings:
    """Settings whose one-export row limit is far below what the org holds (the archive has limits of its own)."""
    return tuned(settings, export_row_limit=ROW_LIMIT)


@pytest.fixture
async def limited_url(limited: Settings) -> AsyncIterator[str]:
    """A second app on the limited settings, on a free port, and a real worker with them."""
    started = asyncio.Event()
    work = asyncio.create_task(run_worker(limited, started=started))
    try:
        await asyncio.wait_for(started.wait(), WAIT_MS / 1000)
        async with serving(limited) as url:
            yield url
    finally:
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(work, WAIT_MS / 1000)


async def _member_of_big_org(api: Api, db: Database) -> tuple[Org, User]:
    org = await api.org("Big Final")
    await add_tickets(db, org.id, org.member, [f"Ticket {n}" for n in range(ROW_LIMIT + 5)])
    await add_project(db, org.id, "Everything", [f"Task {n}" for n in range(ROW_LIMIT + 5)])
    return org, org.owner


async def test_the_owner_of_an_org_above_the_one_export_limit_takes_the_final_archive_and_deletes(
    api: Api, db: Database, open_page: OpenPage, limited_url: str, tmp_path: Path
) -> None:
    org, person = await _member_of_big_org(api, db)
    page = await open_page("owner", **PHONE)
    await page.goto(f"{limited_url}/")
    await sign_in(page, person)
    await go_to(page, "Settings")
    await page.get_by_label("Type the organization's name to confirm deletion").fill("Big Final")
    await page.get_by_role("button", name="Request deletion").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the organization").click()
    await expect(page.get_by_role("alert")).to_contain_text("Take a complete export before deleting")
    await page.get_by_role("button", name="Export everything first").click()

    lifecycle = page.get_by_role("region", name="Organization lifecycle")
    archive = lifecycle.get_by_role("listitem").filter(has_text="Complete archive (ZIP)")
    ended = archive.get_by_text(re.compile(r"^(Ready to download|Failed)$"))
    await expect(ended).to_be_visible()
    # Whatever happened, the page never tells anyone to narrow filters an archive does not have.
    await expect(archive.get_by_text("filters")).to_have_count(0)
    assert await ended.inner_text() == "Ready to download", await archive.inner_text()

    async with page.expect_download() as info:
        await archive.get_by_role("button", name="Download").click()
    download = await info.value
    path = tmp_path / download.suggested_filename
    await download.save_as(path)
    with zipfile.ZipFile(path) as z:
        assert {"manifest.json", "snapshot.json", "tickets.csv"} <= set(z.namelist())

    await page.get_by_role("button", name="Request deletion").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the organization").click()
    await _in_viewport(page, page.get_by_role("status").filter(has_text="Deletion requested"))
    await expect(page.get_by_role("status").filter(has_text="This organization is being deleted")).to_be_visible()
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "deleting"
