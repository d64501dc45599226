"""The page's "Restore an archive" (SPEC §23), through a real browser and a real worker: an owner picks the ZIP
of their org's complete archive, names the new org, asks for new ids (the original is still here), and sees the
upload's progress, then the report in words beside the form; the restored org is in their list at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import expect

from space.config import Settings
from space.db import Database
from tests.browser.conftest import WAIT_MS, OpenPage, go_to, sign_in
from tests.exports.fixtures import add_project, add_tickets, completed_export, download
from tests.helpers import Api

pytestmark = pytest.mark.slow


async def test_an_owner_restores_an_archive_from_the_page(
    api: Api, db: Database, settings: Settings, open_page: OpenPage, worker: None, tmp_path: Path
) -> None:
    org = await api.org("Page Restore")
    await add_project(db, org.id, "Launch", ["Plan", "=cmd()"])
    await add_tickets(db, org.id, org.member, ["Printer on fire", 'a "quoted"\r\nline'])
    export_id = await completed_export(api, db, settings, org, {"kind": "archive"})
    archive = tmp_path / "page-restore.zip"
    archive.write_bytes((await download(api, org, org.owner, export_id)).content)

    page = await open_page("owner")
    await sign_in(page, org.owner)
    await go_to(page, "New organization")
    await page.get_by_label("Archive (ZIP)", exact=True).set_input_files(archive)
    await page.get_by_label("Name of the restored organization").fill("Page Restore again")
    await page.get_by_label("Give it new ids").check()
    await page.get_by_role("button", name="Restore").click()
    said = page.locator("#restore-answer")
    await expect(said).to_contain_text("Page Restore again was restored", timeout=WAIT_MS)
    await expect(said).to_contain_text("1 project, 2 tasks, 2 tickets")
    await expect(said).to_contain_text("matches the archive exactly")
    await expect(page.locator("#org").get_by_role("option", name="Page Restore again")).to_have_count(1)
