"""Destinations in the page (SPEC §22, §27), through a real browser against the real API and the customer's own
bucket (a second moto server checking credentials): an owner adds one in the org's settings (a wrong secret is
answered in words, the secret is never filled back), delivers a completed export to it and reads "Delivered to
<bucket> at <time>" in the export's row, a delivery refused by the bucket reads "Delivery failed: ...", a schedule
delivers to it, removing it while that schedule names it is answered beside the button, and removing it is asked
first. A member is offered none of it; the views have no axe violations at 375 and 1280 px."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Page, expect
from sqlalchemy import text

from space.config import Settings
from space.db import Database, Tenant, UnitOfWork
from space.destinations.delivery import deliver
from space.destinations.sealing import load_sealer
from space.exports.storage.postgres import PgResultStore
from tests.browser.conftest import SCREENSHOTS, OpenPage, go_to, my_exports, serving, sign_in
from tests.destinations.customer_store import BUCKET, Store
from tests.exports.fixtures import add_tickets, completed_export, tuned
from tests.exports.limits_fixtures import tuned_api
from tests.helpers import Api, Org, UserFactory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local(settings: Settings) -> Settings:
    """Settings that let destinations name this machine's store (as tests/destinations does)."""
    return tuned(settings, webhook_allow_private=True, delivery_retry_seconds=0)


@pytest.fixture(scope="module")
async def base_url(local: Settings) -> AsyncIterator[str]:
    """The real app on `local`, for this module's pages."""
    async with serving(local) as url:
        yield url


@pytest.fixture
async def api_local(local: Settings, users: UserFactory) -> AsyncIterator[Api]:
    async with tuned_api(local, users, webhook_allow_private=True, delivery_retry_seconds=0) as api:
        yield api


async def _deliver_pending(local: Settings, db: Database, org: Org) -> str:
    """Run the org's one pending delivery as the worker's job would (no worker: the page sees only its result)."""
    async with UnitOfWork(db.sessionmaker, Tenant(org_id=uuid.UUID(org.id))) as uow:
        delivery_id = (
            await uow.session.execute(
                text("SELECT id FROM destination_deliveries WHERE org_id = :o AND state = 'pending'"), {"o": org.id}
            )
        ).scalar_one()
    sealer = await load_sealer(local, db.engine)
    outcome: str = await deliver(local, db, PgResultStore(db), sealer, None, delivery_id, uuid.UUID(org.id))
    return outcome


async def _fill(page: Page, store: Store, *, prefix: str, key: str, secret: str) -> None:
    section = page.get_by_role("region", name="Destinations")
    await section.get_by_label("Bucket").fill(BUCKET)
    await section.get_by_label("Prefix (optional)").fill(prefix)
    await section.get_by_label("Region (optional)").fill("us-east-1")
    await section.get_by_label("Endpoint URL (optional, for a store other than AWS)").fill(store.endpoint)
    await section.get_by_label("Access key ID").fill(key)
    await section.get_by_label("Secret access key (kept sealed, never shown again)").fill(secret)
    await section.get_by_role("button", name="Add destination").click()


async def test_owner_adds_delivers_schedules_and_removes_a_destination(
    api_local: Api,
    db: Database,
    local: Settings,
    customer_store: Store,
    open_page: OpenPage,
) -> None:
    api = api_local
    org = await api.org("Delivers")
    await add_tickets(db, org.id, org.owner, ["one", "two"])
    export_id = await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    page = await open_page("owner")
    await sign_in(page, org.owner)
    await go_to(page, "Settings")
    section = page.get_by_role("region", name="Destinations")
    await expect(section.get_by_text("No destinations")).to_be_visible()
    answer = page.locator("#destination-answer")
    secret_box = section.get_by_label("Secret access key (kept sealed, never shown again)")

    key = customer_store.access_key_id
    await _fill(page, customer_store, prefix="page", key=key, secret="not-the-secret")
    await expect(answer).to_contain_text("The destination was not saved. The test write to bucket customer-bucket")
    await expect(answer).to_have_attribute("role", "alert")
    await secret_box.fill(customer_store.secret_access_key)
    await section.get_by_role("button", name="Add destination").click()
    await expect(answer).to_have_text("The destination customer-bucket/page was added: a test file was written to it.")
    await expect(section.get_by_role("listitem")).to_have_text(
        f"S3 bucket customer-bucket/page at {customer_store.endpoint}; nothing delivered yet Remove"
    )
    await expect(secret_box).to_have_value("")
    assert customer_store.secret_access_key not in await page.content()
    [destination] = (await api.call("GET", org.path("/destinations"), org.owner)).json()["items"]

    # Deliver the completed export from its row.
    await go_to(page, "Your exports")
    row = my_exports(page).first
    await row.get_by_role("button", name="Deliver to…").click()
    await row.get_by_label("Destination").select_option(label="customer-bucket/page")
    await row.get_by_role("button", name="Deliver", exact=True).click()
    await expect(row).to_contain_text("Delivery to customer-bucket/page requested")
    await expect(row.locator(".delivery")).to_have_text("Delivering to customer-bucket/page…")
    assert await _deliver_pending(local, db, org) == "delivered"
    await expect(row.locator(".delivery")).to_contain_text("Delivered to customer-bucket/page at ")
    assert any(k.endswith("manifest.json") for k in customer_store.keys(f"page/{org.id}/manual/"))
    delivery = (await api.call("GET", org.path(f"/exports/{export_id}"), org.owner)).json()["delivery"]
    assert delivery["state"] == "delivered" and delivery["destinationId"] == destination["id"]

    # A schedule delivers to it: removing the destination is then refused, in words beside its button.
    await go_to(page, "Settings")
    schedules = page.get_by_role("region", name="Schedules")
    await schedules.get_by_label("Deliver each run to").select_option(label="customer-bucket/page")
    await schedules.get_by_role("button", name="Create schedule").click()
    await expect(schedules.get_by_role("listitem")).to_contain_text("delivered to customer-bucket/page")
    [s] = (await api.call("GET", org.path("/schedules"), org.owner)).json()["items"]
    assert s["destinationId"] == destination["id"]
    item = section.get_by_role("listitem").filter(has_text="customer-bucket/page")
    await expect(item).to_contain_text("last delivered")
    await item.get_by_role("button", name="Remove customer-bucket/page").click()
    await page.get_by_role("dialog").get_by_role("button", name="Go back").click()
    await expect(item.get_by_role("button", name="Remove customer-bucket/page")).to_be_focused()
    await item.get_by_role("button", name="Remove customer-bucket/page").click()
    await page.get_by_role("dialog").get_by_role("button", name="Remove the destination").click()
    refusal = item.get_by_role("alert")
    await expect(refusal).to_have_text(
        "A schedule delivers to this destination. Change or delete that schedule first, then remove it."
    )

    await schedules.get_by_role("button", name="Delete").click()
    await page.get_by_role("dialog").get_by_role("button", name="Delete the schedule").click()
    await expect(page.locator("#schedule-answer")).to_have_text("The schedule was deleted.")
    await item.get_by_role("button", name="Remove customer-bucket/page").click()
    await page.get_by_role("dialog").get_by_role("button", name="Remove the destination").click()
    await expect(answer).to_have_text("The destination customer-bucket/page was removed.")
    await expect(section.get_by_text("No destinations")).to_be_visible()
    assert (await api.call("GET", org.path("/destinations"), org.owner)).json()["items"] == []


async def test_a_delivery_the_bucket_refuses_reads_delivery_failed(
    api_local: Api,
    db: Database,
    local: Settings,
    customer_store: Store,
    open_page: OpenPage,
) -> None:
    api = api_local
    org = await api.org("Refused")
    await add_tickets(db, org.id, org.owner, ["one"])
    key = customer_store.new_access_key()
    body = customer_store.destination(accessKeyId=key["AccessKeyId"], secretAccessKey=key["SecretAccessKey"])
    assert (await api.call("POST", org.path("/destinations"), org.owner, json=body)).status_code == 201
    customer_store.iam.delete_access_key(UserName="customer", AccessKeyId=key["AccessKeyId"])
    await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    page = await open_page("owner")
    await sign_in(page, org.owner)
    row = my_exports(page).first
    await row.get_by_role("button", name="Deliver to…").click()
    await row.get_by_role("button", name="Deliver", exact=True).click()
    await expect(row.locator(".delivery")).to_have_text("Delivering to customer-bucket…")
    assert await _deliver_pending(local, db, org) == "failed"
    await expect(row.locator(".delivery")).to_have_text(
        "Delivery failed to customer-bucket: the bucket refused the files, or did not answer. "
        "Check its credentials and policy, then deliver again."
    )


async def test_a_member_is_offered_no_destinations(
    api_local: Api, db: Database, local: Settings, open_page: OpenPage
) -> None:
    org = await api_local.org("Members Deliver Nothing")
    await add_tickets(db, org.id, org.member, ["one"])
    export = (await api_local.call("POST", org.path("/exports"), org.member, json={"kind": "tickets_csv"})).json()
    from space.exports.pipeline import run_export
    from tests.exports.fixtures import runner

    assert await run_export(runner(local, db), uuid.UUID(export["id"]), uuid.UUID(org.id)) == "completed"
    page = await open_page("member")
    await sign_in(page, org.member)
    await expect(my_exports(page).first.get_by_text("Ready to download")).to_be_visible()
    await expect(my_exports(page).first.get_by_role("button", name="Deliver to…")).to_be_hidden()
    await go_to(page, "Settings")
    await expect(page.get_by_role("heading", name="Members")).to_be_visible()
    await expect(page.get_by_role("region", name="Destinations")).to_be_hidden()


async def _check_view(page: Page, name: str, width: int) -> None:
    results = await Axe().run(page)
    assert results.violations_count == 0, results.generate_report()
    SCREENSHOTS.mkdir(exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / f"view-{name}-{width}.png", full_page=True)


@pytest.mark.parametrize("width", [375, 1280])
async def test_the_destination_views_have_no_axe_violations(
    api_local: Api,
    db: Database,
    local: Settings,
    customer_store: Store,
    open_page: OpenPage,
    width: int,
) -> None:
    api = api_local
    org = await api.org(f"Axe Deliver {width}")
    await add_tickets(db, org.id, org.owner, ["one"])
    body: dict[str, Any] = customer_store.destination(prefix=f"axe-{width}")
    assert (await api.call("POST", org.path("/destinations"), org.owner, json=body)).status_code == 201
    await completed_export(api, db, local, org, {"kind": "tickets_csv"})
    page = await open_page("owner", width=width, height=800)
    await sign_in(page, org.owner)
    row = my_exports(page).first
    await row.get_by_role("button", name="Deliver to…").click()
    await row.get_by_role("button", name="Deliver", exact=True).click()
    await expect(row.locator(".delivery")).to_have_text(f"Delivering to customer-bucket/axe-{width}…")
    await _check_view(page, "exports-delivery", width)
    await go_to(page, "Settings")
    await expect(page.get_by_role("region", name="Destinations").get_by_role("listitem")).to_have_count(1)
    await _check_view(page, "settings-destinations", width)
