"""Notifications in the page (SPEC §19, §27), through a real browser against the real API and worker: the header's
unread count, the list at #/me/notifications (links to the export's place, opening marks read, "Mark all as
read", "Older notifications"), and the email preferences at #/me/preferences. Axe-core finds nothing in either
view at 375 and 1280 px; their screenshots are kept as tests/browser/screenshots/view-<name>-<width>.png.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Locator, Page, expect

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from tests.browser.conftest import SCREENSHOTS, OpenPage, my_exports, sign_in
from tests.exports.fixtures import add_tickets, create_export, runner, uid, wait_for
from tests.helpers import Api
from tests.helpers import TestUser as User

pytestmark = pytest.mark.slow


def bell(page: Page, name: str = "Notifications") -> Locator:
    """The header's notifications control by its whole accessible name (the unread count is in it)."""
    return page.get_by_role("banner").get_by_role("link", name=name, exact=True)


def notes(page: Page) -> Locator:
    """The notifications listed in the Notifications view, one list item each."""
    return page.get_by_role("region", name="Notifications").get_by_role("listitem")


async def unread(api: Api, user: User) -> int:
    r = await api.call("GET", "/me/notifications", user)
    assert r.status_code == 200, r.text
    count: int = r.json()["unread"]
    return count


async def test_a_finished_export_is_counted_listed_opened_and_all_read(
    api: Api, db: Database, open_page: OpenPage, worker: None
) -> None:
    org = await api.org("Bell Co")
    await add_tickets(db, org.id, org.member, ["One", "Two"])
    page = await open_page("member")
    await sign_in(page, org.member)
    await expect(bell(page)).to_be_visible()
    await expect(page.locator("#bell-count")).to_be_hidden()

    # Two exports end while the page follows them: the count follows the page's polling, without a reload.
    request = page.get_by_role("button", name="Request export")
    await request.click()
    await expect(my_exports(page)).to_have_count(1)
    await expect(my_exports(page).get_by_text("Ready to download")).to_have_count(1)
    await expect(bell(page, "Notifications, 1 unread")).to_be_visible()
    await expect(page.locator("#bell-count")).to_have_text("1")
    await request.click()
    await expect(my_exports(page).get_by_text("Ready to download")).to_have_count(2)
    await expect(bell(page, "Notifications, 2 unread")).to_be_visible()

    await bell(page, "Notifications, 2 unread").click()
    assert page.url.endswith("#/me/notifications")
    await expect(notes(page)).to_have_count(2)
    title = "Your Tickets (CSV) export in Bell Co is ready"
    await expect(notes(page).filter(has_text="Unread")).to_have_count(2)
    # When, and in which org (the org's name from the page's own list of orgs).
    await expect(notes(page).first.locator("p.muted")).to_contain_text(" · Bell Co")
    items = (await api.call("GET", "/me/notifications", org.member)).json()["items"]
    newest = items[0]
    link = notes(page).first.get_by_role("link", name=title)
    await expect(link).to_have_attribute("href", f"#/orgs/{org.id}/exports/{newest['exportId']}")

    # Opening it marks it read and leads to the export's place.
    await link.click()
    await expect(page.get_by_role("region", name="Tickets (CSV): all tickets")).to_be_visible()
    assert page.url.endswith(f"#/orgs/{org.id}/exports/{newest['exportId']}")
    await expect(bell(page, "Notifications, 1 unread")).to_be_visible()
    items = (await api.call("GET", "/me/notifications", org.member)).json()["items"]
    assert [x["readAt"] is not None for x in items] == [True, False]

    await bell(page, "Notifications, 1 unread").click()
    await expect(notes(page).filter(has_text="Unread")).to_have_count(1)
    await page.get_by_role("button", name="Mark all as read").click()
    await expect(page.get_by_role("status").filter(has_text="Every notification is marked as read.")).to_be_visible()
    await expect(bell(page)).to_be_visible()
    await expect(page.locator("#bell-count")).to_be_hidden()
    await expect(notes(page).filter(has_text="Unread")).to_have_count(0)
    await expect(notes(page)).to_have_count(2)
    assert await unread(api, org.member) == 0


async def test_older_notifications_come_a_page_at_a_time(
    api: Api, owner: psycopg.Connection[Any], open_page: OpenPage
) -> None:
    org = await api.org("Many Bells")
    for n in range(23):
        owner.execute(
            "INSERT INTO notifications (id, org_id, user_id, channel, type, title, state, created_at)"
            " VALUES (gen_random_uuid(), %s, %s, 'app', 'org.deletion_requested', %s, 'delivered', now() - make_interval(mins => %s))",
            (org.id, org.owner.id, f"Notice {n}", n),
        )
    page = await open_page("owner")
    await sign_in(page, org.owner)
    await bell(page, "Notifications, 23 unread").click()
    await expect(notes(page)).to_have_count(20)
    await expect(notes(page).first).to_contain_text("Notice 0")
    older = page.get_by_role("button", name="Older notifications")
    await older.click()
    await expect(notes(page)).to_have_count(23)
    await expect(notes(page).last).to_contain_text("Notice 22")
    await expect(older).to_be_hidden()
    # A deletion leads to the org's settings, where its lifecycle is.
    await expect(notes(page).first.get_by_role("link")).to_have_attribute("href", f"#/orgs/{org.id}/settings")


async def test_a_restore_that_failed_is_listed_without_an_org_and_opens_its_import(
    api: Api, open_page: OpenPage, worker: None
) -> None:
    org = await api.org("Told Co")
    r = await api.call(
        "POST",
        "/imports?name=Broken",
        org.owner,
        content=b"PK\x03\x04 not really",
        headers={"content-type": "application/zip"},
    )
    assert r.status_code == 202, r.text
    import_id = r.json()["id"]

    async def failed() -> bool:
        return bool((await api.call("GET", f"/imports/{import_id}", org.owner)).json()["state"] == "failed")

    await wait_for(failed, f"import {import_id} to fail")
    page = await open_page("owner")
    await sign_in(page, org.owner)
    await bell(page, "Notifications, 1 unread").click()
    await expect(notes(page)).to_have_count(1)
    note = notes(page).first
    link = note.get_by_role(
        "link", name="Your archive could not be restored as Broken: the file is not a valid archive"
    )
    # No org to name or lead to: the import's own address, beside the page's restore.
    await expect(link).to_have_attribute("href", f"#/imports/{import_id}")
    await expect(note.locator("p.muted")).not_to_contain_text(" · ")
    await link.click()
    # Marked read first, then led there.
    await expect(page.locator("#restore-answer")).to_contain_text(
        "The restore failed and nothing was kept: The upload is not a readable ZIP archive"
    )
    assert page.url.endswith(f"#/imports/{import_id}")
    await expect(bell(page)).to_be_visible()
    assert await unread(api, org.owner) == 0


async def test_an_email_type_turned_off_stays_off(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Quiet Co")
    page = await open_page("member")
    await sign_in(page, org.member)
    await bell(page).click()
    await page.get_by_role("link", name="Choose which of them Space also emails you").click()
    assert page.url.endswith("#/me/preferences")
    labels = [
        "An export of mine is ready",
        "An export of mine failed",
        "An export of mine was cancelled by someone else",
        "An organization I own is to be deleted",
        "A schedule I made, or one in an organization I own, was paused",
        "An archive I uploaded was restored",
        "An archive I uploaded could not be restored",
    ]
    for label in labels:
        await expect(page.get_by_label(label, exact=True)).to_be_checked()
    await page.get_by_label("An export of mine failed", exact=True).uncheck()
    save = page.get_by_role("button", name="Save")
    await save.click()
    # Answered beside the button.
    answer = page.locator("#preferences-answer")
    await expect(answer).to_have_text("Saved. One kind of email is off.")
    await expect(answer).to_have_attribute("role", "status")
    save_box, answer_box = await save.bounding_box(), await answer.bounding_box()
    assert save_box and answer_box and 0 <= answer_box["y"] - save_box["y"] < 3 * save_box["height"]

    got = (await api.call("GET", "/me/preferences", org.member)).json()
    assert got == {
        "email": {
            "export.completed": True,
            "export.failed": False,
            "export.cancelled": True,
            "org.deletion_requested": True,
            "schedule.paused": True,
            "import.completed": True,
            "import.failed": True,
        }
    }
    await page.reload()
    await expect(page.get_by_label("An export of mine failed", exact=True)).not_to_be_checked()
    for label in labels[:1] + labels[2:]:
        await expect(page.get_by_label(label, exact=True)).to_be_checked()


async def _check_view(page: Page, name: str, width: int) -> None:
    """Zero axe-core violations, and the view's screenshot kept for a reviewer."""
    results = await Axe().run(page)
    assert results.violations_count == 0, results.generate_report()
    SCREENSHOTS.mkdir(exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / f"view-{name}-{width}.png", full_page=True)


@pytest.mark.parametrize("width", [375, 1280])
async def test_the_notifications_and_preferences_views_have_no_axe_violations(
    api: Api, db: Database, settings: Settings, open_page: OpenPage, width: int
) -> None:
    org = await api.org(f"Axe Bell {width}")
    await add_tickets(db, org.id, org.member, ["One"])
    for _ in range(2):
        export = await create_export(api, org, org.member, {"kind": "tickets_csv"})
        assert await run_export(runner(settings, db), uid(export["id"]), uid(org.id)) == "completed"
    first = (await api.call("GET", "/me/notifications", org.member)).json()["items"][-1]
    assert (await api.call("POST", f"/me/notifications/{first['id']}/read", org.member)).status_code == 204

    page = await open_page("member", width=width, height=800)
    await sign_in(page, org.member)
    await bell(page, "Notifications, 1 unread").click()
    await expect(notes(page)).to_have_count(2)
    await _check_view(page, "notifications", width)

    await page.get_by_role("link", name="Choose which of them Space also emails you").click()
    await expect(page.get_by_label("An export of mine is ready", exact=True)).to_be_checked()
    await page.get_by_label("An export of mine was cancelled by someone else", exact=True).uncheck()
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#preferences-answer")).to_have_text("Saved. One kind of email is off.")
    await _check_view(page, "preferences", width)
