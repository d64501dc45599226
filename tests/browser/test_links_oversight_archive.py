"""Export center scenarios over SPEC §10 (download links), §12 (oversight, audit) and §13 (archive).

By clicks and typing only, like test_export_center.py.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from playwright.async_api import Locator, Page, expect

from space.db import Database
from tests.browser.conftest import OpenPage, go_to, my_exports, org_exports, sign_in
from tests.exports.fixtures import add_tickets
from tests.helpers import Api

pytestmark = pytest.mark.slow


async def _save_download(page: Page, item: Locator, folder: Path) -> tuple[Path, str, str]:
    """Click the item's Download; the browser's own download lands in `folder`. Returns (path, name, url)."""
    async with page.expect_download() as info:
        await item.get_by_role("button", name="Download").click()
    download = await info.value
    path = folder / download.suggested_filename
    await download.save_as(path)
    return path, download.suggested_filename, download.url


async def test_member_downloads_the_csv_and_the_saved_file_matches_its_sha256(
    api: Api, db: Database, open_page: OpenPage, worker: None, tmp_path: Path
) -> None:
    org = await api.org("Download Co")
    await add_tickets(db, org.id, org.member, ["Printer jams", "Printer smokes"], status="open", priority="urgent")
    await add_tickets(db, org.id, org.member, ["Printer fine"], status="solved", priority="urgent")
    page = await open_page("member")
    await sign_in(page, org.member)

    await page.get_by_label("Status").select_option(label="Open")
    await page.get_by_label("Priority").select_option(label="Urgent")
    await page.get_by_role("button", name="Request export").click()
    item = my_exports(page).filter(has_text="status open, priority urgent")
    await expect(item.get_by_text("100 %")).to_be_visible()
    await expect(item.get_by_text("Ready to download")).to_be_visible()
    await expect(item.get_by_text("2 rows,")).to_be_visible()

    path, name, url = await _save_download(page, item, tmp_path)
    (export,) = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert name == f"space-export-{export['id']}.csv"
    # A native download of a minted link, not a Blob the page assembled.
    assert "/result?token=" in url and not url.startswith("blob:"), url
    assert hashlib.sha256(path.read_bytes()).hexdigest() == export["sha256"]
    assert path.stat().st_size == export["byteSize"]
    await expect(page.get_by_role("status").filter(has_text="Your download has started.")).to_be_visible()


async def test_admin_cancels_a_members_queued_export_and_the_member_reads_why(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Oversight Ltd")
    member = await open_page("member")
    await sign_in(member, org.member)
    await member.get_by_role("button", name="Request export").click()
    mine = my_exports(member).filter(has_text="all tickets")
    await expect(mine.get_by_text("Waiting to start")).to_be_visible()

    admin = await open_page("admin")
    await sign_in(admin, org.admin)
    await go_to(admin, "All exports")
    theirs = org_exports(admin).filter(has_text=f"by {org.member.name},")
    await expect(theirs.get_by_text("Waiting to start")).to_be_visible()
    await theirs.get_by_role("button", name="Cancel").click()
    await expect(theirs.get_by_text("Cancelled", exact=True)).to_be_visible()

    # The member's page is still polling (the export was queued) and shows the new state in words.
    await expect(mine.get_by_text("Cancelled", exact=True)).to_be_visible()
    await expect(
        mine.get_by_text("An owner or administrator of the organization cancelled this export.")
    ).to_be_visible()
    (export,) = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    assert export["state"] == "cancelled" and export["errorCode"] == "cancelled_by_admin"


async def test_owner_exports_everything_first_then_requests_deletion(
    api: Api, db: Database, open_page: OpenPage, worker: None, tmp_path: Path
) -> None:
    org = await api.org("Final Days")
    await add_tickets(db, org.id, org.member, ["Last ticket"])
    page = await open_page("owner")
    await sign_in(page, org.owner)
    await go_to(page, "Settings")

    await page.get_by_label("Type the organization's name to confirm deletion").fill("Final Days")
    await page.get_by_role("button", name="Request deletion").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the organization").click()
    await expect(page.get_by_role("alert")).to_contain_text("Take a complete export before deleting")
    await page.get_by_role("button", name="Export everything first").click()
    await expect(page.get_by_role("button", name="Export everything first")).to_be_hidden()

    # The archive is followed where it was asked for, beside the deletion.
    lifecycle = page.get_by_role("region", name="Organization lifecycle")
    archive = lifecycle.get_by_role("listitem").filter(has_text="Complete archive (ZIP)")
    await expect(archive.get_by_text("Ready to download")).to_be_visible()
    path, name, _ = await _save_download(page, archive, tmp_path)
    assert name.endswith(".zip")
    with zipfile.ZipFile(path) as z:
        assert {"manifest.json", "snapshot.json", "tickets.csv"} <= set(z.namelist())

    # The deletion again, now that the final export exists.
    await page.get_by_role("button", name="Request deletion").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the organization").click()
    banner = page.get_by_role("status").filter(has_text="This organization")
    await expect(banner).to_contain_text("This organization is being deleted")
    assert (await api.call("GET", org.path(), org.owner)).json()["state"] == "deleting"
    await page.get_by_role("button", name="Cancel deletion").click()
    await expect(banner).to_be_hidden()
    # Active again: the archive can be downloaded again, and the trail shows the deletion and its cancel.
    await go_to(page, "Your exports")
    archive = my_exports(page).filter(has_text="Complete archive (ZIP)")
    await expect(archive.get_by_role("button", name="Download")).to_be_visible()
    await go_to(page, "Audit trail")
    trail = page.get_by_role("region", name="Audit trail")
    await expect(trail.get_by_role("listitem").first).to_contain_text("cancel")


async def test_audit_trail_pages_back(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Audited")
    for _ in range(26):
        for step in ("/suspend", "/reactivate"):
            r = await api.call("POST", org.path(step), org.owner)
            assert r.status_code == 200, r.text
    r = await api.call("POST", org.path("/exports"), org.member, json={"kind": "tickets_csv"})
    assert r.status_code == 202, r.text
    total = len((await api.call("GET", org.path("/audit?limit=200"), org.owner)).json()["items"])
    assert 50 < total <= 100, total

    page = await open_page("admin")
    await sign_in(page, org.admin)
    await go_to(page, "Audit trail")
    trail = page.get_by_role("region", name="Audit trail")
    await expect(trail.get_by_role("listitem")).to_have_count(50)
    await expect(trail.get_by_role("listitem").first).to_contain_text(f"{org.member.name} requested an export")
    await trail.get_by_role("button", name="Older entries").click()
    await expect(trail.get_by_role("listitem")).to_have_count(total)
    await expect(trail.get_by_role("button", name="Older entries")).to_be_hidden()
    await expect(trail.get_by_text(f"{org.owner.name} suspended the organization")).to_have_count(26)
    # The admin's own view of every export names its creator.
    await go_to(page, "All exports")
    await expect(org_exports(page).filter(has_text=f"by {org.member.name},")).to_have_count(1)


async def test_a_result_an_admin_removed_reads_so_and_offers_a_new_one(
    api: Api, db: Database, open_page: OpenPage, worker: None
) -> None:
    org = await api.org("Revoked Inc")
    await add_tickets(db, org.id, org.member, ["Soon gone"])
    page = await open_page("member")
    await sign_in(page, org.member)
    await page.get_by_role("button", name="Request export").click()
    item = my_exports(page).filter(has_text="all tickets")
    await expect(item.get_by_text("Ready to download")).to_be_visible()

    (export,) = (await api.call("GET", org.path("/exports"), org.member)).json()["items"]
    r = await api.call("DELETE", org.path(f"/exports/{export['id']}"), org.admin)
    assert r.status_code == 204, r.text
    await page.reload()
    item = my_exports(page).filter(has_text="all tickets")
    await expect(item.get_by_text("Removed by an administrator")).to_be_visible()
    await expect(item.get_by_text("removed this export's file")).to_be_visible()
    await expect(item.get_by_role("button", name="Download")).to_be_hidden()
    await expect(item.get_by_role("button", name="Request a new one")).to_be_visible()
