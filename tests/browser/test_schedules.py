"""Schedules in the page (SPEC §21, §27), through a real browser against the real API: an owner creates an
incremental schedule in the org's settings, pauses and resumes it, sees its runs, and deletes it after a
confirmation; a member is not offered the section."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect

from space.config import Settings
from space.db import Database
from space.exports.pipeline import run_export
from space.schedules.jobs import run_due
from tests.browser.conftest import OpenPage, go_to, sign_in
from tests.exports.fixtures import add_tickets, runner
from tests.helpers import Api

pytestmark = pytest.mark.slow


async def test_owner_creates_pauses_sees_runs_and_deletes_a_schedule(
    api: Api, db: Database, settings: Settings, owner: psycopg.Connection[Any], open_page: OpenPage
) -> None:
    org = await api.org("Every Day")
    await add_tickets(db, org.id, org.member, ["one", "two"])
    page = await open_page("owner")
    await sign_in(page, org.owner)
    await go_to(page, "Settings")
    section = page.get_by_role("region", name="Schedules")
    await expect(section.get_by_text("No schedules")).to_be_visible()
    await section.get_by_label("Export").select_option("tickets_csv")
    await section.get_by_label("Every").select_option("day")
    await section.get_by_label("At (UTC, day and week)").fill("06:30")
    await section.get_by_label("Only what changed since the previous run").check()
    await section.get_by_role("button", name="Create schedule").click()
    answer = page.locator("#schedule-answer")
    await expect(answer).to_contain_text("Schedule created: the first run is")
    item = section.get_by_role("listitem").filter(has_text="Tickets (CSV) every day at 06:30 UTC, only what changed")
    await expect(item).to_be_visible()
    [s] = (await api.call("GET", org.path("/schedules"), org.owner)).json()["items"]
    assert (s["kind"], s["every"], s["at"], s["incremental"]) == ("tickets_csv", "day", "06:30", True)

    await item.get_by_role("button", name="Pause").click()
    await expect(answer).to_have_text("The schedule is paused.")
    assert (await api.call("GET", org.path(f"/schedules/{s['id']}"), org.owner)).json()["paused"] is True
    await section.get_by_role("button", name="Resume").click()
    await expect(answer).to_have_text("The schedule runs again.")

    owner.execute("UPDATE schedules SET next_run_at = now() - interval '1 hour' WHERE id = %s", (s["id"],))
    await run_due(settings, db, None)
    [run] = (await api.call("GET", org.path(f"/schedules/{s['id']}/runs"), org.owner)).json()["items"]
    assert await run_export(runner(settings, db), uuid.UUID(run["exportId"]), uuid.UUID(org.id)) == "completed"
    await section.get_by_role("button", name="Show runs").click()
    await expect(section.get_by_text("completed, 2 rows")).to_be_visible()

    await section.get_by_role("button", name="Delete").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the schedule").click()
    await expect(answer).to_have_text("The schedule was deleted.")
    await expect(section.get_by_text("No schedules")).to_be_visible()
    assert (await api.call("GET", org.path("/schedules"), org.owner)).json()["items"] == []


async def test_a_member_is_not_offered_schedules(api: Api, open_page: OpenPage) -> None:
    org = await api.org("Members Only")
    page = await open_page("member")
    await sign_in(page, org.member)
    await go_to(page, "Settings")
    await expect(page.get_by_role("heading", name="Members")).to_be_visible()
    await expect(page.get_by_role("region", name="Schedules")).to_be_hidden()
