"""The export center in a real browser: the distribution's Chromium driven by Playwright, against the real API
served by uvicorn on a free port (the test database, as the app role) and, where a scenario needs one, the real
SAQ worker.

Every page a test opens is watched: a console error, an uncaught exception or a CSP violation fails the test, and
the page's final state is saved as tests/browser/screenshots/<test>.png (git-ignored) for a reviewer to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import uvicorn
from playwright.async_api import Browser, ConsoleMessage, Locator, Page, async_playwright, expect

from space.app import create_app
from space.config import Settings
from space.worker import run_worker
from tests.destinations.customer_store import customer_store  # noqa: F401 (the customer's bucket, for test_destinations)
from tests.helpers import TestUser

CHROMIUM = os.environ.get("SPACE_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).parent / "screenshots"
WAIT_MS = 20_000
"""How long any expectation on the page may take before it fails (the worker shares 2 cores with others)."""

# Chromium logs every non-2xx fetch as "Failed to load resource"; the page asks for refusals on purpose (a 409
# final_export_recommended, a 401 for a mistyped token) and explains them. Those network lines, for API paths only,
# are not page errors; anything else in the console is.
API_PREFIXES = ("/me", "/orgs")

# Installed before any script of the page runs: CSP violations (they also reach the console; this names them
# precisely) and the layout shifts that happen without user input.
WATCH_CSP = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`);
});
window.__layoutShift = 0;
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) if (!e.hadRecentInput) window.__layoutShift += e.value;
}).observe({ type: "layout-shift", buffered: true });
"""

expect.set_options(timeout=WAIT_MS)


class _Server(uvicorn.Server):
    """uvicorn in the test's event loop; the test process keeps its own signal handlers."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[str]:
    """The real app on `settings`, listening on 127.0.0.1:<free port> until the block ends; yields its URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(create_app(settings), log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(WAIT_MS / 1000):
            while not server.started:
                if task.done():
                    task.result()
                    raise AssertionError("the API stopped before it listened")
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_MS / 1000)
        sock.close()


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    """The real app listening on 127.0.0.1:<free port>, for the module's tests."""
    async with serving(settings) as url:
        yield url


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[None]:
    """A real SAQ worker for the test (scenarios without it keep their exports queued)."""
    started = asyncio.Event()
    task = asyncio.create_task(run_worker(settings, started=started))
    try:
        await asyncio.wait_for(started.wait(), WAIT_MS / 1000)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT_MS / 1000)


def _require_chromium() -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"no Chromium at {CHROMIUM}: `make chromium` installs it, or set SPACE_TEST_CHROMIUM")


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    """Headless Chromium from the distribution (Playwright's own browser download is not used)."""
    _require_chromium()
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            await b.close()


@dataclass
class Watched:
    """A page and everything it reported that a correct page never reports."""

    page: Page
    name: str
    problems: list[str] = field(default_factory=list)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        location = message.location.get("url", "") if message.location else ""
        if message.text.startswith("Failed to load resource: the server responded with a status of 4") and (
            urlsplit(location).path.startswith(API_PREFIXES)
        ):
            return
        self.problems.append(f"console error: {message.text} at {location}")


OpenPage = Callable[..., Awaitable[Page]]


@pytest.fixture
async def open_page(browser: Browser, base_url: str, request: pytest.FixtureRequest) -> AsyncIterator[OpenPage]:
    """Opens the export center in fresh browser contexts (one per person); checks and photographs each at the end."""
    watched: list[Watched] = []

    async def open_(label: str = "page", *, width: int = 1100, height: int = 900) -> Page:
        context = await browser.new_context(
            base_url=base_url, accept_downloads=True, viewport={"width": width, "height": height}
        )
        await context.add_init_script(WATCH_CSP)
        page = await context.new_page()
        w = Watched(page, label)
        page.on("console", w.on_console)
        page.on("pageerror", lambda exc: w.problems.append(f"uncaught: {exc} {exc.stack}"))
        watched.append(w)
        await page.goto("/")
        return page

    try:
        yield open_
    finally:
        SCREENSHOTS.mkdir(exist_ok=True)
        problems: list[str] = []
        for i, w in enumerate(watched):
            suffix = "" if len(watched) == 1 else f"-{i + 1}-{w.name}"
            with contextlib.suppress(Exception):
                await w.page.screenshot(path=SCREENSHOTS / f"{request.node.name}{suffix}.png", full_page=True)
            violations = await w.page.evaluate("window.__cspViolations")
            problems += [f"{w.name}: {p}" for p in w.problems]
            problems += [f"{w.name}: CSP violation: {v}" for v in violations]
            await w.page.context.close()
        assert problems == [], problems


async def sign_in(page: Page, user: TestUser) -> None:
    """Type the user's token and sign in, as a person would."""
    await page.get_by_label("API token").fill(user.token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_text(f"Signed in as {user.name}")).to_be_visible()
    # The first org is loaded: the page knows the caller's role in it.
    await expect(page.get_by_text(re.compile(r"^You are an? \w+ of "))).to_be_visible()


def my_exports(page: Page) -> Locator:
    """The exports in the "Your exports" region, one list item each."""
    return page.get_by_role("region", name="Your exports").get_by_role("listitem")


def org_exports(page: Page) -> Locator:
    """The exports in the owners' and admins' "Every export in this organization" region."""
    return page.get_by_role("region", name="Every export in this organization").get_by_role("listitem")


async def go_to(page: Page, view: str) -> None:
    """Open one of the org's views by its link in the page's navigation ("Your exports", "All exports", ...)."""
    await page.get_by_role("navigation", name="Organization").get_by_role("link", name=view, exact=True).click()
    await expect(page.get_by_role("link", name=view, exact=True)).to_have_attribute("aria-current", "page")
